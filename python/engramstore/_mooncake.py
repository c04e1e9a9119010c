"""Store-backed tables on a Mooncake Store.

A Mooncake Store client (``mooncake.store.MooncakeDistributedStore``, set
up by the caller) holds each table as objects of packed rows: one per head
in the layer API, chunk objects of a publication in the table API
(published by the library's protocol over engramstore._mckv, see
MooncakeTableStore).  engram reads them through the source seam
(``TableStore.add_source``): every Mooncake table is a source table of a
private memory store, whose ``read_rows`` is :meth:`Sources.read`.  So the
lookup itself, the validation of every id before anything is read, the
deduplication, the row cache and the statistics are the library's, the same
as for every other table; this module only moves bytes.

How a read works (``_Client.read_group``), and why:

* **Staging.**  ``get_into_ranges`` writes only into memory registered with
  the client, and the seam hands ``read_rows`` a fresh buffer per call
  (its rows are copied to the lookup's output only once the whole call
  succeeded, which is what keeps the output untouched on any failure).
  Registering that buffer on every call costs more than copying it (a
  register/unregister pair of 1 MiB takes ~0.6 ms here, a copy of 4096
  rows of 264 bytes ~0.1 ms), so each client gets one staging buffer,
  registered once and reused; a chunk is read into it and copied out.
  Reading straight into the caller's output would need the output
  registered, and would write rows of a lookup that then fails.
* **Staging lives as long as the Mooncake client.**  Mooncake's client
  crashes the process on any call after its close(), and at the
  interpreter's exit an engramstore object may be collected after its
  client was closed or torn down; nothing here can tell.  So neither
  close() nor garbage collection calls into the client: a staging buffer,
  once registered, stays registered and referenced by its client's
  _StagePool until the client object is freed (Mooncake then drops its
  registrations with it), and a store that is done with it hands it back
  to the pool for the client's next store.  Freeing it while registered
  would make a later buffer at the same address unregistrable.
* **One call sequence per lookup.**  The tables of a row size form one
  source group, so the missed rows of all the heads of a lookup go out
  together, sorted by key: a get_into_ranges call costs about as much for
  171 ranges of one key as for 4104 ranges of 24 keys, so one call per
  head would double a lookup's time.
* **Bounded calls.**  A call carries at most ``max_ranges`` ranges (8192,
  what fits the staging buffer at most) of at most 256 keys, the rows
  split evenly over the calls.  Mooncake 0.3.13's TCP transport queues at
  most 1024 transfers per peer by default, and a 4096-key batch past that
  returned wrong rows and hung the next call; the ranges of one key go out
  as one scatter transfer, so it is the keys that must stay below that
  (calls of 4104 ranges over 24 keys read exact rows even with the queue
  set to 64), while every call costs a round trip: the fewer, the faster.
* **Lengths verified.**  Every range must come back with exactly
  ``row_bytes`` bytes; anything else (a short read, an error code, a
  malformed result) fails the read naming the key.  A missing object is an
  error, never an empty or stale row.
* **Sizes checked after every read.**  After each read (and after a read
  that failed for a missing object or a range past an object's end) one
  more call, batch_get_replica_desc, checks that every object read still
  exists with its size, before any of its bytes is used (Sources).  The
  layer API's keys are the same for every populate: an object replaced by
  another layout fails the read, naming both sizes, and the layer is
  opened again at the next lookup.  The table API's chunk keys are never
  used again, but its removals delete chunks at once (leases or not), and
  Mooncake gives their memory to the next put: a read that raced one may
  hold other bytes, and the chunk no longer exists after it.
* **Retries with a deadline.**  Errors Mooncake reports for passing
  conditions (RPC failures and timeouts, transfer failures, leases,
  replicas not ready) are retried with backoff until ``read_deadline``
  seconds have passed since the read began; a missing object or invalid
  range is not retried.
* **Calls in flight at once.**  Where a call's cost is mostly waiting (a
  round trip, a remote peer), calls made at once hide it; where it is the
  CPU of the transfer engine (loopback on a small machine), they only add
  overhead.  So a read of at least 2 * MIN_CALL_ROWS rows is split into up
  to ``read_calls`` calls made at once, and by default (``read_calls=None``)
  that number adapts: each of 1, 2, 4 calls at once keeps a moving average
  of the time a read took per row with it, reads use the one with the
  lowest, and every EXPLORE-th read tries a neighbour of it (half or twice
  as many), so a change in the deployment is followed.  An int fixes the
  number.  The calls of a read each go into their own slot of the staging
  buffer: one by the reading
  thread, the others by a pool of the client's (Mooncake's binding
  releases the GIL in ``get_into_ranges``; concurrent calls on one client
  read exact rows in the tests and the benchmark, though Mooncake does not
  document its client as thread-safe).  The read ends, or raises the first
  failure, only once every one of its calls has ended, so no call writes
  the staging buffer after it.  Splitting keeps each call's bounds, checks
  and retries, and the keys of the calls in flight together stay within
  MAX_KEYS.
* **One read at a time per engramstore object.**  The staging buffer is
  shared, so the reads of one engramstore object are serialised by a lock
  (a lookup waiting for it has released the GIL).  Rows served from the
  row cache never take it.
"""
from __future__ import annotations

import errno as _errno
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from . import _engram
from ._engram import (EngramError, LayoutMismatchError, StateError,
                      TableNotFoundError)

# Mooncake's error codes (mooncake-store's ErrorCode) that this module
# names or tells apart.
INVALID_PARAMS = -600
OBJECT_NOT_FOUND = -704
OBJECT_ALREADY_EXISTS = -705
OBJECT_HAS_LEASE = -706
_CODE_NAMES = {
    -1: "INTERNAL_ERROR", -101: "SEGMENT_NOT_FOUND", -600: "INVALID_PARAMS",
    -703: "REPLICA_IS_NOT_READY", -704: "OBJECT_NOT_FOUND", -705: "OBJECT_ALREADY_EXISTS",
    -706: "OBJECT_HAS_LEASE", -707: "LEASE_EXPIRED", -710: "REPLICA_NOT_FOUND",
    -712: "REPLICA_IS_GONE", -714: "OBJECT_REPLICA_BUSY", -800: "TRANSFER_FAIL",
    -900: "RPC_FAIL", -901: "RPC_TIMEOUT",
}
# Conditions that pass: retried until the deadline.  Everything else (a
# missing object, a range outside it, an invalid argument) is final.
_TRANSIENT = frozenset((-1, -101, -703, -706, -707, -712, -714, -800, -900, -901))

MAX_RANGES = 8192         # ranges per get_into_ranges call (see the module doc)
MAX_KEYS = 256            # keys (objects) per call
READ_CALLS = 4            # get_into_ranges calls of a read in flight at once, at most
EXPLORE = 16              # adaptive read_calls: every EXPLORE-th read tries a neighbour
EWMA = 0.25               # adaptive read_calls: weight of a read's time per row
MIN_CALL_ROWS = 256       # rows a call must carry for a read to be split
STAGE_BYTES = 4 << 20     # the staging buffer (at least one row)
READ_DEADLINE = 5.0       # seconds a read retries transient errors
REMOVE_DEADLINE = 15.0    # seconds a remove waits out leases (Mooncake's default lease: 10 s)
MANIFEST_FORMAT = "engramstore-mooncake/3"    # rows at {ns}/{name}@{epoch}.{nonce}
MANIFEST_FORMAT_2 = "engramstore-mooncake/2"  # rows at {ns}/{name}@{epoch}: still read
MANIFEST_FORMAT_1 = "engramstore-mooncake/1"  # rows at {namespace}/{name}: still read
INDEX_FORMAT = "engramstore-mooncake-index/1"
INDEX_PROBE = 64          # index keys probed per existence call
PUBLISH_TRIES = 64        # index entries a populate tries (writers racing for them)
ROW_BYTES_MAX = 1 << 24   # ENGRAM_ROW_BYTES_MAX

