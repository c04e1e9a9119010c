"""The layer API (compatible with Mooncake's EngramStore): a thin mapping
onto the table API, where layer L head h is the table ``engram:l{L}:h{h}``.

Three kinds of store: ``store=None`` serves caller arrays (bind_local); an
engramstore store client (LocalStore) holds the tables in a namespace; a
Mooncake ``MooncakeDistributedStore`` holds each head as the object
``engram:l{L}:h{h}`` of ``N_h * row_bytes`` bytes (the Store-backed mode),
read through source tables of a private memory store (see _mooncake)."""
from __future__ import annotations

import errno as _errno
from collections.abc import Callable, Mapping, Sequence
from types import MethodType
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from . import _engram, _mooncake
from . import EngramStore, EngramStoreConfig, StateError, TableExistsError, TableNotFoundError, TableStore
from . import _old_mooncake
from ._mooncake import MooncakeError
from ._types import ArrayArg, MooncakeClient

if TYPE_CHECKING:
    from typing_extensions import Self

_E = TypeVar("_E", bound=BaseException)

VERIFY_ROWS = 16  # rows of each head a Mooncake populate reads back (_check_own)


def _error(cls: type[_E], code: int, msg: str) -> _E:
    e = cls(msg)
    e.errno = code  # type: ignore[attr-defined]
    return e


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


