"""engramstore: Engram embedding tables held in shared memory and gathered
fast into caller-owned arrays.

Two APIs over one implementation (the C library libengram):

* the table API: ``EngramStore(tables={...}, namespace=..., local_dir=...)``
  with ``populate``, ``lookup``, ``get_table_spec``, ``list_tables``,
  ``remove``, ``stats`` and ``close``; with ``store_client=`` a Mooncake
  Store client, the tables are objects of that store; with
  ``redis="host:port,..."`` the namespace is kept in a Redis Cluster;
* the layer API, compatible with Mooncake's EngramStore:
  ``EngramStore({layer_id: EngramStoreConfig}, store=None)`` (or
  ``store=`` a Mooncake ``MooncakeDistributedStore``: Store-backed) with
  ``populate``, ``bind_local``, ``lookup_into``, ``remove_from_store`` and
  the ``get_*`` queries.  Layer L head h is the table ``engram:l{L}:h{h}``.

Arrays are taken as they are (buffer protocol, DLPack): never converted or
copied.  A wrong dtype, shape or layout raises TypeError or ValueError
naming the argument; a failed library call raises an EngramError subclass.
"""
from __future__ import annotations

import errno as _errno
import inspect as _inspect
import os
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Literal, NamedTuple, overload

from . import _engram
from ._engram import (  # noqa: F401  (re-exported)
    DEAD_ID,
    EBADID,
    HAVE_CUDA,
    EBOUND,
    ECHECKSUM,
    ECORRUPT,
    ELAYOUT,
    EMISMATCH,
    EINDOUBT,
    EREMOVED,
    ESPEC,
    ESTATE,
    EUNSAFE,
    EVERSION,
    BadIdError,
    CorruptTableError,
    EngramError,
    InDoubtError,
    PendingLookup,
    LayoutError,
    LayoutMismatchError,
    SpecError,
    StateError,
    StoreClosedError,
    TableExistsError,
    TableNotFoundError,
    TableRemovedError,
    UnsafePathError,
    default_root,
    library_version,
    strerror,
)
from ._types import (ArrayArg, MooncakeClient, MooncakeStoreOptions, PathArg, StoreOptions,
                     TableSpecArg)

if TYPE_CHECKING:
    from typing_extensions import Unpack

__version__ = "0.1.0"

__all__ = [
    "EngramStore", "TableStore", "LocalStore", "LayerStore", "EngramStoreConfig",
    "MooncakeTableStore", "MooncakeError",
    "EngramError", "TableExistsError", "TableNotFoundError", "TableRemovedError",
    "SpecError", "LayoutMismatchError", "LayoutError", "BadIdError",
    "CorruptTableError", "UnsafePathError", "StateError", "StoreClosedError", "InDoubtError",
    "default_root", "library_version", "strerror", "DEAD_ID", "HAVE_CUDA",
    "can_share", "CapacityAnswer", "shard_plan", "shard_route",
    "NgramLayout", "NgramHasher", "build_token_map", "PendingLookup",
    "namespaces", "namespace_usage", "remove_namespace", "gc", "NamespaceUsage", "GcResult",
    "EBADID", "EBOUND", "ECHECKSUM", "ECORRUPT", "ELAYOUT", "EMISMATCH", "EINDOUBT",
    "EREMOVED", "ESPEC", "ESTATE", "EUNSAFE", "EVERSION",
]


def __dir__() -> list[str]:
    """The public names (__all__), not the modules and helpers the package
    imports for itself (os, inspect, typing's names, its submodules)."""
    return sorted([*__all__, "__version__"])


