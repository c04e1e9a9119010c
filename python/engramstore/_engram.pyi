"""Type stubs of the C extension engramstore._engram (re-exported by engramstore)."""
import builtins
import os
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal, TypedDict, overload

from typing_extensions import Buffer, Self  # Buffer: any object with the buffer protocol

ArrayLike = Buffer | Any  # also objects with __dlpack__ (host memory)

DEAD_ID: Final[int]
HAVE_CUDA: Final[bool]  # built with libengram_cuda: lookup() takes GPU arrays
library_version: Final[str]
EBADID: Final[int]
ESPEC: Final[int]
EMISMATCH: Final[int]
ELAYOUT: Final[int]
ECORRUPT: Final[int]
ECHECKSUM: Final[int]
EVERSION: Final[int]
EUNSAFE: Final[int]
EBOUND: Final[int]
EREMOVED: Final[int]
ESTATE: Final[int]
EINDOUBT: Final[int]

class EngramError(Exception):
    errno: int | None
class TableExistsError(EngramError): ...
class TableNotFoundError(EngramError): ...
class TableRemovedError(EngramError): ...
class SpecError(EngramError, ValueError): ...
class LayoutMismatchError(EngramError, ValueError): ...
class LayoutError(EngramError, ValueError): ...
class BadIdError(EngramError, IndexError):
    position: tuple[int, ...]
    id: int
class CorruptTableError(EngramError): ...
class UnsafePathError(EngramError): ...
class StateError(EngramError): ...
class StoreClosedError(StateError): ...
class InDoubtError(EngramError): ...

def strerror(errno: int) -> str: ...
def _xxh3_64(buf: Buffer, /) -> int: ...
def default_root() -> str: ...
def shard_plan(num_heads: int, reads: Sequence[int] | None, tp: int, dp: int,
               flags: int) -> list[tuple[int, int, int]]: ...
def shard_plan_rows(head_rows: Sequence[int], tp: int, dp: int,
                    flags: int) -> list[tuple[int, int, int, int]]: ...
def shard_route(shards: Sequence[tuple[int, int, int, int]], ids: ArrayLike,
                out: ArrayLike) -> None: ...
def namespace_usage(root: str | bytes | os.PathLike[str], ns: str, /) -> tuple[int, int, int, str]: ...
def namespace_gc(root: str | bytes | os.PathLike[str], idle_s: int, dry_run: bool, /) -> list[tuple[str, int, str]]: ...
def namespace_list(root: str | bytes | os.PathLike[str], /) -> list[str]: ...
def namespace_remove(root: str | bytes | os.PathLike[str], ns: str, flags: int, /) -> None: ...
def check_capacity(dir: str | bytes | os.PathLike[str],
                   specs: Sequence[tuple[int, int] | tuple[int, int, int]]) -> None: ...
def _check_rows(rows: ArrayLike, arg: str, num_rows: int, row_bytes: int) -> None: ...
def _source_group(read_rows: Callable[[memoryview, memoryview, memoryview], object],
                  row_bytes: int) -> object: ...

class NgramLayout:
    def __init__(self, *, layer_ids: Sequence[int], vocab_size: int, max_ngram: int, heads: int,
                 compressed_vocab: int, pad_id: int, primes: Sequence[int] | None = None,
                 multipliers: Sequence[int] | None = None) -> None: ...
    def _arrays(self) -> tuple[tuple[int, int, int, int, int, int, int, tuple[int, ...]],
                               bytes, bytes, bytes, bytes]: ...

class NgramHasher:
    def __init__(self, layout: NgramLayout, token_map: ArrayLike | None = None) -> None: ...
    def hash(self, tokens: ArrayLike, out: ArrayLike, history: ArrayLike | None = None,
             starts: ArrayLike | None = None, history_starts: ArrayLike | None = None,
             local: bool = False, layer: int = -1, threads: int = 0) -> None: ...
    def _lookup(self, store: Store, layer: int, tables: str | Sequence[str], tokens: ArrayLike,
                out: ArrayLike, history: ArrayLike | None = None, zero_dead: bool = False,
                submit: bool = False) -> PendingLookup | None: ...

class PendingLookup:
    def wait(self) -> Any: ...  # None, or the output lookup_async made (out omitted)
    def cancel(self) -> bool: ...
    def done(self) -> bool: ...

class Origin(TypedDict):
    store: Literal["redis", "mooncake"]
    namespace: str
    epoch: int
    where: str  # how the store was reached ("" if not recorded)

class TableSpec(TypedDict, total=False):
    num_rows: int
    row_bytes: int
    row_pitch: int
    stored: bool
    kind: Literal["file", "bound", "safetensors", "source", "redis", "other", "mooncake"]
    data_size: int
    checksum: int
    created_ns: int
    row_start: int   # the global row of row 0 (0 when no range was recorded)
    total_rows: int  # rows of the full tensor (0: no range recorded)
    numa_nodes: dict[int, int] | None  # pages per NUMA node (None: not memory, or no libnuma)
    origin: Origin | None  # where a pulled table (or a cluster's) was published
    epoch: int  # a Mooncake table's publication (64 random bits)
    chunk_rows: int  # a Mooncake table's rows per chunk object
    chunk_keys: list[str]  # a Mooncake table's chunk objects, in order