class LayerStore(EngramStore):
    """``LayerStore({layer_id: EngramStoreConfig, ...}, store=None)``

    ``store`` is a store client (e.g. :class:`engramstore.LocalStore`): the
    layers' tables are populated into it and read from it.  With
    ``store=None`` the layer store is metadata only, and serves the arrays
    given to :meth:`bind_local`.

    With ``store`` a Mooncake ``MooncakeDistributedStore`` (set up by the
    caller) the layers live in that store (one object per head), and the
    keywords apply: ``cache_bytes`` (a row cache in front of it, shared by
    the heads in proportion to their size; 0: none; ``cache_keep_all=True``
    keeps every row read instead of only rows asked for twice lately),
    ``read_deadline``
    (seconds a read retries passing errors), ``max_ranges`` (ranges per
    Mooncake call), ``read_calls`` (Mooncake calls of a lookup in flight at
    once; None: adapted between 1 and 4 to what the reads measure).
    """

    def __init__(self, layers: Mapping[int, EngramStoreConfig],
                 store: TableStore | MooncakeClient | None = None, *, cache_bytes: int = 0,
                 read_deadline: float = _mooncake.READ_DEADLINE,
                 max_ranges: int = _mooncake.MAX_RANGES,
                 read_calls: int | None = None, cache_keep_all: bool = False) -> None:
        if not isinstance(layers, Mapping):
            raise TypeError(f"layers: expected a dict of layer_id -> EngramStoreConfig, "
                            f"got {type(layers).__name__}")
        if not layers:
            raise ValueError("layers: at least one layer is needed")
        specs: dict[int, tuple[tuple[int, ...], int]] = {}
        for layer_id, cfg in layers.items():
            if not _is_int(layer_id) or layer_id < 0:
                raise ValueError(f"layers: layer id {layer_id!r} is not a nonnegative int")
            if not isinstance(cfg, EngramStoreConfig):
                if hasattr(cfg, "embedding_dim"):
                    raise TypeError(_old_mooncake(
                        f"layers[{layer_id}]: a {type(cfg).__module__}.{type(cfg).__name__} "
                        "with embedding_dim",
                        "pass an engramstore.EngramStoreConfig(table_vocab_sizes, row_bytes) "
                        "(row_bytes = embedding_dim * 4 for float32 rows)"))
                raise TypeError(f"layers[{layer_id}]: expected an EngramStoreConfig, "
                                f"got {type(cfg).__name__}")
            sizes = cfg.table_vocab_sizes
            if not isinstance(sizes, Sequence) or isinstance(sizes, (str, bytes)) or not sizes:
                raise ValueError(f"layers[{layer_id}].table_vocab_sizes: expected a nonempty "
                                 f"list of table sizes, got {sizes!r}")
            for h, n in enumerate(sizes):
                if not _is_int(n) or n <= 0:
                    raise ValueError(f"layers[{layer_id}].table_vocab_sizes[{h}]: expected a "
                                     f"positive int, got {n!r}")
            if not _is_int(cfg.row_bytes) or cfg.row_bytes <= 0:
                raise ValueError(f"layers[{layer_id}].row_bytes: must be set to a positive int "
                                 f"(got {cfg.row_bytes!r})")
            specs[layer_id] = (tuple(sizes), cfg.row_bytes)

        self._mc: _mooncake._Client | None = None
        mooncake = _mooncake.is_mooncake_client(store)
        if not mooncake and (cache_bytes or read_deadline != _mooncake.READ_DEADLINE or
                             max_ranges != _mooncake.MAX_RANGES or
                             read_calls is not None or cache_keep_all):
            raise TypeError("cache_bytes, cache_keep_all, read_deadline, max_ranges, read_calls: "
                            "only with a Mooncake store client (store=MooncakeDistributedStore)")
        self._specs = specs
        self._keys = {layer_id: tuple(f"engram:l{layer_id}:h{h}" for h in range(len(sizes)))
                      for layer_id, (sizes, _) in specs.items()}
        # The Mooncake mode's open layers: layer -> the names of their
        # source tables (the heads' keys; with a suffix once a layer was
        # removed and populated again through this store, or found replaced
        # behind its back, so rows cached before are never served for the
        # new tables).
        self._live: dict[int, tuple[str, ...]] = {}
        self._gen: dict[int, int] = {}  # layer -> times closed that way
        if store is None:
            self._store = TableStore(local_dir=None)
            self._owned = True
        elif isinstance(store, TableStore) and store.path != "<memory>":
            self._store = store
            self._owned = False
        elif mooncake:
            if isinstance(cache_bytes, bool) or not isinstance(cache_bytes, int) or cache_bytes < 0:
                raise ValueError(f"cache_bytes: expected an int >= 0, got {cache_bytes!r}")
            self._mc = _mooncake._Client(store, read_deadline=read_deadline,
                                         max_ranges=max_ranges, read_calls=read_calls)
            self._mc_client = store
            # A head found replaced or gone during a read closes its layer:
            # the next lookup opens it again (from new source tables),
            # checking every head's size.  (The closure holds the dicts,
            # not self: the memory store holds it, and self the store.)
            def on_gone(key: str, _live: dict[int, tuple[str, ...]] = self._live,
                        _gen: dict[int, int] = self._gen,
                        _keys: dict[int, tuple[str, ...]] = self._keys) -> None:
                for layer, ks in _keys.items():
                    if key in ks and _live.pop(layer, None) is not None:
                        _gen[layer] = _gen.get(layer, 0) + 1
            self._sources = _mooncake.Sources(self._mc, check_sizes=True, on_gone=on_gone)
            order = [(l, h) for l in sorted(specs) for h in range(len(specs[l][0]))]
            budget, shares = _mooncake.cache_shares(
                cache_bytes, [specs[l][0][h] * specs[l][1] for l, h in order])
            self._share = dict(zip(order, shares))
            if not isinstance(cache_keep_all, bool):
                raise TypeError(f"cache_keep_all: expected a bool, got {cache_keep_all!r}")
            self._store = TableStore(local_dir=None, cache_bytes=budget,
                                     cache_keep_all=cache_keep_all)
            self._owned = False
        else:
            raise TypeError(f"store: expected an engramstore store client (e.g. "
                            f"engramstore.LocalStore(local_dir, namespace)), a Mooncake "
                            f"MooncakeDistributedStore or None, got {store!r}")
        self._bound: set[int] = set()
        if self._mc is None:
            try:
                for layer_id, (heads, row_bytes) in specs.items():
                    for key, n in zip(self._keys[layer_id], heads):
                        self._store.define(key, n, row_bytes)
            except BaseException:
                if self._owned:
                    self._store.close()
                raise
        self._lookup: Callable[..., Any] = self._store._lookup_layer
        # lookup_into in C: the extension maps the layer id to its table
        # names (those of _keys, which never changes, or of the open
        # Mooncake layers in _live, read at every call) and looks up, with
        # no Python code between; any other call (keywords, a layer id not
        # there, after close()) goes to the method below, which raises or
        # opens the layer.
        if type(self).lookup_into is LayerStore.lookup_into:
            live = self._mc is not None
            self.__dict__["lookup_into"] = self._store._layer_lookup(
                self._live if live else self._keys, MethodType(LayerStore.lookup_into, self),
                live)

    # -- helpers ------------------------------------------------------------

    def _layer(self, layer_id: int) -> tuple[tuple[int, ...], int]:
        if isinstance(layer_id, (bool, list, tuple)):
            # Mooncake's older one-layer EngramStore took no layer id:
            # populate(buffers), remove_from_store(force).
            raise TypeError(f"layer_id: expected an int layer id, got "
                            f"{type(layer_id).__name__} {_short(layer_id)}.  " + _old_mooncake(
                                "A call without a layer id",
                                "every layer method takes the layer id first: "
                                "populate(layer_id, embedding_buffers), "
                                "remove_from_store(layer_id, force=False), "
                                "get_num_heads(layer_id), ..."))
        try:
            return self._specs[layer_id]
        except (KeyError, TypeError):
            raise ValueError(f"layer_id: {layer_id!r} is not a layer of this store "
                             f"(layers: {sorted(self._specs)})") from None

    def _check_buffers(self, layer_id: int, buffers: Sequence[ArrayArg], arg: str) -> None:
        sizes, row_bytes = self._layer(layer_id)
        if not isinstance(buffers, (list, tuple)):
            raise TypeError(f"{arg}: expected a list of {len(sizes)} arrays (one per head), "
                            f"got {type(buffers).__name__}")
        if len(buffers) != len(sizes):
            raise ValueError(f"{arg}: layer {layer_id} has {len(sizes)} heads, "
                             f"got {len(buffers)} arrays")
        # Check every head before writing any.
        for h, (buf, n) in enumerate(zip(buffers, sizes)):
            _engram._check_rows(buf, f"{arg}[{h}]", n, row_bytes)

    def _client(self) -> _mooncake._Client:
        """The Mooncake client of a Store-backed layer store."""
        if self._mc is None:
            raise _error(StateError, _engram.ESTATE, "this EngramStore has no Mooncake store")
        return self._mc

    # -- the Mooncake-compatible API ----------------------------------------

    def populate(self, layer_id: int, embedding_buffers: Sequence[ArrayArg],
                 config: object = None, *, shared: bool = False) -> None:
        """Stores one C-contiguous uint8 ``[N_h, row_bytes]`` array per head
        in the store client (create-only, atomic per head).  Every array is
        checked before the first head is written.

        With a local store and ``shared=True``, every process of a node may
        call it with the same arrays, with no leader or barrier: each head
        is written by exactly one of them and reused by the others after
        comparing it (``TableStore.populate_shared``).

        With a Mooncake store: TableExistsError if any head's key exists;
        each buffer is registered, all heads are uploaded with one
        batch_put_from (``config``: a ``mooncake.store.ReplicateConfig``),
        the buffers are unregistered, and if a head failed, the layer's
        keys (which did not exist before) are removed before MooncakeError
        is raised.  Then rows of every head are read back: another writer
        of the layer at the same time, with other rows, makes it
        TableExistsError (their layer whole) or, the store holding heads
        of both, MooncakeError with the layer removed."""
        if self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "populate: this EngramStore has no store (store=None); "
                         "use bind_local, or pass a store client")
        self._check_buffers(layer_id, embedding_buffers, "embedding_buffers")
        if self._mc is None:
            if config is not None:
                raise TypeError("config: a ReplicateConfig is for a Mooncake store client")
            keys = self._keys[layer_id]
            if shared:
                for key, buf in zip(keys, embedding_buffers):
                    self._store.populate_shared(key, buf)
                return
            # Room for the whole layer first, not a kill or a full disk at
            # its last head (a store in a Redis Cluster has no directory:
            # its pushes are refused by the cluster instead).
            sizes, row_bytes = self._layer(layer_id)
            if not self._store.path.startswith("redis://"):
                _engram.check_capacity(self._store.path, [(n, row_bytes, 0) for n in sizes])
            for key, buf in zip(keys, embedding_buffers):
                self._store.populate(key, buf)
            return
        if shared:
            raise TypeError("shared: for a local store (a Mooncake store's objects are "
                            "create-only: the first populate wins)")
        self._mooncake_populate(layer_id, list(embedding_buffers), config)

    def _mooncake_populate(self, layer_id: int, bufs: list[ArrayArg], config: object) -> None:
        mc = self._client()
        if self._lookup is _closed_lookup:
            _closed_lookup()
        keys = list(self._keys[layer_id])
        have = mc.exist(keys)
        taken = [k for k in keys if have[k]]
        if taken:
            raise _error(TableExistsError, _errno.EEXIST,
                         f"populate: layer {layer_id}: {', '.join(taken)} already in the "
                         f"Mooncake store (remove_from_store first)")
        np = mc.np
        arrays = [np.asarray(b) for b in bufs]  # views: _check_buffers took them as they are
        try:
            res = mc.put(keys, arrays, config)
        except BaseException:
            mc.rollback(keys)
            raise
        bad = [(k, rc) for k, rc in zip(keys, res) if rc != 0]
        if bad:
            # Every head goes, failed ones too: a put that reports a failure
            # may still have stored its object, and none of these keys
            # existed when this call began.
            mc.rollback(keys)
            raise MooncakeError(bad[0][0], f"populate of layer {layer_id} failed "
                                f"({len(bad)} of {len(keys)} heads; the others were removed)",
                                bad[0][1])
        self._check_own(layer_id, keys, arrays)
        self._live.pop(layer_id, None)
        self._open_layer(layer_id)

    def _check_own(self, layer_id: int, keys: list[str], arrays: list[Any]) -> None:
        """After an upload: whether the heads in the store are this
        populate's.  Mooncake answers a put to a key that exists, or that
        another writer is putting, with success and keeps the other
        object, so two writers of one layer at once both see success.  Up
        to VERIFY_ROWS rows of each head (the first, the last, spread
        between) are read back and compared: all this populate's rows (or
        the same rows of another writer), fine; all another's,
        TableExistsError, their layer left as it is; some heads of each,
        the layer is removed (the other writer finds the same and fails
        too) and MooncakeError raised.  Rows that differ only where none is
        read back are not seen."""
        mc = self._client()
        np = mc.np
        sizes, row_bytes = self._layer(layer_id)
        picks = [np.unique(np.linspace(0, n - 1, min(n, VERIFY_ROWS)).astype(np.uint64))
                 for n in sizes]
        rows = np.concatenate(picks)
        tables = np.concatenate([np.full(len(p), h, np.uint32) for h, p in enumerate(picks)])
        got = np.empty((len(rows), row_bytes), np.uint8)
        try:
            mc.read_group(keys, row_bytes, rows, got, tables, adapt=False)
        except MooncakeError as e:
            raise MooncakeError(e.key, f"populate of layer {layer_id}: reading the upload back "
                                f"failed ({e}); another writer of the layer at the same time "
                                f"may have removed it", e.code) from e
        own, at = [], 0
        for a, p in zip(arrays, picks):
            own.append(bool((got[at:at + len(p)] == a[p.astype(np.int64)]).all()))
            at += len(p)
        if all(own):
            return
        if not any(own):
            raise _error(TableExistsError, _errno.EEXIST,
                         f"populate: layer {layer_id}: another writer populated it at the same "
                         f"time, with other rows, and the Mooncake store kept those: this "
                         f"call's rows were not stored")
        mc.rollback(keys)
        raise MooncakeError(keys[own.index(False)], f"populate of layer {layer_id}: another writer "
                            f"populated it at the same time, with other rows, and the store kept "
                            f"some heads of each: the layer was removed (populate it again)")

    def bind_local(self, layer_id: int, embedding_buffers: Sequence[ArrayArg]) -> None:
        """Serves caller arrays (one C-contiguous uint8 ``[N_h, row_bytes]``
        per head, e.g. np.memmap views) as the layer's tables without
        copying; they are referenced until :meth:`close`."""
        if not self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "bind_local: this EngramStore reads a store client; bind_local needs "
                         "store=None")
        self._check_buffers(layer_id, embedding_buffers, "embedding_buffers")
        if layer_id in self._bound:
            raise _error(TableExistsError, _errno.EEXIST, f"layer {layer_id} is already bound")
        for key, buf in zip(self._keys[layer_id], embedding_buffers):
            self._store.bind(key, buf)
        self._bound.add(layer_id)

    def lookup_into(self, layer_id: int, row_ids: ArrayArg, output: ArrayArg | None = None) -> Any:
        """Gathers ``output[b, l, h] = table_h[row_ids[b, l, h]]``: row_ids a
        C-contiguous int64 ``[B, L, H]`` array (int64 only, as
        in Mooncake's contract), output a writable
        uint8 ``[B, L, H, row_bytes]`` array.  Id -1 leaves its row as is;
        any other id outside its head's table raises BadIdError and output
        is left untouched.  Returns None; with ``output`` omitted (host
        row_ids only), a new zeroed uint8 ``[B, L, H, row_bytes]`` array
        (numpy) is filled and returned instead."""
        if self._mc is not None:
            try:
                keys = self._live[layer_id]
            except (KeyError, TypeError):
                keys = self._open_layer(layer_id)
            return self._lookup(keys, row_ids, output, layer_id)
        try:
            keys = self._keys[layer_id]
        except (KeyError, TypeError):
            self._layer(layer_id)
            raise
        return self._lookup(keys, row_ids, output, layer_id)

    def _open_layer(self, layer_id: int) -> tuple[str, ...]:
        """Mooncake mode: checks that every head of the layer is stored
        with its size, and adds its source tables; returns their names."""
        mc = self._client()
        sizes, row_bytes = self._layer(layer_id)
        if self._lookup is _closed_lookup:
            _closed_lookup()
        keys = self._keys[layer_id]
        have = mc.exist(list(keys))
        missing = [k for k in keys if not have[k]]
        if missing:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"layer {layer_id}: {', '.join(missing)} not in the Mooncake store "
                         f"(populate it first)")
        for key, n in zip(keys, sizes):
            mc.check_size(key, n * row_bytes)
        g = self._gen.get(layer_id, 0)
        names = tuple(k if g == 0 else f"{k}.{g}" for k in keys)
        for h, (key, name, n) in enumerate(zip(keys, names, sizes)):
            try:
                self._sources.add(self._store, name, n, row_bytes, [key], n,
                                  self._share[(layer_id, h)])
            except TableExistsError:
                pass  # added by an earlier open that failed on a later head
        self._live[layer_id] = names
        return names

    def remove_from_store(self, layer_id: int, force: bool = False) -> int:
        """Removes the layer's tables from the store client and returns how
        many were removed.  Without ``force``, a layer with a head missing
        from the store raises TableNotFoundError and nothing is removed;
        with ``force``, what exists is removed."""
        if self._owned:
            raise _error(StateError, _engram.ESTATE,
                         "remove_from_store: this EngramStore has no store (store=None); "
                         "bound layers are released by close()")
        self._layer(layer_id)
        keys = self._keys[layer_id]
        if self._mc is not None:
            return self._mooncake_remove(layer_id, keys, force)
        present = set(self._store.list_tables())
        missing = [k for k in keys if k not in present]
        if missing and not force:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"remove_from_store: layer {layer_id}: {', '.join(missing)} not in the "
                         f"store (force=True removes the rest)")
        removed = 0
        for key in keys:
            if key in present:
                try:
                    self._store.remove(key)
                    removed += 1
                except TableNotFoundError:
                    if not force:
                        raise
        return removed

    def _mooncake_remove(self, layer_id: int, keys: tuple[str, ...], force: bool) -> int:
        """Without force: every head must be there (TableNotFoundError,
        nothing removed, otherwise), and a lease of a recent read is waited
        out; with force: what is there is removed at once."""
        mc = self._client()
        if self._lookup is _closed_lookup:
            _closed_lookup()
        have = mc.exist(list(keys))
        missing = [k for k in keys if not have[k]]
        if missing and not force:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"remove_from_store: layer {layer_id}: {', '.join(missing)} not in the "
                         f"Mooncake store (force=True removes the rest)")
        # From here on this store never serves the layer's old rows again.
        if self._live.pop(layer_id, None) is not None:
            self._gen[layer_id] = self._gen.get(layer_id, 0) + 1
        removed = 0
        for key in keys:
            if have[key] and mc.remove(key, force):
                removed += 1
        return removed

    def get_layer_ids(self) -> list[int]:
        """The configured layer ids, sorted."""
        return sorted(self._specs)

    def get_table_vocab_sizes(self, layer_id: int) -> list[int]:
        """The row count of each head's table of the layer."""
        return list(self._layer(layer_id)[0])

    def get_store_keys(self, layer_id: int) -> list[str]:
        """The table names of the layer's heads: ``engram:l{layer}:h{head}``."""
        self._layer(layer_id)
        return list(self._keys[layer_id])

    def get_num_heads(self, layer_id: int) -> int:
        """The number of heads (tables) of the layer."""
        return len(self._layer(layer_id)[0])

    def get_row_bytes(self, layer_id: int) -> int:
        """The bytes of one row of the layer's tables."""
        return self._layer(layer_id)[1]

    # -- lifetime -----------------------------------------------------------

    @property
    def store(self) -> TableStore | MooncakeClient | None:
        """The store client, or None for a metadata-only (bind_local) store."""
        if self._mc is not None:
            return self._mc_client
        return None if self._owned else self._store

    def stats(self) -> dict[str, Any]:
        """The underlying table store's stats (see TableStore.stats); with
        a Mooncake store, its reads under ``mooncake``."""
        st = self._store.stats()
        if self._mc is not None:
            st["mooncake"] = self._mc.stats()
        return st

    def close(self) -> None:
        """Releases bound arrays (store=None), or, with a Mooncake store,
        the source tables and the staging buffer registered with the
        client.  A store client is the caller's and stays open."""
        self._lookup = _closed_lookup
        fast = self.__dict__.pop("lookup_into", None)
        if fast is not None:
            fast._close()  # one taken before close() ends up in the method too
        if self._owned:
            self._store.close()
        if self._mc is not None:
            self._store.close()
            self._mc.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    if not TYPE_CHECKING:  # a type checker reports these as unknown, as they are
        def lookup(self, *args, **kwargs):
            """Mooncake's older float32 lookup(row_ids): raises TypeError
            naming lookup_into, the layer API's lookup."""
            raise TypeError(_old_mooncake(
                "lookup(row_ids) returning a float32 array",
                "output = np.empty((B, L, H, row_bytes), np.uint8); "
                "store.lookup_into(layer_id, row_ids, output) gathers the rows (row_ids int64 "
                "[B, L, H]), and output.view(np.float32) is the [B, L, H, row_bytes // 4] "
                "float32 array of float32 rows"))
        lookup._old_mooncake = True

        def get_embedding_dim(self, *args, **kwargs):
            """Mooncake's older get_embedding_dim(): raises TypeError naming
            get_row_bytes."""
            raise TypeError(_old_mooncake(
                "get_embedding_dim()",
                "get_row_bytes(layer_id) is the bytes of a row (embedding_dim * 4 for float32 "
                "rows)"))
        get_embedding_dim._old_mooncake = True

    def __repr__(self) -> str:
        where = "store=None" if self._owned else f"store={self.store!r}"
        return f"<engramstore.EngramStore layers={self.get_layer_ids()} {where}>"


def _short(x: object) -> str:
    r = repr(x)
    return r if len(r) <= 40 else r[:37] + "..."


def _closed_lookup(*args: object) -> NoReturn:
    raise _error(_engram.StoreClosedError, _engram.ESTATE, "the store is closed")