class _DefaultRoot:
    """The default of ``local_dir``: the library's default root,
    :func:`default_root` (``ENGRAM_ROOT`` when set, else /dev/shm/engram),
    read when the store is made, not when the package is imported.  Its
    repr is how signatures and help() show that default."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "default_root()"


_DEFAULT: Any = _DefaultRoot()


class EngramStore:
    """A store of Engram tables; the constructor picks the API by its form.

    ``EngramStore(tables=..., namespace=..., local_dir=..., **options)``
    opens a table store (a :class:`TableStore`).

    ``EngramStore(tables=..., namespace=..., store_client=client)`` opens a
    table store on a Mooncake Store (a :class:`MooncakeTableStore`).

    ``EngramStore(tables=..., namespace=..., redis="host:port,...")`` opens
    namespace ``namespace`` of a Redis Cluster (a :class:`TableStore`).

    ``EngramStore({layer_id: EngramStoreConfig, ...}, store=None)`` makes a
    layer store (a :class:`LayerStore`, Mooncake-compatible); ``store`` may
    be a ``MooncakeDistributedStore`` (the Store-backed mode).

    The methods are those of the class returned (``help()`` on it):

    TableStore (and MooncakeTableStore): ``define``, ``populate``,
    ``populate_shared``, ``wait_for``, ``bind``, ``open_safetensors``,
    ``add_source``, ``lookup``, ``lookup_async`` (TableStore: a
    ``PendingLookup`` to ``wait()`` for), ``cuda_check``, ``get_table_spec``,
    ``list_tables``, ``remove``, ``verify``, ``stats``, ``usage``,
    ``placement``, ``numa_copy``, ``pull`` (TableStore: a Redis Cluster's
    table into this directory), ``check_origin`` (a pulled table against
    the cluster it came from), ``close``; ``closed`` and ``path``.
    MooncakeTableStore also: ``gc`` (what dead populates left).

    LayerStore: ``populate``, ``bind_local``, ``lookup_into``,
    ``remove_from_store``, ``get_layer_ids``, ``get_table_vocab_sizes``,
    ``get_store_keys``, ``get_num_heads``, ``get_row_bytes``, ``stats``,
    ``close``; ``store``.

    Every store is a context manager (``with``: closed at the end).
    Code written for Mooncake's older EngramStore (``EngramStore(layer_id,
    config, store)``, ``embedding_dim``, a float32 ``lookup(row_ids)``) gets
    a TypeError that names the call to use instead.

    ``inspect.signature(EngramStore)`` lists the parameters of every form
    (the layer form's ``layers`` and ``store`` may also come first,
    positionally); each class returned has the signature of its own form.
    """

    __slots__ = ()
    # Set below for EngramStore itself (its __new__ only dispatches); None
    # on the subclasses, whose own __init__ inspect.signature() then reads.
    __signature__: ClassVar[_inspect.Signature | None]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.__signature__ = None

    @overload
    def __new__(cls, layers: Mapping[int, EngramStoreConfig],
                store: TableStore | MooncakeClient | None = None, *, cache_bytes: int = 0,
                read_deadline: float = ..., max_ranges: int = ...,
                read_calls: int | None = ..., cache_keep_all: bool = ...) -> LayerStore: ...

    @overload
    def __new__(cls, tables: Mapping[str, TableSpecArg] | None = None,
                namespace: str | None = None, local_dir: PathArg | None = ...,
                **options: Unpack[StoreOptions]) -> TableStore: ...

    @overload
    def __new__(cls, tables: Mapping[str, TableSpecArg] | None = None,
                namespace: str | None = None, local_dir: None = None, *,
                store_client: MooncakeClient, read_deadline: float = ...,
                max_ranges: int = ..., read_calls: int | None = ..., chunk_bytes: int = ...,
                **options: Unpack[MooncakeStoreOptions]) -> MooncakeTableStore: ...

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls is EngramStore:
            _refuse_old_mooncake_form(args, kwargs)
            target: type[EngramStore] = LayerStore if _is_layer_form(args, kwargs) else TableStore
            if target is TableStore and kwargs.get("store_client") is not None:
                target = MooncakeTableStore
            return target.__new__(target, *args, **kwargs)
        return object.__new__(cls)


def _forms_signature() -> _inspect.Signature:
    """The parameters of EngramStore's forms, as one signature: the table
    form's, then the keywords that pick the layer form (layers=, store=)
    and the Mooncake table store (store_client=)."""
    P = _inspect.Parameter
    pk, kw = P.POSITIONAL_OR_KEYWORD, P.KEYWORD_ONLY
    return _inspect.Signature([
        P("tables", pk, default=None, annotation="Mapping[str, TableSpecArg] | None"),
        P("namespace", pk, default=None, annotation="str | None"),
        P("local_dir", pk, default=_DEFAULT, annotation="PathArg | None"),
        P("layers", kw, default=None, annotation="Mapping[int, EngramStoreConfig] | None"),
        P("store", kw, default=None, annotation="TableStore | MooncakeClient | None"),
        P("store_client", kw, default=None, annotation="MooncakeClient | None"),
        P("options", P.VAR_KEYWORD, annotation="Any"),
    ], return_annotation="TableStore | LayerStore | MooncakeTableStore")


EngramStore.__signature__ = _forms_signature()


# Mooncake's older EngramStore, shipped in its wheels as
# mooncake.store.EngramStore (0.3.13): one layer per object, an
# embedding_dim in its config, a float32 lookup(row_ids) returning a new
# array.  Code written for it fails here with this pointer to the current
# contract, never with an unrelated TypeError (docs/python.md has the
# whole migration table).
OLD_MOONCAKE = (
    "{what} is Mooncake's older EngramStore (one layer per object, "
    "EngramStoreConfig.embedding_dim, a float32 lookup(row_ids) returning a new array). "
    "engramstore follows Mooncake's current contract: {instead}.  "
    "See 'Code written for Mooncake's older EngramStore' in docs/python.md.")


def _old_mooncake(what: str, instead: str) -> str:
    return OLD_MOONCAKE.format(what=what, instead=instead)


def _refuse_old_mooncake_form(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """EngramStore(layer_id, config, store) (or with layer_id=/config=)."""
    first = args[0] if args else None
    if ("layer_id" in kwargs or "config" in kwargs or
            (isinstance(first, int) and not isinstance(first, bool))):
        raise TypeError(_old_mooncake(
            "EngramStore(layer_id, config, store)",
            "EngramStore({layer_id: config, ...}, store) takes every layer at once, with "
            "config an engramstore.EngramStoreConfig(table_vocab_sizes, row_bytes) "
            "(row_bytes = embedding_dim * 4 for float32 rows), and lookup_into(layer_id, "
            "row_ids, output) gathers into a uint8 output [B, L, H, row_bytes]"))


def _is_layer_form(args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """The layer form is a map of int layer ids to EngramStoreConfig (and
    maybe a store); the table form is all keywords (tables=, namespace=)."""
    if "store" in kwargs or "layers" in kwargs:
        return True
    if args and isinstance(args[0], Mapping):
        m = args[0]
        if not m:
            return not kwargs
        return any(isinstance(k, int) for k in m) or any(
            isinstance(v, EngramStoreConfig) for v in m.values())
    return False


def _spec_kwargs(name: str, spec: object, arg: str | None = None) -> dict[str, Any]:
    """The spec of table `name` as keywords; `arg` names the argument in
    errors (default: tables[name])."""
    arg = arg or f"tables[{name!r}]"
    if isinstance(spec, Mapping):
        unknown = set(spec) - {"num_rows", "row_bytes", "row_pitch"}
        if unknown:
            raise ValueError(f"{arg}: unknown keys {sorted(unknown)} "
                             "(expected num_rows, row_bytes and optionally row_pitch)")
        missing = {"num_rows", "row_bytes"} - set(spec)
        if missing:
            raise ValueError(f"{arg}: missing {sorted(missing)}")
        return dict(spec)
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        return dict(zip(("num_rows", "row_bytes", "row_pitch"), spec))
    raise TypeError(f"{arg}: expected a dict with num_rows and row_bytes "
                    f"(or a (num_rows, row_bytes[, row_pitch]) tuple), got {type(spec).__name__}")


class TableStore(_engram.Store, EngramStore):
    """The table API: one namespace of named tables.

    ``TableStore(tables=None, namespace=None, local_dir=default_root(), *,
    create=True, prefault=False, random=False, huge_pages=False, mlock=False,
    verify=False, timing=False, group=False, threads=0)``

    ``tables`` declares specs, ``{name: {"num_rows": N, "row_bytes": R[,
    "row_pitch": P]}}``; tables already stored under the namespace are
    reopened (and must match).  ``local_dir=None`` (with no namespace) makes
    a memory-only store that serves arrays given to :meth:`bind`.

    Options: ``create`` the namespace if missing; ``prefault`` the mappings;
    ``random`` access advice; ``huge_pages``: serve a private huge-page copy
    instead of the shared mapping; ``mlock``; ``verify`` checksums when a
    table is first mapped; ``timing`` of lookups in stats; ``group``-readable
    namespace; ``threads`` for large lookups (0: one per CPU, at most 8);
    ``file_cache``: read table files on demand (io_uring) through a row cache
    of ``cache_bytes`` (0: 256 MiB) with ``queue_depth`` reads in flight (0:
    64), for tables larger than memory.  A full row cache keeps a row only if
    it was asked for twice lately; ``cache_keep_all=True`` keeps every row
    read (CLOCK alone), for hot sets that change all at once.

    NUMA (docs/operations.md, "NUMA"): ``numa_node=N`` puts the pages of the
    tables this store writes (in a tmpfs namespace such as /dev/shm) and of
    its ``huge_pages`` copies on node N; ``numa_gpu="0000:3b:00.0"`` on the
    node of that PCI device (a GPU's bus id); ``numa_interleave=True`` (or a
    node list such as ``"0-1"``) interleaves them.  ``numa_local=True``
    serves table NAME from its copy NAME.numaN on the node of the thread
    that first looks it up, where :meth:`numa_copy` made one;
    :meth:`placement` and ``get_table_spec(name)["numa_nodes"]`` say where
    a table's pages are.

    ``redis="host:port[,host:port...]"`` keeps the namespace in that Redis
    Cluster instead of a directory (no ``local_dir``): ``populate`` pushes a
    table (create-only), ``lookup`` reads the rows it needs with pipelined
    GETRANGE per node behind the row cache (``cache_bytes``), ``remove``
    unpublishes and deletes one, ``list_tables``, ``get_table_spec``
    (``kind: "redis"``) and ``verify`` see the cluster's tables, and
    ``stats()["redis"]`` has the client's counters.  Its options:
    ``redis_user`` and ``redis_password`` (AUTH; None: none),
    ``redis_tagged`` (a table's chunks in one slot instead of spread),
    ``redis_chunk_bytes`` (0: 1 MiB), ``redis_timeout_ms`` (an operation's
    deadline with its retries; 0: 5000), ``redis_local_dir`` (the nearest
    tier: a root whose namespace of the same name holds local copies,
    ``pull()``; a table is served from its copy when it has the cluster's
    rows).  See docs/redis.md.
    """

    def __init__(self, tables: Mapping[str, TableSpecArg] | None = None,
                 namespace: str | None = None, local_dir: PathArg | None = _DEFAULT,
                 **options: Unpack[StoreOptions]) -> None:
        if options.get("redis") is not None:
            if local_dir is not _DEFAULT:
                raise TypeError("local_dir: a namespace in a Redis Cluster (redis=) has no "
                                "directory")
            if namespace is None:
                raise TypeError("namespace: required with redis=")
            local_dir = None
        elif local_dir is _DEFAULT:
            local_dir = default_root()
        if local_dir is not None and namespace is None:
            raise TypeError("namespace: required (or local_dir=None for a memory-only store)")
        if tables is not None and not isinstance(tables, Mapping):
            raise TypeError(f"tables: expected a dict of name -> spec, got {type(tables).__name__}")
        opts: dict[str, Any] = dict(options)
        if "store_client" in opts and opts["store_client"] is None:
            del opts["store_client"]  # the local form, spelled out
        super().__init__(namespace, local_dir, **opts)
        try:
            for name, spec in (tables or {}).items():
                self.define(name, **_spec_kwargs(name, spec))
        except BaseException:
            self.close()
            raise

    def add_source(self, name: str, spec: TableSpecArg, read_rows: Callable[..., object], *,
                   cache_bytes: int = 0, group: Hashable | None = None) -> int | None:
        """Adds table ``name`` served by your own code: ``read_rows(rows,
        out)`` gets the distinct, validated row numbers a lookup needs
        (``rows``: uint64 ``[n]``) and fills ``out`` (uint8 ``[n,
        row_bytes]``) with their bytes; both are numpy arrays (memoryviews
        where numpy is not installed).  It must write every row and return
        None (or ``out`` itself); any other return value fails the lookup
        with a ``TypeError`` as the cause, and a row left unwritten with a
        ``ValueError`` (``docs/python.md`` says how it is found).  ``out``'s
        memory cannot be resized during the call.  ``spec`` is ``{"num_rows": N,
        "row_bytes": R}`` (or a ``(N, R)`` tuple).  It runs on the thread
        that looks up, holding the GIL; an exception fails that lookup with
        an :class:`EngramError` whose ``__cause__`` is the exception.
        ``cache_bytes > 0`` puts a row cache of that many bytes (from the
        store's ``cache_bytes`` budget) in front of it.  The table lives
        until :meth:`close`; ``remove`` refuses it.

        ``group``: tables added with the same group key (any hashable) and
        the same ``read_rows`` and row size are read together, one call per
        lookup for all of them: ``read_rows(rows, out, tables)``, where
        ``tables`` (uint32 ``[n]``) gives each row's table as its index in
        the group, which ``add_source`` returns (0 for the group's first
        table, then 1, ...).  Without a group it returns None."""
        kw = _spec_kwargs(name, spec, "spec")
        if kw.get("row_pitch", 0) not in (0, kw["row_bytes"]):
            raise ValueError("spec: a source has no row_pitch "
                             "(its rows are handed over packed)")
        if not callable(read_rows):
            raise TypeError(f"read_rows: expected a callable, got {type(read_rows).__name__}")
        fn: Callable[..., object] = read_rows
        np = _numpy()
        if np is not None:
            def fn(rows: Any, out: Any, tables: Any = None, _read: Callable[..., object] = read_rows,
                   _asarray: Callable[[Any], Any] = np.asarray) -> object:
                arr = _asarray(out)
                if tables is None:
                    res = _read(_asarray(rows), arr)
                else:
                    res = _read(_asarray(rows), arr, _asarray(tables))
                # out itself (np.take(..., out=out) returns it) means None;
                # anything else is refused by the extension.
                return None if res is arr else res
        if group is None:
            return self._add_source(name, kw["num_rows"], kw["row_bytes"], fn, cache_bytes)
        groups = self.__dict__.setdefault("_source_groups", {})
        key = (group, kw["row_bytes"])
        if key not in groups:
            groups[key] = (_engram._source_group(fn, kw["row_bytes"]), read_rows)
        elif groups[key][1] is not read_rows:
            raise ValueError(f"read_rows: the tables of group {group!r} share one callable")
        return self._add_source(name, kw["num_rows"], kw["row_bytes"], groups[key][0],
                                cache_bytes)

    def pull(self, source: Any, name: str, *, namespace: str | None = None,
             progress: Callable[[int, int], object] | None = None) -> bool:
        """Copies table ``name`` of a remote tier into this store's
        namespace directory, to be served from local memory from then on;
        create-only and atomic (capacity checked before the first byte, the
        whole table checked before it is published: a failed or killed pull
        leaves nothing), and every process of a node may call it: one
        copies, the others wait for it and find its table.  Returns True if
        this call copied it, False if it was here with the source's rows
        (``LayoutMismatchError`` if another table of the name is here).

        ``source``: a store opened on a Redis Cluster (engram_pull(), see
        docs/redis.md), or a Mooncake Store's table, given as a
        :class:`MooncakeTableStore` or as its client
        (``mooncake.store.MooncakeDistributedStore``) with
        ``namespace=``: read by the publication protocol's read of a
        whole table (chunks in batches, each checked against the
        manifest's XXH3-64 while the next is read: ``CorruptTableError``),
        the whole against the manifest as the pull first read it
        (EngramError, errno EAGAIN, if the table was removed or replaced
        meanwhile); ``progress(done_bytes, total_bytes)`` is called after
        each batch is read,
        on this thread, and raising from it cancels the pull (the
        exception is raised here).  See docs/mooncake.md."""
        from . import _mooncake
        if isinstance(source, _mooncake.MooncakeTableStore) or \
                _mooncake.is_mooncake_client(source):
            return _mooncake.pull(self, source, name, namespace=namespace, progress=progress)
        if not isinstance(source, _engram.Store):
            raise TypeError(f"source: expected a store opened on a Redis Cluster, a "
                            f"MooncakeTableStore or a mooncake.store.MooncakeDistributedStore, "
                            f"got {type(source).__name__}")
        if namespace is not None or progress is not None:
            raise TypeError("namespace and progress: only to pull from a Mooncake Store")
        return bool(super().pull(source, name))

    def check_origin(self, source: Any, name: str, *, namespace: str | None = None
                     ) -> Literal["current", "republished", "changed", "gone"]:
        """Compares table ``name``, pulled with :meth:`pull`, with what the
        store it came from publishes under that name now, and returns
        ``"current"`` (the same publication), ``"republished"`` (published
        again with the same rows), ``"changed"`` (other rows now: pull it
        again) or ``"gone"``.  ``source`` as for :meth:`pull`: a store
        opened on a Redis Cluster (its manifest is read, not its rows), or
        a Mooncake Store's :class:`MooncakeTableStore` or client with
        ``namespace=`` (its manifest is read; a table published again is
        told apart from one with other rows by the local rows' XXH3-64 per
        chunk).
        ``EngramError`` (errno EINVAL) when the table records no origin or
        came from elsewhere.  See docs/redis.md and docs/mooncake.md."""
        from . import _mooncake
        if isinstance(source, _mooncake.MooncakeTableStore) or \
                _mooncake.is_mooncake_client(source):
            return _mooncake.check_origin(self, source, name, namespace=namespace)
        if not isinstance(source, _engram.Store):
            raise TypeError(f"source: expected a store opened on a Redis Cluster, a "
                            f"MooncakeTableStore or a mooncake.store.MooncakeDistributedStore, "
                            f"got {type(source).__name__}")
        if namespace is not None:
            raise TypeError("namespace: only to compare with a Mooncake Store")
        return super().check_origin(source, name)

    def __repr__(self) -> str:
        state = " (closed)" if self.closed else ""
        return f"<engramstore.{type(self).__name__} {self.path!r}{state}>"


def _numpy() -> Any:
    """numpy if it is installed (never required), else None."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


class LocalStore(TableStore):
    """A store client for the layer API: the namespace ``namespace`` under
    the directory ``local_dir`` (typically on /dev/shm), shared by every
    process of the node.  It is a :class:`TableStore`; options as there."""

    def __init__(self, local_dir: PathArg = _DEFAULT, namespace: str | None = None,
                 **options: Unpack[StoreOptions]) -> None:
        if local_dir is None:
            raise ValueError("local_dir: a LocalStore needs a directory "
                             "(use store=None for caller memory)")
        if namespace is None:
            raise TypeError("namespace: required")
        super().__init__(None, namespace, local_dir, **options)


class EngramStoreConfig:
    """One layer's tables: ``table_vocab_sizes[h]`` rows for head h, each of
    ``row_bytes`` bytes.  ``row_bytes`` defaults to 0 and must be set."""

    __slots__ = ("table_vocab_sizes", "row_bytes")
    table_vocab_sizes: list[int]
    row_bytes: int

    def __init__(self, table_vocab_sizes: Iterable[int] | None = None, row_bytes: int = 0) -> None:
        self.table_vocab_sizes = list(table_vocab_sizes) if table_vocab_sizes is not None else []
        self.row_bytes = row_bytes

    if not TYPE_CHECKING:  # a type checker reports embedding_dim as unknown, as it is
        def __getattr__(self, name):
            if name == "embedding_dim":
                raise AttributeError(_EMBEDDING_DIM)
            raise AttributeError(f"'EngramStoreConfig' object has no attribute {name!r}")

        def __setattr__(self, name, value):
            if name == "embedding_dim":
                raise AttributeError(_EMBEDDING_DIM)
            object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return (f"EngramStoreConfig(table_vocab_sizes={self.table_vocab_sizes!r}, "
                f"row_bytes={self.row_bytes!r})")


_EMBEDDING_DIM = (
    "EngramStoreConfig has no embedding_dim: that is Mooncake's older EngramStore, whose "
    "rows were embedding_dim float32 values.  Here rows are opaque bytes: set row_bytes "
    "(embedding_dim * 4 for float32 rows) and view lookup_into's uint8 output as float32 "
    "(output.view(np.float32)).  See 'Code written for Mooncake's older EngramStore' in "
    "docs/python.md.")


class CapacityAnswer(NamedTuple):
    """The answer of :func:`can_share`: true when the tables fit; else
    ``reason`` names the bytes needed, the bytes available and the fix."""

    ok: bool
    reason: str

    def __bool__(self) -> bool:
        return self.ok


def can_share(tables: Mapping[Any, object] | Iterable[object],
              local_dir: PathArg | None = _DEFAULT,
              namespace: str | None = None) -> CapacityAnswer:
    """Whether ``tables`` fit in the shared directory, asked before anything
    is written: the free space of the file system of ``local_dir/namespace``
    (of the nearest directory that exists, before it is made), and, on a
    tmpfs such as /dev/shm, the memory cgroup limit of this process, to
    which the kernel charges the tmpfs pages it writes (a populate beyond it
    gets the process killed).  Every populate makes the same check for its
    own table.

    ``tables``: ``{name: spec}`` as for :class:`TableStore`, ``{layer_id:
    EngramStoreConfig}`` as for the layer API, or a list of specs.  Returns
    a :class:`CapacityAnswer` ``(ok, reason)``, false when they do not fit::

        ok, why = engramstore.can_share({"t": {"num_rows": 10**6, "row_bytes": 264}})
        if not ok:
            print(why)
    """
    if local_dir is _DEFAULT or local_dir is None:
        local_dir = default_root()
    specs: list[tuple[int, int, int]] = []
    items = tables.items() if isinstance(tables, Mapping) else enumerate(tables)
    for key, spec in items:
        if isinstance(spec, EngramStoreConfig):
            specs.extend((int(n), int(spec.row_bytes), 0) for n in spec.table_vocab_sizes)
        else:
            kw = _spec_kwargs(str(key), spec, f"tables[{key!r}]")
            specs.append((int(kw["num_rows"]), int(kw["row_bytes"]), int(kw.get("row_pitch", 0))))
    d = os.fsdecode(os.fspath(local_dir))
    if namespace is not None:
        d = os.path.join(d, namespace)
    while not os.path.isdir(d):
        parent = os.path.dirname(os.path.abspath(d))
        if parent == d:
            break
        d = parent
    try:
        _engram.check_capacity(d, specs)
    except EngramError as e:
        if e.errno != _errno.ENOSPC:
            raise
        return CapacityAnswer(False, str(e))
    return CapacityAnswer(True, "")


from ._mooncake import MooncakeError, MooncakeTableStore  # noqa: E402  (needs the names above)
from ._layer import LayerStore  # noqa: E402  (needs the names above)
from ._shardplan import shard_plan, shard_route  # noqa: E402
from ._ngram import NgramHasher, NgramLayout, build_token_map  # noqa: E402
from ._namespaces import (GcResult, NamespaceUsage, gc, namespace_usage,  # noqa: E402
                          namespaces, remove_namespace)