class Store:
    def __init__(
        self,
        namespace: str | None = None,
        local_dir: str | bytes | Any | None = None,
        *,
        create: bool = True,
        prefault: bool = False,
        random: bool = False,
        huge_pages: bool = False,
        mlock: bool = False,
        verify: bool = False,
        timing: bool = False,
        group: bool = False,
        threads: int = 0,
        file_cache: bool = False,
        cache_bytes: int = 0,
        queue_depth: int = 0,
        redis: str | None = None,
        redis_user: str | None = None,
        redis_password: str | None = None,
        redis_tagged: bool = False,
        redis_chunk_bytes: int = 0,
        redis_timeout_ms: int = 0,
        numa_node: int | None = None,
        numa_gpu: str | None = None,
        numa_interleave: bool | str | None = None,
        numa_local: bool = False,
        cache_keep_all: bool = False,
        redis_local_dir: str | os.PathLike[str] | None = None,
    ) -> None: ...
    @property
    def closed(self) -> bool: ...
    @property
    def path(self) -> str: ...
    def define(self, name: str, num_rows: int, row_bytes: int, row_pitch: int = 0) -> None: ...
    def populate(self, name: str, rows: ArrayLike) -> None: ...
    def populate_shared(self, name: str, rows: ArrayLike, *,
                        timeout: float | None = 600.0) -> bool: ...
    def wait_for(self, name: str, timeout: float | None = None) -> None: ...
    def bind(self, name: str, rows: ArrayLike) -> None: ...
    def open_safetensors(
        self,
        name: str,
        path: str | bytes | Any,
        weight: str,
        scale: str | None = None,
        row_start: int = 0,
        row_end: int = 0,
    ) -> None: ...
    def _add_source(
        self,
        name: str,
        num_rows: int,
        row_bytes: int,
        read_rows: Callable[[memoryview, memoryview], object] | object,
        cache_bytes: int = 0,
    ) -> int | None: ...
    # out omitted (or None): the lookup makes its output and returns it (a
    # numpy array, or a memoryview without numpy); else it returns None.
    @overload
    def lookup(
        self,
        tables: Sequence[str],
        ids: ArrayLike,
        out: None = None,
        offsets: Sequence[int] | ArrayLike | None = None,
        stream: int | Any | None = None,
        *,
        zero_dead: bool = False,
    ) -> Any: ...
    @overload
    def lookup(
        self,
        tables: Sequence[str],
        ids: ArrayLike,
        out: ArrayLike,
        offsets: Sequence[int] | ArrayLike | None = None,
        stream: int | Any | None = None,
        *,
        zero_dead: bool = False,
    ) -> None: ...
    def lookup_async(
        self,
        tables: Sequence[str],
        ids: ArrayLike,
        out: ArrayLike | None = None,
        offsets: Sequence[int] | ArrayLike | None = None,
        *,
        zero_dead: bool = False,
    ) -> PendingLookup: ...
    def _lookup_layer(self, tables: Sequence[str], row_ids: ArrayLike, output: ArrayLike | None,
                      layer_id: int | None = None) -> Any: ...
    def _layer_lookup(
        self,
        layers: dict[int, tuple[str, ...]],
        fallback: Callable[[Any, Any, Any], None],
        live: bool,
    ) -> Callable[[Any, Any, Any], None]: ...
    def _bench_lookup(
        self, tables: Sequence[str], ids: ArrayLike, out: ArrayLike, calls: int, empty: bool
    ) -> bytes: ...
    def cuda_check(self) -> None: ...
    def get_table_spec(self, name: str) -> TableSpec: ...
    def list_tables(self) -> list[str]: ...
    def remove(self, name: str) -> None: ...
    def verify(self, name: str) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def usage(self, name: str) -> dict[str, Any]: ...
    def placement(self, name: str) -> dict[str, Any]: ...
    def numa_copy(self, name: str, node: int) -> bool: ...
    def pull(self, source: Store, name: str) -> bool: ...
    def check_origin(
        self, source: Store, name: str
    ) -> Literal["current", "republished", "changed", "gone"]: ...
    def _pull_rows(self, name: str, num_rows: int, row_bytes: int,
                   fill: Callable[[Callable[[Any], None]], object],
                   same: Callable[[memoryview], object], source: str,
                   origin: tuple[str, int, str] | None = None,
                   checksum: int | None = None) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...

class _Publication:
    """The library's publication protocol over a key-value store written in
    Python (engramstore._mckv.MooncakeKV)."""
    def __init__(self, kv: Any, where: str, chunk_bytes: int, ttl_ms: int,
                 layout: int = 0, direct: bool = False) -> None: ...
    def push(self, name: str, rows: ArrayLike, /) -> None: ...
    def remove(self, name: str, /) -> None: ...
    def gc(self, idle_ms: int = 0, dry_run: bool = False) -> list[tuple[str, int, str]]: ...
    def manifest(self, name: str, /) -> dict[str, Any]: ...
    def list(self) -> builtins.list[str]: ...
    def read(self, name: str, /) -> bytes: ...
    def read_into(self, name: str, rows: Callable[[memoryview], object], num_rows: int,
                  row_bytes: int, checksum: int,
                  progress: Callable[[int, int], object] | None = None) -> None: ...
