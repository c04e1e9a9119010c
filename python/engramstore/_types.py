"""The types of the package's arguments, named once for its annotations
(so that a type checker finds a misspelt option or a wrong constructor
form in the caller's code)."""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol, TypedDict, Union

# A table spec as the constructors and add_source take it:
# {"num_rows": N, "row_bytes": R[, "row_pitch": P]} or (N, R[, P]).
TableSpecArg = Union[Mapping[str, int], "tuple[int, int]", "tuple[int, int, int]"]

# A directory: a str, bytes or os.PathLike path.
PathArg = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

# An array: anything with the buffer protocol (numpy arrays, memoryview,
# np.memmap) or DLPack (torch tensors); GPU arrays where lookup() says so.
ArrayArg = Any


class MooncakeClient(Protocol):
    """A Mooncake Store client (mooncake.store.MooncakeDistributedStore, set
    up by the caller), by the methods engramstore calls."""

    def get_into_ranges(self, *args: Any, **kwargs: Any) -> Any: ...
    def batch_put_from(self, *args: Any, **kwargs: Any) -> Any: ...
    def batch_is_exist(self, *args: Any, **kwargs: Any) -> Any: ...
    def register_buffer(self, *args: Any, **kwargs: Any) -> Any: ...
    def unregister_buffer(self, *args: Any, **kwargs: Any) -> Any: ...
    def remove(self, *args: Any, **kwargs: Any) -> Any: ...
    def get_size(self, *args: Any, **kwargs: Any) -> Any: ...


class StoreOptions(TypedDict, total=False):
    """The keywords of a table store on a local directory (or memory):
    EngramStore(tables=..., namespace=..., local_dir=..., **options)."""

    create: bool
    prefault: bool
    random: bool
    huge_pages: bool
    mlock: bool
    verify: bool
    timing: bool
    group: bool
    threads: int
    file_cache: bool
    cache_bytes: int
    queue_depth: int
    cache_keep_all: bool
    store_client: None
    redis: str | None
    redis_user: str | None
    redis_password: str | None
    redis_tagged: bool
    redis_chunk_bytes: int
    redis_timeout_ms: int
    redis_local_dir: str | os.PathLike[str] | None
    numa_node: int | None
    numa_gpu: str | None
    numa_interleave: bool | str | None
    numa_local: bool


class MooncakeStoreOptions(TypedDict, total=False):
    """The options of a table store on a Mooncake Store:
    EngramStore(tables=..., namespace=..., store_client=client,
    read_deadline=..., max_ranges=..., read_calls=..., chunk_bytes=...,
    **options)."""

    cache_bytes: int
    cache_keep_all: bool
    threads: int
    timing: bool