_E = TypeVar("_E", bound=BaseException)


_NAME_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-")


def check_name(name: object, arg: str = "name") -> str:
    """engram's name rule (engram.h): 1..128 bytes of [A-Za-z0-9._:-], not
    starting with '.'."""
    if not isinstance(name, str):
        raise TypeError(f"{arg}: expected a str, got {type(name).__name__}")
    if not (0 < len(name) <= 128) or name[0] == "." or not set(name) <= _NAME_CHARS:
        raise _error(_engram.SpecError, _engram.ESPEC,
                     f"{arg}: invalid name {name!r} (1 to 128 of [A-Za-z0-9._:-], "
                     "not starting with '.')")
    return name


def code_name(code: int) -> str:
    return f"{_CODE_NAMES.get(code, 'error')} {code}"


class MooncakeError(EngramError):
    """A Mooncake Store operation failed: ``key`` names the object,
    ``code`` is Mooncake's error code (None for a short read or a malformed
    answer); ``errno`` is EIO.  A lookup that fails this way raises an
    EngramError whose ``__cause__`` is this error."""

    def __init__(self, key: str, what: str, code: int | None = None):
        text = f"{key}: {what}" + (f" (Mooncake {code_name(code)})" if code is not None else "")
        super().__init__(text)
        self.errno = _errno.EIO
        self.key = key
        self.code = code


def _error(cls: type[_E], code: int, msg: str) -> _E:
    e = cls(msg)
    e.errno = code  # type: ignore[attr-defined]
    return e


def is_mooncake_client(obj: object) -> bool:
    """A Mooncake Store client, by what it can do (engramstore never
    imports mooncake itself)."""
    return all(callable(getattr(obj, m, None)) for m in
               ("get_into_ranges", "batch_get_into", "batch_put_from", "batch_is_exist",
                "register_buffer", "unregister_buffer", "remove", "get_size"))


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:  # pragma: no cover - Mooncake's wheel needs it anyway
        raise ImportError("engramstore: a Mooncake store client needs numpy") from None
    return numpy


def _positive(name: str, value: Any, kind: type = int) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) \
            or value <= 0:
        raise ValueError(f"{name}: expected a positive {kind.__name__}, got {value!r}")
    return value


class _StagePool:
    """The staging buffers registered with one Mooncake client (see the
    module doc): every one it registered (held, so never freed while
    registered) and those no store is using.  It lives until the client
    object is freed, and never calls into the client itself."""

    def __init__(self) -> None:
        self.lock = threading.Lock()  # for take(); give() needs none
        self.held: list[Any] = []
        self.free: list[Any] = []
        self.owner: object = None  # the client, where it takes no weak reference

    def take(self, nbytes: int) -> Any:
        """A free buffer of at least nbytes, or None."""
        with self.lock:
            for i, b in enumerate(self.free):
                if len(b) >= nbytes:
                    return self.free.pop(i)
        return None

    def give(self, buf: Any) -> None:
        """Hands a buffer back.  Safe from __del__ (a garbage collection
        may run inside take(): list.append takes no lock)."""
        self.free.append(buf)


# id(client) -> its _StagePool, dropped when the client object is freed.
_stage_pools: dict[int, _StagePool] = {}
_stage_pools_lock = threading.Lock()


def _stage_pool(mc: Any) -> _StagePool:
    """The _StagePool of the client whose register_buffer mc calls (mc
    itself, or the client a forwarding wrapper passes calls to)."""
    owner = getattr(getattr(mc, "register_buffer", None), "__self__", None)
    if owner is None:
        owner = mc
    with _stage_pools_lock:
        pool = _stage_pools.get(id(owner))
        if pool is None:
            pool = _stage_pools[id(owner)] = _StagePool()
            try:
                # Not at the interpreter's exit (atexit=False): the client
                # may still be alive then, its buffers still registered.
                weakref.finalize(owner, _stage_pools.pop, id(owner), None).atexit = False
            except TypeError:
                pool.owner = owner  # no weak reference: kept, so its id is never reused
        return pool


class _Client:
    """One engramstore object's use of a Mooncake client: the read path
    (staging, bounded calls, length checks, retries) and the writes."""

    def __init__(self, mc: Any, *, read_deadline: float = READ_DEADLINE,
                 max_ranges: int = MAX_RANGES, stage_bytes: int = STAGE_BYTES,
                 read_calls: int | None = None) -> None:
        if not is_mooncake_client(mc):
            raise TypeError(f"store client: expected a mooncake.store.MooncakeDistributedStore "
                            f"(set up), got {type(mc).__name__}")
        self.mc = mc
        self.read_deadline = float(_positive("read_deadline", read_deadline, float))
        self.max_ranges = _positive("max_ranges", max_ranges)
        self.stage_bytes = _positive("stage_bytes", stage_bytes)
        self.np = _numpy()
        self.lock = threading.Lock()
        self.stage: Any = None  # numpy uint8 of the pool, registered with mc
        self.stages = _stage_pool(mc)
        self.closed = False
        # Fixed, or adapted between 1 and READ_CALLS (None).
        self.adapt = _Adapt(READ_CALLS) if read_calls is None else None
        self.read_calls = READ_CALLS if read_calls is None else _positive("read_calls", read_calls)
        self.pool: ThreadPoolExecutor | None = None  # the other calls of a wave
        self.count_lock = threading.Lock()
        self.calls = 0          # get_into_ranges calls (stats)
        self.retries = 0

    # -- the read path -------------------------------------------------------

    def _staging(self, row_bytes: int) -> Any:
        """The registered staging buffer, holding at least one row (under
        the lock)."""
        if self.closed:
            raise _error(StateError, _engram.ESTATE, "the store is closed")
        if self.stage is None or len(self.stage) < row_bytes:
            self._release_stage()
            want = max(self.stage_bytes, row_bytes)
            stage = self.stages.take(want)
            if stage is None:
                stage = self.np.empty(want, self.np.uint8)
                rc = self.mc.register_buffer(stage.ctypes.data, stage.nbytes)
                if rc != 0:
                    raise MooncakeError("staging buffer", f"register_buffer of {stage.nbytes} "
                                        "bytes failed", rc)
                self.stages.held.append(stage)
            self.stage = stage
        return self.stage

    def _release_stage(self) -> None:
        """Hands the staging buffer back to its client's pool: no call
        into the client (see the module doc)."""
        if self.stage is not None:
            stage, self.stage = self.stage, None
            self.stages.give(stage)

    def read_group(self, keys: list[str], row_bytes: int, rows: Any, out: Any,
                   tables: Any, adapt: bool = True) -> None:
        """Fills out[i] with row rows[i] of object keys[tables[i]] (rows:
        uint64 [n], tables: uint32 [n], out: uint8 [n, row_bytes]), in
        calls of at most max_ranges ranges, split evenly, up to read_calls
        of them in flight at once with MAX_KEYS keys among them; raises
        MooncakeError
        naming the key of a range that failed.  adapt=False: a read that is
        not a lookup's (a populate's check) takes the adapted number of
        calls as it is, and is not measured."""
        np = self.np
        n = len(rows)
        order = np.argsort(tables, kind="stable")  # each key's ranges together
        st, sr = tables[order], rows[order]
        deadline = time.monotonic() + self.read_deadline
        with self.lock:
            stage = self._staging(row_bytes)
            stage_rows = len(stage) // row_bytes
            # Calls in flight at once: only where each gets MIN_CALL_ROWS
            # rows (a call's fixed cost is what overlapping hides), and
            # each one its own slot of the staging buffer; adapted, the
            # number the reads so far found fastest.
            want = self.read_calls
            if self.adapt is not None and not adapt:
                want = self.adapt.best()
            elif self.adapt is not None and n >= 2 * MIN_CALL_ROWS:
                want = self.adapt.pick()
            par = max(1, min(want, n // MIN_CALL_ROWS, stage_rows))
            cap = max(1, min(self.max_ranges, stage_rows // par))
            # The keys of the calls in flight together stay within MAX_KEYS
            # (what bounds the transport's queue per peer, see above).
            kmax = max(1, MAX_KEYS // par)
            per = -(-n // max(par, -(-n // cap)))  # n split evenly into calls of at most cap
            src = (sr * np.uint64(row_bytes)).tolist()
            # Where the key changes, then calls of whole or split key runs:
            # (first row, rows, keys, their source offsets) per call.
            bounds = [0] + (np.flatnonzero(st[1:] != st[:-1]) + 1).tolist() + [n]
            calls: list[tuple[int, int, list[str], list[list[int]]]] = []
            i = 0
            while i < n:
                m = 0
                ks: list[str] = []
                srcs: list[list[int]] = []
                for a, b in zip(bounds, bounds[1:]):
                    if b <= i:
                        continue
                    a = max(a, i + m)
                    take = min(b - a, per - m)
                    if take <= 0 or len(ks) == kmax:
                        break
                    ks.append(keys[int(st[a])])
                    srcs.append(src[a:a + take])
                    m += take
                calls.append((i, m, ks, srcs))
                i += m
            # Waves of at most par calls, call j of a wave into slot j.
            t0 = time.perf_counter()
            for w in range(0, len(calls), par):
                wave = calls[w:w + par]
                self._read_wave(wave, row_bytes, cap, deadline)
                for j, (i, m, _, _) in enumerate(wave):
                    at = j * cap * row_bytes
                    out[order[i:i + m]] = stage[at:at + m * row_bytes].reshape(m, row_bytes)
            if self.adapt is not None and adapt and par == want and n >= 2 * MIN_CALL_ROWS:
                self.adapt.record(par, (time.perf_counter() - t0) / n)

    def _read_wave(self, wave: list[tuple[int, int, list[str], list[list[int]]]],
                   row_bytes: int, cap: int, deadline: float) -> None:
        """Runs the calls of a wave at once (under the lock), call j into
        slot j (cap rows) of the staging buffer: this thread makes the
        first, the client's pool the others.  Returns once every call has
        ended, so that none writes the staging buffer after; raises the
        error of the first call that failed."""
        ptr = self.stage.ctypes.data

        def run(j: int) -> None:
            _, m, ks, srcs = wave[j]
            dsts, at = [], j * cap * row_bytes
            for s in srcs:
                dsts.append(list(range(at, at + len(s) * row_bytes, row_bytes)))
                at += len(s) * row_bytes
            self._read_chunk(ks, row_bytes, ptr, dsts, srcs, deadline)

        if len(wave) == 1:
            run(0)
            return
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.read_calls - 1,
                                           thread_name_prefix="engram-mooncake")
        futs = [self.pool.submit(run, j) for j in range(1, len(wave))]
        first: BaseException | None = None
        try:
            run(0)
        except BaseException as e:  # noqa: BLE001 - raised below, once the others ended
            first = e
        for f in futs:
            err = f.exception()  # waits: the GIL is released meanwhile
            if first is None and err is not None:
                first = err
        if first is not None:
            raise first

    def _read_chunk(self, keys: list[str], row_bytes: int, ptr: int, dsts: list[list[int]],
                    srcs: list[list[int]], deadline: float) -> None:
        """One bounded get_into_ranges: for each key, ranges of row_bytes
        bytes at offsets srcs[j] into the staging buffer at dsts[j].  Every
        range must come back whole; passing errors are retried until the
        deadline."""
        sizes = [[row_bytes] * len(d) for d in dsts]
        delay = 0.002
        while True:
            with self.count_lock:
                self.calls += 1
            res = self.mc.get_into_ranges([ptr], [keys], [dsts], [srcs], [sizes])
            try:
                got = res[0]
                ok = len(res) == 1 and len(got) == len(keys) and \
                    all(len(g) == len(d) for g, d in zip(got, dsts))
            except (TypeError, IndexError):
                ok = False
            if not ok:
                raise MooncakeError(keys[0], f"get_into_ranges answered "
                                    f"{[len(d) for d in dsts]} ranges with {_shape(res)}")
            if all(g.count(row_bytes) == len(g) for g in got):
                return
            j, k, bad = next((j, k, x) for j, g in enumerate(got) for k, x in enumerate(g)
                             if x != row_bytes)
            key, where = keys[j], f"row {srcs[j][k] // row_bytes}"
            if bad >= 0:
                raise MooncakeError(key, f"short read of {where}: {bad} of {row_bytes} bytes")
            if bad not in _TRANSIENT:
                raise MooncakeError(key, "not in the store" if bad == OBJECT_NOT_FOUND
                                    else f"reading {where} failed", bad)
            if time.monotonic() + delay > deadline:
                raise MooncakeError(key, f"reading {where} still failing after "
                                    f"{self.read_deadline:g} s of retries", bad)
            with self.count_lock:
                self.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    # -- objects -------------------------------------------------------------

    def exist(self, keys: list[str]) -> dict[str, bool]:
        """{key: bool}; raises MooncakeError if the store cannot tell."""
        res = self.mc.batch_is_exist(list(keys))
        if len(res) != len(keys):
            raise MooncakeError(keys[0], f"batch_is_exist answered {len(res)} of {len(keys)} keys")
        for k, r in zip(keys, res):
            if r < 0:
                raise MooncakeError(k, "existence check failed", r)
        return {k: r == 1 for k, r in zip(keys, res)}

    def sizes(self, keys: list[str]) -> dict[str, set[int]]:
        """{key: the sizes in bytes of its replicas (empty: it is
        missing)}, in one call (batch_get_replica_desc: the memory
        replicas; get_size for a key with none: one held on disk only, or
        missing, or left out of the answer by a failed call), passing
        errors retried until read_deadline."""
        deadline = time.monotonic() + self.read_deadline
        delay = 0.002
        while True:
            try:
                return self._sizes(keys)
            except MooncakeError as e:
                if e.code not in _TRANSIENT or time.monotonic() + delay > deadline:
                    raise
            with self.count_lock:
                self.retries += 1
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _sizes(self, keys: list[str]) -> dict[str, set[int]]:
        res = self.mc.batch_get_replica_desc(list(keys))
        if not isinstance(res, Mapping):
            raise MooncakeError(keys[0], f"batch_get_replica_desc answered {type(res).__name__}")
        out: dict[str, set[int]] = {}
        for k in keys:
            got: set[int] = set()
            for d in res.get(k) or ():
                try:
                    if d.is_memory_replica():
                        got.add(int(d.get_memory_descriptor().buffer_descriptor.size))
                except (AttributeError, TypeError, ValueError) as e:
                    raise MooncakeError(k, f"batch_get_replica_desc answered {d!r} ({e})") \
                        from None
            if not got:
                size = self.mc.get_size(k)
                if size < 0 and size != OBJECT_NOT_FOUND:
                    raise MooncakeError(k, "get_size failed", size)
                if size >= 0:
                    got.add(size)
            out[k] = got
        return out

    def check_size(self, key: str, want: int,
                   missing_cls: type[EngramError] = TableNotFoundError) -> None:
        """Checks that object `key` exists with `want` bytes."""
        size = self.mc.get_size(key)
        if size == OBJECT_NOT_FOUND:
            raise _error(missing_cls, _errno.ENOENT, f"{key}: not in the Mooncake store")
        if size < 0:
            raise MooncakeError(key, "get_size failed", size)
        if size != want:
            raise _error(LayoutMismatchError, _engram.EMISMATCH,
                         f"{key}: the stored object has {size} bytes, the spec says {want}")

    def put(self, keys: list[str], arrays: list[Any], config: object = None) -> list[int]:
        """Uploads C-contiguous arrays to new keys (batch_put_from, each
        array registered for the call); returns Mooncake's codes."""
        ptrs, sizes = [a.ctypes.data for a in arrays], [a.nbytes for a in arrays]
        done: list[int] = []
        with self.lock:
            try:
                for k, p, s in zip(keys, ptrs, sizes):
                    rc = self.mc.register_buffer(p, s)
                    if rc != 0:
                        raise MooncakeError(k, f"register_buffer of {s} bytes failed", rc)
                    done.append(p)
                args = (list(keys), ptrs, sizes) + (() if config is None else (config,))
                res = list(self.mc.batch_put_from(*args))
            finally:
                for p in done:
                    self.mc.unregister_buffer(p)
        if len(res) != len(keys):
            res = (res + [-1] * len(keys))[:len(keys)]
        return res

    def remove(self, key: str, force: bool = False) -> bool:
        """Removes `key`: True if removed, False if it was not there.
        Without force, a lease (a recent read) is waited out for up to
        REMOVE_DEADLINE seconds."""
        deadline = time.monotonic() + max(REMOVE_DEADLINE, self.read_deadline)
        delay = 0.05
        while True:
            rc = self.mc.remove(key, bool(force))
            if rc == 0:
                return True
            if rc == OBJECT_NOT_FOUND:
                return False
            if rc not in _TRANSIENT or time.monotonic() + delay > deadline:
                raise MooncakeError(key, "remove failed" + (
                    " (a lease of a recent read; force=True removes it anyway)"
                    if rc == OBJECT_HAS_LEASE else ""), rc)
            time.sleep(delay)
            delay = min(delay * 2, 1.0)

    def rollback(self, keys: list[str]) -> None:
        """Removes keys a failed write made (force: nobody may keep them)."""
        for k in keys:
            try:
                self.mc.remove(k, True)
            except Exception:  # noqa: BLE001 - best effort, the write error is raised
                pass

    def close(self) -> None:
        """Makes no call into the Mooncake client, which may be closed
        already (see the module doc)."""
        with self.lock:
            if not self.closed:
                self.closed = True
                self._release_stage()
            if self.pool is not None:
                self.pool.shutdown(wait=True)
                self.pool = None

    def __del__(self) -> None:
        # A store dropped without close(): its staging buffer goes back to
        # the client's pool, still registered, never freed before the client
        # is.  Nothing here calls into the client: it may be closed or torn
        # down by now (at the interpreter's exit), and Mooncake's client
        # crashes on any call then.
        try:
            if not self.closed:
                self.closed = True
                self._release_stage()
            if self.pool is not None:
                self.pool.shutdown(wait=False)
        except Exception:  # noqa: BLE001 - nothing to report to at this point
            pass

    def stats(self) -> dict[str, Any]:
        st = {"get_into_ranges_calls": self.calls, "retries": self.retries,
              "staging_bytes": 0 if self.stage is None else len(self.stage),
              "max_ranges": self.max_ranges, "read_calls": self.read_calls,
              "read_deadline": self.read_deadline, "read_calls_adaptive": self.adapt is not None}
        if self.adapt is not None:
            st["read_calls"] = self.adapt.best()
            st["read_time_per_row"] = dict(self.adapt.cost)
        return st


class _Adapt:
    """How many calls a read makes at once, adapted (see the module doc):
    the choices are 1, 2, 4, ... up to `most`; each keeps a moving average
    of a read's seconds per row with it.  Called under the client's lock."""

    def __init__(self, most: int) -> None:
        self.choices = [c for c in (1 << k for k in range(8)) if c <= most]
        # Tried first from the most calls down, so that a deployment where
        # overlapping pays gets it from the first read.
        self.cost: dict[int, float | None] = {c: None for c in self.choices}
        self.reads = 0
        self.turn = 0

    def best(self) -> int:
        tried = {c: x for c, x in self.cost.items() if x is not None}
        return min(tried, key=tried.__getitem__) if tried else self.choices[-1]

    def pick(self) -> int:
        self.reads += 1
        for c in reversed(self.choices):
            if self.cost[c] is None:
                return c
        best = self.best()
        if self.reads % EXPLORE:
            return best
        i = self.choices.index(best)
        near = [self.choices[j] for j in (i - 1, i + 1) if 0 <= j < len(self.choices)]
        self.turn += 1
        return near[self.turn % len(near)] if near else best

    def record(self, calls: int, per_row: float) -> None:
        old = self.cost[calls]
        self.cost[calls] = per_row if old is None else old + EWMA * (per_row - old)


def _shape(res: Any) -> str:
    try:
        return f"{len(res)} buffers, {[len(x) for x in res]} keys, " \
               f"{[[len(y) for y in x] for x in res]} ranges"
    except TypeError:
        return repr(type(res))


class Sources:
    """The source tables of one engramstore object on one client.  The
    tables of a row size form one group (TableStore.add_source's group=),
    so a lookup reads the missed rows of all its heads (tables) in one
    bounded call sequence: one Mooncake call per lookup, not one per head,
    which is what a ranged read costs most.

    A table is one object (the layer API's) or a run of chunk objects of
    chunk_rows rows each, the last one shorter (the table API's
    publications): a read maps each row to its chunk's object and the
    row's place in it, and the objects of the whole group are what
    _Client.read_group reads.

    With check_sizes, a read is followed by one more call that checks
    that every object it read still has its size, and a read that failed
    for a missing object or a range past an object's end is followed by
    it too: an object replaced behind the store's back by one of another
    size, or removed while it was read (a forced removal lets the memory
    go while a read runs), fails the read, naming both sizes, before any
    of its bytes is used.  on_gone(key) is then told the key, so that the
    store opens its tables again."""

    def __init__(self, client: _Client, check_sizes: bool = False,
                 on_gone: Callable[[str], None] | None = None) -> None:
        self.c = client
        # row_bytes -> (the group's objects, their sizes in bytes, per
        # table i: the index of its first object, its rows per object);
        # replaced whole when a table is added, so a read takes one view.
        self.groups: dict[int, tuple[list[str], list[int], Any, Any]] = {}
        self.fns: dict[int, Callable[[Any, Any, Any], None]] = {}  # row_bytes -> its read_rows
        self.lock = threading.Lock()
        self.check_sizes = check_sizes
        self.on_gone = on_gone

    def add(self, store: TableStore, name: str, num_rows: int, row_bytes: int,
            keys: list[str], chunk_rows: int, cache_bytes: int) -> None:
        """Adds source table `name` of `store`: its rows in objects `keys`,
        chunk_rows rows each (the last one the rest)."""
        np = self.c.np
        assert len(keys) == -(-num_rows // chunk_rows), (len(keys), num_rows, chunk_rows)
        with self.lock:
            old = self.groups.get(row_bytes)
            ks, sizes, first, rows = old if old is not None else \
                ([], [], np.zeros(0, np.int64), np.zeros(0, np.uint64))
            fn = self.fns.get(row_bytes)
            if fn is None:
                def fn(rows: Any, out: Any, tables: Any,
                       _read: Callable[..., None] = self.read, _r: int = row_bytes) -> None:
                    _read(_r, rows, out, tables)
                self.fns[row_bytes] = fn
            last = num_rows - (len(keys) - 1) * chunk_rows
            # The objects are in place before the table can be looked up.
            self.groups[row_bytes] = (
                ks + list(keys),
                sizes + [chunk_rows * row_bytes] * (len(keys) - 1) + [last * row_bytes],
                np.append(first, np.int64(len(ks))), np.append(rows, np.uint64(chunk_rows)))
            try:
                idx = store.add_source(name, {"num_rows": num_rows, "row_bytes": row_bytes}, fn,
                                       cache_bytes=cache_bytes, group="mooncake")
            except BaseException:
                if old is None:
                    del self.groups[row_bytes]
                else:
                    self.groups[row_bytes] = old
                raise
            assert idx == len(first), (idx, len(first))

    def read(self, row_bytes: int, rows: Any, out: Any, tables: Any) -> None:
        """The group's read_rows: each row to its object, _Client.read_group,
        then (check_sizes) the size check of the objects read."""
        np = self.c.np
        keys, sizes, first, per = self.groups[row_bytes]
        tables = np.asarray(tables)
        rows = np.asarray(rows)
        if len(keys) != len(first):  # some table is in more than one object
            cr = per[tables]
            objs = (first[tables] + (rows // cr).astype(np.int64)).astype(np.uint32)
            rows = rows % cr
        else:
            objs = tables
        try:
            self.c.read_group(keys, row_bytes, rows, out, objs)
        except MooncakeError as e:
            if self.check_sizes and e.code in (OBJECT_NOT_FOUND, INVALID_PARAMS):
                self._check(keys, sizes, objs, e)
            raise
        if self.check_sizes:
            self._check(keys, sizes, objs, None)

    def _check(self, keys: list[str], sizes: list[int], objs: Any,
               cause: BaseException | None) -> None:
        """Raises MooncakeError naming the first object read (objs: their
        indices) whose size is not the one its table was opened with,
        after telling on_gone."""
        idx = self.c.np.unique(objs).tolist()
        read = [keys[i] for i in idx]
        have = self.c.sizes(read)
        for i, key in zip(idx, read):
            want = sizes[i]
            if have[key] == {want}:
                continue
            if self.on_gone is not None:
                self.on_gone(key)
            if not have[key]:
                raise MooncakeError(key, "not in the store", OBJECT_NOT_FOUND) from cause
            got = " or ".join(str(x) for x in sorted(have[key]))
            raise MooncakeError(key, f"holds {got} bytes, not the {want} of the table "
                                f"opened on it: replaced behind this store's back") from cause


def cache_shares(cache_bytes: int, sizes: list[int]) -> tuple[int, list[int]]:
    """Splits a row cache budget over tables of `sizes` bytes in proportion
    to their size; returns (the memory store's budget, [share per table]).
    The library keeps an eighth of a store's budget for file-backed reads,
    so the store gets 8/7 of what the tables share."""
    total = sum(sizes)
    if cache_bytes <= 0 or total == 0:
        return 0, [0] * len(sizes)
    shares = [cache_bytes * s // total for s in sizes]
    return cache_bytes + cache_bytes // 7 + (64 << 10), shares


from . import TableStore, _spec_kwargs  # noqa: E402  (defined before this module is imported)
from ._mckv import MooncakeKV  # noqa: E402  (it reads this module's _Client)
from ._types import ArrayArg, MooncakeClient, MooncakeStoreOptions, TableSpecArg  # noqa: E402

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ._engram import TableSpec

CHUNK_BYTES = 256 << 20  # a table's chunk objects, at most (the protocol's limit: 512 MiB)
PUSH_TTL_MS = 120_000    # a populate that shows no life this long may be settled by gc


class _Publisher:
    """A namespace's publications, through the library's protocol
    (_engram._Publication) over MooncakeKV; a populate with a
    ReplicateConfig of its own gets a MooncakeKV of its own for the call."""

    def __init__(self, mc: Any, ns: str, chunk_bytes: int, read_deadline: float) -> None:
        self.mc, self.ns = mc, ns
        self.chunk_bytes, self.read_deadline = chunk_bytes, read_deadline
        self.where = f"the Mooncake namespace '{ns}'"
        self.kv = MooncakeKV(mc, ns, read_deadline=read_deadline)
        self.p = self._publication(self.kv)

    def _publication(self, kv: MooncakeKV) -> Any:
        # direct: MooncakeKV.get_ranges keeps no view of its out, so it is
        # given the read's own memory (the protocol's buffer, or a pulled
        # table's file), not a bytearray copied out after.
        return _engram._Publication(kv, self.where, self.chunk_bytes, PUSH_TTL_MS, 0, True)

    def manifest(self, name: str) -> dict[str, Any] | None:
        """The manifest of published table `name`, or None."""
        try:
            m: dict[str, Any] = self.p.manifest(name)
        except TableNotFoundError:
            return None
        return m

    def chunk_keys(self, m: Mapping[str, Any]) -> list[str]:
        """The objects of a publication's chunks, in order."""
        return [self.kv.piece_key(m["name"], m["epoch"], i) for i in range(m["nchunks"])]

    def push(self, name: str, rows: Any, config: object) -> None:
        if config is None:
            self.p.push(name, rows)
            return
        kv = MooncakeKV(self.mc, self.ns, config=config, read_deadline=self.read_deadline)
        try:
            self._publication(kv).push(name, rows)
        finally:
            kv.close()

    def close(self) -> None:
        """Hands the staging buffer back (no call into the client)."""
        self.kv.close()


_TABLE_OPTIONS = frozenset(("cache_bytes", "cache_keep_all", "threads", "timing"))


class MooncakeTableStore(TableStore):
    """The table API over a Mooncake Store: ``EngramStore(tables=...,
    namespace=..., store_client=client, cache_bytes=0, cache_keep_all=False,
    threads=0, timing=False, read_deadline=5.0, max_ranges=8192,
    chunk_bytes=256 MiB)``.

    Tables are published by the library's publication protocol, the same
    as a Redis Cluster's (docs/format.md, "The publication protocol"):
    over the namespace as MooncakeKV lays it out (engramstore._mckv), a
    table's record holds its manifest (spec, chunking, epoch, an XXH3-64
    per chunk and of the whole), and its rows are chunk objects
    ``{namespace}/.chunk/{name}/{epoch:016x}/{i}`` of ``chunk_bytes`` at
    most, written before the manifest is: a table is visible once its
    manifest is, and each populate's chunks have keys of their own (the
    epoch is 64 random bits).  Lookups go through the library's lookup over
    source tables, so they have the table API's whole contract;
    ``cache_bytes`` is a row cache budget shared by the tables in
    proportion to their size (once full, a cache keeps a row only if it
    was asked for twice lately; ``cache_keep_all=True`` keeps every row
    read).  Every lookup first checks (one existence call for all its
    tables) that the chunks it has open are still there, so rows cached
    here are never served after their table was removed, or removed and
    populated again, by any process."""

    def __init__(self, tables: Mapping[str, TableSpecArg] | None = None,
                 namespace: str | None = None, local_dir: None = None, *,
                 store_client: MooncakeClient, read_deadline: float = READ_DEADLINE,
                 max_ranges: int = MAX_RANGES, read_calls: int | None = None,
                 chunk_bytes: int = CHUNK_BYTES,
                 **options: Unpack[MooncakeStoreOptions]) -> None:
        if local_dir is not None:
            raise TypeError("local_dir: a store on a Mooncake store_client has no local "
                            "directory")
        if namespace is None:
            raise TypeError("namespace: required (the prefix of the tables' Mooncake keys)")
        unknown = set(options) - _TABLE_OPTIONS
        if unknown:
            raise TypeError(f"{sorted(unknown)[0]}: not an option of a store on a Mooncake "
                            f"store_client (options: {', '.join(sorted(_TABLE_OPTIONS))})")
        if tables is not None and not isinstance(tables, dict):
            raise TypeError(f"tables: expected a dict of name -> spec, got {type(tables).__name__}")
        _positive("chunk_bytes", chunk_bytes)
        self._cache_total = options.get("cache_bytes", 0) or 0
        budget, _ = cache_shares(self._cache_total, [1])
        client = _Client(store_client, read_deadline=read_deadline, max_ranges=max_ranges,
                         read_calls=read_calls)
        pubs = _Publisher(store_client, check_name(namespace, "namespace"), chunk_bytes,
                          read_deadline)
        opts: dict[str, Any] = dict(options, cache_bytes=budget)
        super().__init__(None, None, None, **opts)
        self._mc = client
        # Every read confirmed by the chunks read still being there with
        # their sizes: a chunk removed (at once, leases or not) while it was
        # read may have given other bytes.
        self._sources = Sources(client, check_sizes=True)
        self._p = pubs
        self._declared: dict[str, tuple[int, int]] = {}  # name -> (num_rows, row_bytes)
        # Published tables this store reads: name -> (its source table in
        # the memory store, the key of its first chunk).  One source table
        # per publication (epoch) read, each with its own row cache: the
        # source table of an epoch that is gone stays in the memory store
        # until close() (the library cannot drop a source table), but
        # under a name no lookup is given again.
        self._open: dict[str, tuple[str, str]] = {}
        self._internal: set[str] = set()  # every source table's name
        # Names open here before, and why they are not any more (removed
        # here, or their rows found gone), for the error of a lookup.
        self._gone: dict[str, str] = {}
        self._state = threading.RLock()   # _open, _internal, _gone, _known_bytes
        self._known_bytes = 0
        try:
            for name, spec in (tables or {}).items():
                kw = _spec_kwargs(name, spec)
                self._known_bytes += int(kw["num_rows"]) * int(kw["row_bytes"])
            for name, spec in (tables or {}).items():
                self.define(name, **_spec_kwargs(name, spec))
        except BaseException:
            self.close()
            raise

    @property
    def namespace(self) -> str:
        """The namespace: the prefix of the tables' Mooncake keys."""
        return self._p.ns

    @property
    def store_client(self) -> MooncakeClient:
        """The Mooncake client (the caller's: close() leaves it open)."""
        client: MooncakeClient = self._mc.mc
        return client

    # -- tables --------------------------------------------------------------

    def define(self, name: str, num_rows: int, row_bytes: int, row_pitch: int = 0) -> None:
        """Declares table ``name``; if it is published, its manifest must
        match (LayoutMismatchError otherwise) and it is opened."""
        check_name(name)
        for arg, v in (("num_rows", num_rows), ("row_bytes", row_bytes)):
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise _error(_engram.SpecError, _engram.ESPEC,
                             f"{name}: {arg} must be a positive int, got {v!r}")
        if row_bytes > ROW_BYTES_MAX:
            raise ValueError(f"{name}: row_bytes: at most {ROW_BYTES_MAX}, got {row_bytes}")
        if row_pitch not in (0, row_bytes):
            raise ValueError(f"{name}: row_pitch: a Mooncake table's rows are packed "
                             f"(row_pitch 0 or {row_bytes})")
        self._declared[name] = (num_rows, row_bytes)
        if name not in self._open:
            m = self._p.manifest(name)
            if m is not None:
                self._check_spec(name, m)
                self._add(name, m)

    def _check_spec(self, name: str, m: dict[str, Any]) -> None:
        want = self._declared.get(name)
        if want is not None and want != (m["num_rows"], m["row_bytes"]):
            raise _error(LayoutMismatchError, _engram.EMISMATCH,
                         f"table '{name}': declared {want[0]} rows of {want[1]} bytes, "
                         f"published {m['num_rows']} rows of {m['row_bytes']} bytes")

    def _add(self, name: str, m: dict[str, Any]) -> None:
        """Opens published table `name` (manifest m) as a new source table,
        unless another thread opened the same publication meanwhile."""
        n, r, cr = m["num_rows"], m["row_bytes"], m["chunk_rows"]
        keys = self._p.chunk_keys(m)
        try:
            self._mc.check_size(keys[0], min(cr, n) * r)
        except TableNotFoundError:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"table '{name}': its manifest is in the Mooncake Store, its rows "
                         f"({keys[0]}) are not: removed (by any process), or lost with the "
                         f"memory segment that held them{_SEGMENTS}") from None
        with self._state:
            self._gone.pop(name, None)
            if self._open.get(name, ("", ""))[1] == keys[0]:
                return
            if name not in self._declared and name not in self._open:
                self._known_bytes += n * r
            share = 0
            if self._cache_total:
                share = self._cache_total * n * r // max(self._known_bytes, n * r)
            # The table's own name if free, else the first free "name..g":
            # a source table's name is never given to another table.
            internal, g = name, 0
            while internal in self._internal:
                g += 1
                internal = f"{name}..{g}"
            self._sources.add(self, internal, n, r, keys, cr, share)
            self._internal.add(internal)
            self._open[name] = (internal, keys[0])

    def _refresh(self, tables: Sequence[object], deep: bool = False) -> None:
        """Makes the lookup of `tables` read the tables published now: a
        table whose first chunk is gone (removed, or removed and populated
        again, by any process) is closed, and published tables not open are
        opened from their manifests.  deep (after a read found a chunk
        missing): a table is closed unless its manifest still names the
        publication open (a removal may have left its first chunk)."""
        if self.closed:
            return  # the lookup raises StoreClosedError
        names = [t for t in dict.fromkeys(tables) if isinstance(t, str) and _valid_name(t)]
        with self._state:
            held = {n: self._open[n][1] for n in names if n in self._open}
        if held:
            have = self._mc.exist(list(held.values()))
            for n, key in held.items() if deep else ():
                m = self._p.manifest(n)
                if m is None or self._p.kv.piece_key(n, m["epoch"], 0) != key:
                    have[key] = False
            with self._state:
                for n, key in held.items():
                    if not have[key] and self._open.get(n, ("", ""))[1] == key:
                        del self._open[n]
                        self._gone[n] = (f"its rows ({key}) are gone: removed (by any "
                                         f"process), or lost with the memory segment that "
                                         f"held them{_SEGMENTS}")
        for n in names:
            if n not in self._open:
                m = self._p.manifest(n)
                if m is not None:
                    self._check_spec(n, m)
                    self._add(n, m)

    def populate(self, name: str, rows: ArrayArg, config: object = None) -> None:
        """Publishes ``rows`` (uint8 ``[num_rows, row_bytes]``, row stride
        >= row_bytes) as table ``name``, create-only: TableExistsError if
        it is published, or being populated, by any process.  ``config``
        is a ``mooncake.store.ReplicateConfig`` for the upload (its
        ``with_hard_pin = True`` keeps Mooncake from evicting the table).  Rows with a
        stride wider than row_bytes are uploaded from a packed copy."""
        check_name(name)
        np = self._mc.np
        if self.closed:
            raise _error(_engram.StoreClosedError, _engram.ESTATE, "the store is closed")
        arr = _rows_array(np, rows)
        n, r = arr.shape
        want = self._declared.get(name)
        if want is not None and want != (n, r):
            raise ValueError(f"rows: expected shape ({want[0]}, {want[1]}) (the declared "
                             f"spec of '{name}'), got {arr.shape}")
        if r > ROW_BYTES_MAX:
            raise ValueError(f"rows: row_bytes: at most {ROW_BYTES_MAX}, got {r}")
        if n == 0 or r == 0:
            raise _error(_engram.SpecError, _engram.ESPEC, f"{name}: empty table {arr.shape}")
        packed = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        self._p.push(name, packed, config)
        m = self._p.manifest(name)
        if m is not None:  # else removed at once by another process
            self._add(name, m)

    def lookup(self, tables: Sequence[str], ids: ArrayArg,
               out: ArrayArg | None = None, offsets: Sequence[int] | ArrayArg | None = None,
               stream: object = None, *, zero_dead: bool = False) -> Any:
        """The table API's lookup (see TableStore.lookup) over the
        Mooncake tables.  It first checks, with one existence call to the
        Store for all of its tables, that the rows it has open are those
        published now, opening tables published since (by any process);
        a table whose rows go away during the lookup makes it check again
        and retry, once.  A table not published raises TableNotFoundError
        saying what the Store lacks: a Mooncake object lives in one
        client's memory segment and leaves with it (docs/mooncake.md)."""
        if not isinstance(tables, (list, tuple)):
            return super().lookup(tables, ids, out, offsets, stream, zero_dead=zero_dead)
        self._refresh(tables)
        try:
            return super().lookup(self._internal_names(tables), ids, out, offsets, stream,
                                  zero_dead=zero_dead)
        except EngramError as e:
            cause = e.__cause__
            if not (isinstance(cause, MooncakeError) and cause.code == OBJECT_NOT_FOUND):
                raise
        self._refresh(tables, deep=True)
        return super().lookup(self._internal_names(tables), ids, out, offsets, stream,
                              zero_dead=zero_dead)

    def _internal_names(self, tables: Sequence[str]) -> list[str]:
        """The source tables of `tables`.  A name of a table that is not
        published (by what _refresh() found) is refused here, saying what
        the Mooncake Store lacks, rather than passed on to the memory store
        (whose source table of it, if any, is one no longer published, or
        another table's); names that are no valid names are passed on, for
        the library's error."""
        if self.closed:
            return list(tables)  # the lookup raises StoreClosedError
        names = []
        with self._state:
            for k, t in enumerate(tables):
                if isinstance(t, str) and t in self._open:
                    names.append(self._open[t][0])
                    continue
                if isinstance(t, str) and _valid_name(t):
                    why = self._gone.get(t)
                    raise _error(TableNotFoundError, _errno.ENOENT, (
                        f"tables[{k}]: table '{t}' is no longer in the Mooncake namespace "
                        f"'{self.namespace}': {why}") if why else (
                        f"tables[{k}]: table '{t}' is not in the Mooncake namespace "
                        f"'{self.namespace}': the Mooncake Store holds no manifest of it "
                        f"(never populated, removed, or lost with the memory segment that "
                        f"held it{_SEGMENTS})"))
                names.append(t)
        return names

    def get_table_spec(self, name: str) -> TableSpec:
        """``{"num_rows", "row_bytes", "row_pitch", "stored", "kind": "mooncake",
        "epoch", "checksum", "created_ns", "chunk_rows", "chunk_keys"}`` of a
        published table (epoch: its publication's, checksum: the XXH3-64 of
        its rows, chunk_keys: the objects of its rows); declared-only names
        give ``stored: False``."""
        m = self._p.manifest(check_name(name))
        if m is None:
            if name in self._declared:
                n, r = self._declared[name]
                return {"num_rows": n, "row_bytes": r, "row_pitch": r, "stored": False,
                        "kind": "mooncake"}
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"table '{name}' is not in the Mooncake namespace '{self.namespace}'")
        return {"num_rows": m["num_rows"], "row_bytes": m["row_bytes"],
                "row_pitch": m["row_bytes"], "stored": True, "kind": "mooncake",
                "epoch": m["epoch"], "checksum": m["checksum"], "created_ns": m["created_ns"],
                "chunk_rows": m["chunk_rows"], "chunk_keys": self._p.chunk_keys(m)}

    def list_tables(self) -> list[str]:
        """The tables published in the namespace, by any process, sorted."""
        return sorted(self._p.p.list())

    def remove(self, name: str, force: bool = False) -> None:
        """Unpublishes table ``name`` (its manifest goes first: no store
        opens it again), then deletes its chunks and its record.  The
        chunks go at once, leases of recent reads or not (``force`` is
        accepted for the table API's signature, and changes nothing): every
        read of a chunk is confirmed by the chunk still being there after
        it, so a lookup racing the removal fails, never returns other
        bytes.  The name can then be populated again, by any process; rows
        of the old table cached by any store are never served again."""
        check_name(name)
        try:
            self._p.p.remove(name)
        except TableNotFoundError as e:
            if self._p.manifest(name) is not None:
                raise  # published again meanwhile: the protocol's message says so
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"table '{name}' is not in the Mooncake namespace "
                         f"'{self.namespace}'") from e
        finally:
            with self._state:
                if self._open.pop(name, None) is not None:
                    self._gone[name] = "removed (by this store)"

    def gc(self, dry_run: bool = False) -> list[tuple[str, int, str]]:
        """Settles what populates and removals that died (a killed
        process, a lost client) left in the namespace: a populate's record
        idle past its TTL (2 min) and its chunks, a removal's chunks.
        Returns ``[(name, code, detail)]``: code 0 settled (or would be,
        with dry_run), 1 kept (still live), negative: failed."""
        return list(self._p.p.gc(0, dry_run))

    def verify(self, name: str) -> None:
        """Reads table ``name`` whole and checks every chunk and the whole
        against its manifest's XXH3-64 (CorruptTableError on a mismatch)."""
        try:
            self._p.p.read(check_name(name))
        except TableNotFoundError:
            raise _error(TableNotFoundError, _errno.ENOENT,
                         f"table '{name}' is not in the Mooncake namespace "
                         f"'{self.namespace}'") from None

    def populate_shared(self, name: str, rows: ArrayArg, *,
                        timeout: float | None = 600.0) -> bool:
        """Not for a Mooncake Store: its tables are create-only already;
        every rank may call :meth:`populate` and the first one wins."""
        raise _error(_engram.StateError, _engram.ESTATE,
                     "populate_shared: for a local namespace; on a Mooncake Store every rank "
                     "may populate() and the first wins (the others get TableExistsError)")

    def wait_for(self, name: str, timeout: float | None = None) -> None:
        """Not for a Mooncake Store (its tables are read on demand)."""
        raise _error(_engram.StateError, _engram.ESTATE,
                     "wait_for: for a local namespace (it watches the namespace directory)")

    def usage(self, name: str) -> dict[str, Any]:
        """Not for a Mooncake Store (no table file to account for)."""
        raise _error(_engram.StateError, _engram.ESTATE,
                     "usage: for a table file of a local namespace; a Mooncake table's memory "
                     "is the Store's (see stats()['mooncake'])")

    def stats(self) -> dict[str, Any]:
        """The library's stats of the source tables (row cache included),
        with the Mooncake reads under ``mooncake``."""
        st = super().stats()
        st["mooncake"] = self._mc.stats()
        return st

    def close(self) -> None:
        """Closes the store (waits for running lookups) and hands its
        staging buffers back; the Mooncake client stays the caller's."""
        super().close()
        for c in (getattr(self, "_mc", None), getattr(self, "_p", None)):
            if c is not None:
                c.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = " (closed)" if self.closed else ""
        return f"<engramstore.MooncakeTableStore namespace={self.namespace!r}{state}>"


# Why a Mooncake object can vanish without a remove(), for the errors that
# say so (docs/mooncake.md, "Where the objects live").
_SEGMENTS = ("; a Mooncake object lives in the memory segment of one client (the one "
             "the master placed it in, often its writer's), and goes when that client "
             "closes or its process exits, or when the master restarts")


def _valid_name(name: str) -> bool:
    return 0 < len(name) <= 128 and name[0] != "." and set(name) <= _NAME_CHARS


def _rows_array(np: Any, rows: ArrayArg) -> Any:
    """rows as a numpy view (never a copy): uint8 [N, R], each row's bytes
    contiguous."""
    try:
        arr = np.asarray(memoryview(rows)) if not isinstance(rows, np.ndarray) else rows
    except TypeError:
        raise TypeError(f"rows: expected an array, got {type(rows).__name__}") from None
    if arr.dtype != np.uint8:
        raise TypeError(f"rows: expected uint8, got {arr.dtype}")
    if arr.ndim != 2:
        raise ValueError(f"rows: expected a 2-D array [num_rows, row_bytes], got shape "
                         f"{arr.shape}")
    if arr.shape[1] > 1 and arr.strides[1] != 1 or arr.strides[0] < arr.shape[1]:
        raise ValueError("rows: each row's bytes must be contiguous (row stride >= row_bytes)")
    return arr


# ---- pulling a table into a local namespace --------------------------------
#
# TableStore.pull(MooncakeTableStore or client, name) copies a published
# table into the local store's namespace directory through the library's
# engram_pull_rows(): the same create-only atomic writer as populate()
# (capacity checked before the first byte, a temporary file published
# only at commit), and the same meeting of the ranks of a node as
# engram_pull() (one copies, the others wait for its temporary file and
# then compare).  The rows come from the protocol's read of a whole table
# (_Publication.read_into, the read a Redis Cluster's pull makes): its
# chunks read in batches while the batch before is checked against the
# manifest's XXH3-64 of each chunk, the whole checked against its
# checksum before fill() returns, so nothing is published otherwise.


def _publisher(source: object, namespace: str | None) -> tuple[_Publisher, bool]:
    """The _Publisher of a pull's source, and whether it is a new one (to
    be closed)."""
    if isinstance(source, MooncakeTableStore):
        if namespace is not None:
            raise TypeError("namespace: a MooncakeTableStore pulls from its own namespace "
                            f"({source.namespace!r}); give namespace= only with a client")
        if source.closed:
            raise _error(_engram.StoreClosedError, _engram.ESTATE, "source: the store is closed")
        return source._p, False
    if is_mooncake_client(source):
        if namespace is None:
            raise TypeError("namespace: required to pull from a Mooncake client (the prefix of "
                            "the tables' keys)")
        return _Publisher(source, check_name(namespace, "namespace"), CHUNK_BYTES,
                          READ_DEADLINE), True
    raise TypeError(f"source: expected a store opened on a Redis Cluster, a MooncakeTableStore "
                    f"or a mooncake.store.MooncakeDistributedStore, got {type(source).__name__}")


def check_origin(local: TableStore, source: object, name: str, *, namespace: str | None = None
                 ) -> Literal["current", "republished", "changed", "gone"]:
    """TableStore.check_origin() against a Mooncake Store: see there."""
    check_name(name)
    p, mine = _publisher(source, namespace)
    try:
        spec = local.get_table_spec(name)
        o = spec.get("origin")
        if o is None:
            raise _error(EngramError, _errno.EINVAL,
                         f"table '{name}' of {local.path} records no origin: it was not pulled "
                         "from a remote namespace")
        if o["store"] != "mooncake" or o["namespace"] != p.ns:
            raise _error(EngramError, _errno.EINVAL,
                         f"table '{name}' of {local.path} came from namespace "
                         f"'{o['namespace']}' of a "
                         f"{'Mooncake Store' if o['store'] == 'mooncake' else 'Redis Cluster'}, "
                         f"not from the Mooncake namespace '{p.ns}'")
        m = p.manifest(name)
    finally:
        if mine:
            p.close()
    if m is None:
        return "gone"
    if m["epoch"] == o["epoch"]:
        return "current"
    if (m["num_rows"], m["row_bytes"]) != (spec["num_rows"], spec["row_bytes"]):
        return "changed"
    # Published again: the same rows if the local ones have its chunks' XXH3-64s.
    np = _numpy()
    n, cr = m["num_rows"], m["chunk_rows"]
    for i, want in enumerate(m["chunk_sums"]):
        ids = np.arange(i * cr, min(n, (i + 1) * cr), dtype=np.int64)[:, None]
        if _engram._xxh3_64(np.ascontiguousarray(local.lookup([name], ids))) != want:
            return "changed"
    return "republished"


def pull(local: TableStore, source: object, name: str, *, namespace: str | None = None,
         progress: Callable[[int, int], object] | None = None) -> bool:
    """TableStore.pull() from a Mooncake Store: see there."""
    check_name(name)
    if progress is not None and not callable(progress):
        raise TypeError(f"progress: expected a callable, got {type(progress).__name__}")
    p, mine = _publisher(source, namespace)
    try:
        return _pull(local, p, name, progress)
    finally:
        if mine:
            p.close()


def _pull(local: TableStore, p: _Publisher, name: str,
          progress: Callable[[int, int], object] | None) -> bool:
    m = p.manifest(name)
    if m is None:
        raise _error(TableNotFoundError, _errno.ENOENT, f"table '{name}' is not in {p.where}")
    n, r, want = m["num_rows"], m["row_bytes"], m["checksum"]

    def fill(append: Callable[[Any], None]) -> None:
        try:
            p.p.read_into(name, append, n, r, want, progress)
        except TableNotFoundError:
            raise changed("was removed") from None
        except EngramError as e:
            if getattr(e, "errno", None) == _errno.EAGAIN:
                raise changed("was replaced") from e
            if getattr(e, "errno", None) == _errno.ENODATA:
                now = p.manifest(name)  # a chunk gone: removed meanwhile, or lost?
                if now is None or now["epoch"] != m["epoch"]:
                    raise changed("was removed" if now is None else "was replaced") from e
            raise
        # Still the publication read: else it went meanwhile, and its rows
        # are no longer what the Store serves under the name.
        now = p.manifest(name)
        if now is None or now["epoch"] != m["epoch"]:
            raise changed("was removed" if now is None else "was replaced")

    def changed(why: str) -> EngramError:
        return _error(EngramError, _errno.EAGAIN,
                      f"pull '{name}': the table {why} in {p.where} while it was pulled "
                      f"(nothing was published); pull it again")

    def same(view: Any) -> bool:
        return bool(_engram._xxh3_64(view) == want)

    return bool(local._pull_rows(name, n, r, fill, same, p.where, (p.ns, m["epoch"], ""),
                                 checksum=want))
