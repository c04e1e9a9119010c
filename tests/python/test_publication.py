"""The publication protocol (src/publish.c) over every key-value store
written in Python, through _engram._Publication: a plain in-memory store
(MemKV, here) and the Mooncake Store namespace (engramstore._mckv, on the
loopback store of conftest's `mooncake` fixture).  Each runs through a
fault-injecting decorator (FaultKV, here) that fails, loses or holds back
(to land later) the operation a case aims at, and kills a writer at any
step.  The cases are those of tests/test_publish.c, the C suite over
kv_mem and Redis: what a store must give the protocol is kv.h, and what
the protocol must make of it, whatever fails, is checked the same way on
each:

- kv_contract: the store against kv.h directly (the four answers of a
  swap on binary values, ranged reads and their -ENODATA, deletion);
- push_read: a push reads back exact, is listed once, described by its
  manifest; a second push of the name raises TableExistsError;
- racing_pushes: 4 threads push one name: exactly one wins, the table is
  the winner's, and after gc nothing of the losers is left;
- remove_race: a removal and a push of the name again, at once;
- killed_writer: a push killed at each of its steps in turn: nothing half
  shows, and after the TTL a gc leaves nothing and the name can be pushed;
- lost_publish, deferred_publish, remove_lost: a reply lost, and a write
  held back that lands after its writer resolved it; lost_publish_rewrite_
  fails: the publication's reply lost and the manifest's rewrite failing;
- gc_live: gc keeps a live push and settles a dead one, and a stalled one
  that outlived its TTL;
- random_faults: pushes, removals and gcs under random faults, and what
  must hold whatever they are;

and the Mooncake store's own guarantees (engramstore._mckv): swaps that
are atomic and reads that are exact among writers of their own caches,
a record's versions found again from its milestones, and a writer killed
between any two of its calls to Mooncake.

After each case a gc leaves no pending record and no piece but those of
the tables listed.  No assertion rests on timing or on how the threads
interleave: waits for what must happen are bounded by a minute, and a push
that must live has a TTL of 30 s (3 s where it must be able to die, for
which it shows life every 1.5 s)."""
from __future__ import annotations

import errno
import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import engramstore
from engramstore import _engram
from esutil import make_rows

RB = 24              # row bytes
CHUNK_ROWS = 4       # rows per chunk
CHUNK_BYTES = CHUNK_ROWS * RB
NROWS = 14           # a table: 4 chunks, the last one short
NCHUNKS = 4
TTL_MS = 30000       # a push that must live
DEAD_TTL_MS = 3000   # pushes that may die, settled once it passed: long enough that a live
                     # one (it shows life every half) is not taken for dead on a busy machine
WAIT_S = 60.0        # the longest wait for what must happen

MANIFEST_HEAD = b"engram-redis 1\n"
PENDING_HEAD = b"engram-pending 1\n"
CLOSED_HEAD = b"engram-pending 1\nstate closed\n"

DONE, ABSENT, PRESENT, DIFFERS = 1, 0, 2, -1

_ids = itertools.count()


# ---- the stores -------------------------------------------------------------

class MemKV:
    """kv.h in memory: records in a dict under a lock, pieces with an
    expiry by the monotonic clock."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.recs: dict[str, bytes] = {}
        # (name, epoch, layout, index) -> (bytes, when it expires or None)
        self.pieces: dict[tuple[str, int, int, int], tuple[bytes, float | None]] = {}

    def _piece(self, key: tuple[str, int, int, int]) -> bytes | None:
        p = self.pieces.get(key)
        if p is not None and p[1] is not None and p[1] <= time.monotonic():
            del self.pieces[key]
            p = None
        return None if p is None else p[0]

    def rec_get(self, name: str) -> bytes | None:
        with self.lock:
            return self.recs.get(name)

    def rec_cas(self, name: str, expect: bytes | None, val: bytes | None) -> int:
        with self.lock:
            cur = self.recs.get(name)
            if expect is None and cur is not None:
                return PRESENT
            if expect is not None and cur is None:
                return ABSENT
            if expect is not None and cur != expect:
                return DIFFERS
            if val is None:
                self.recs.pop(name, None)
            else:
                self.recs[name] = bytes(val)
            return DONE

    def rec_list(self) -> list[tuple[str, bytes]]:
        with self.lock:
            return list(self.recs.items())

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def sync(self) -> None:
        pass

    def piece_put(self, name: str, epoch: int, layout: int, index: int, data: Any,
                  ttl_ms: int) -> None:
        with self.lock:
            self.pieces[(name, epoch, layout, index)] = (bytes(data),
                                                         time.monotonic() + ttl_ms / 1e3)

    def piece_expire(self, name: str, epoch: int, layout: int, index: int, ttl_ms: int) -> bool:
        key = (name, epoch, layout, index)
        with self.lock:
            data = self._piece(key)
            if data is None:
                return False
            self.pieces[key] = (data, None if ttl_ms == 0 else time.monotonic() + ttl_ms / 1e3)
            return True

    def piece_del(self, name: str, epoch: int, layout: int, n: int) -> None:
        with self.lock:
            for i in range(n):
                self.pieces.pop((name, epoch, layout, i), None)

    def get_ranges(self, name: str, epoch: int, layout: int,
                   ranges: list[tuple[int, int, int, bool]], out: Any) -> None:
        at = 0
        with self.lock:
            for index, start, length, whole in ranges:
                data = self._piece((name, epoch, layout, index))
                if data is None:
                    raise LookupError(f"piece {index} of '{name}' ({epoch:016x}) is missing")
                if start + length > len(data) or (whole and start + length != len(data)):
                    raise LookupError(f"piece {index} of '{name}' has {len(data)} bytes, not "
                                      f"{start + length}")
                out[at:at + length] = data[start:start + length]
                at += length

    def census(self) -> tuple[int, int]:
        """(records, pieces) held, expired ones dropped."""
        with self.lock:
            for key in list(self.pieces):
                self._piece(key)
            return len(self.recs), len(self.pieces)


class Fault:
    def __init__(self, kind: str, op: str, prefix: bytes | None = None, delete: bool = False,
                 skip: int = 0, then_kill: bool = False) -> None:
        self.kind, self.op, self.prefix, self.delete = kind, op, prefix, delete
        self.skip, self.then_kill = skip, then_kill

    def matches(self, op: str, args: tuple[Any, ...]) -> bool:
        if op != self.op:
            return False
        if op == "rec_cas":
            val = args[2]
            if self.delete and val is not None:
                return False
            if self.prefix is not None and (val is None or not bytes(val).startswith(self.prefix)):
                return False
        if self.skip:
            self.skip -= 1
            return False
        return True


PUBLICATION = ("rec_cas", MANIFEST_HEAD)  # the swap of the open record for the manifest
REMOVAL = ("rec_cas", CLOSED_HEAD)        # a removal's swap of the manifest for a closed record
WRITES = ("rec_cas", "piece_put", "piece_expire", "piece_del")


class FaultKV:
    """A decorator of any kv that forwards every operation, except where a
    test armed a fault (each fires once, on the first operation it
    matches; armed ones fire in the order armed: only the first not yet
    fired is matched):

    - fail:  raises TimeoutError before forwarding: nothing happened;
    - lost:  forwards, then raises TimeoutError: it happened, its reply lost;
    - defer: keeps the operation (a write), raises TimeoutError; release()
             lands it later: a copy still in flight that runs late;

    and kill_after(n): the next n operations go through, every one after
    them raises ConnectionResetError until revive(): a writer killed at
    its step n.  A fault with then_kill kills the same way once it fired.
    Every piece ever written through it is recorded, so that what is left
    can be asked of the store itself."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.fired = 0
        self.kill_left: int | None = None
        self.killed = 0
        self.deferred: list[tuple[str, tuple[Any, ...]]] = []
        self.written: set[tuple[str, int, int, int]] = set()

    # -- arming --
    def fail(self, op: str, prefix: bytes | None = None, **kw: Any) -> None:
        self.faults.append(Fault("fail", op, prefix, **kw))

    def lost(self, op: str, prefix: bytes | None = None, **kw: Any) -> None:
        self.faults.append(Fault("lost", op, prefix, **kw))

    def defer(self, op: str, prefix: bytes | None = None, **kw: Any) -> None:
        assert op in WRITES
        self.faults.append(Fault("defer", op, prefix, **kw))

    def kill_after(self, n: int) -> None:
        with self.lock:
            self.kill_left, self.killed = n, 0

    def revive(self) -> None:
        with self.lock:
            self.kill_left = None
            self.faults.clear()

    def release(self) -> Any:
        """Lands the oldest operation held back: its result."""
        with self.lock:
            op, args = self.deferred.pop(0)
        return getattr(self.inner, op)(*args)

    # -- the operations --
    def _call(self, op: str, *args: Any) -> Any:
        with self.lock:
            if self.kill_left is not None:
                if self.kill_left == 0:
                    self.killed += 1
                    raise ConnectionResetError(f"kv.{op}: the writer was killed (test)")
                self.kill_left -= 1
            f = self.faults[0] if self.faults and self.faults[0].matches(op, args) else None
            if f is not None:
                self.faults.pop(0)
                self.fired += 1
                if f.then_kill:
                    self.kill_left, self.killed = 0, 0
            if op == "piece_put":
                self.written.add(args[:4])
            if f is not None and f.kind == "defer":
                kept = args if op != "piece_put" else args[:4] + (bytes(args[4]),) + args[5:]
                self.deferred.append((op, kept))
        if f is None:
            return getattr(self.inner, op)(*args)
        if f.kind == "lost":
            getattr(self.inner, op)(*args)
            raise TimeoutError(f"kv.{op}: its reply was lost (test)")
        raise TimeoutError(f"kv.{op}: {'held back' if f.kind == 'defer' else 'failed'} (test)")

    def rec_get(self, name: str) -> Any:
        return self._call("rec_get", name)

    def rec_cas(self, name: str, expect: Any, val: Any) -> Any:
        return self._call("rec_cas", name, expect, val)

    def rec_list(self) -> Any:
        return self._call("rec_list")

    def now_ms(self) -> Any:
        return self._call("now_ms")

    def sync(self) -> Any:
        return self._call("sync")

    def piece_put(self, *args: Any) -> Any:
        return self._call("piece_put", *args)

    def piece_expire(self, *args: Any) -> Any:
        return self._call("piece_expire", *args)

    def piece_del(self, *args: Any) -> Any:
        return self._call("piece_del", *args)

    def get_ranges(self, *args: Any) -> Any:
        return self._call("get_ranges", *args)

    def pieces_left(self, keep: Callable[[str, int], bool] = lambda name, epoch: False,
                    name: str | None = None) -> int:
        """How many of the pieces ever written through it still exist (a
        1-byte read of each, asked of the store itself), of those `keep`
        does not claim (and of table `name` only, if given)."""
        n = 0
        for pname, epoch, layout, index in sorted(self.written):
            if (name is not None and pname != name) or keep(pname, epoch):
                continue
            try:
                self.inner.get_ranges(pname, epoch, layout, [(index, 0, 1, False)],
                                      memoryview(bytearray(1)))
                n += 1
            except LookupError:
                pass
        return n


# ---- a case's namespace ---------------------------------------------------

class Ctx:
    """The store under test (raw), the same through the decorator (f), and
    the protocol over that (p, with a TTL of TTL_MS)."""

    def __init__(self, raw: Any, where: str) -> None:
        self.raw = raw
        self.f = FaultKV(raw)
        self.where = where
        self.p = self.pub()

    def pub(self, ttl_ms: int = TTL_MS) -> Any:
        return _engram._Publication(self.f, self.where, CHUNK_BYTES, ttl_ms)


@pytest.fixture(params=["mem", "mooncake"])
def ctx(request: Any) -> Any:
    if request.param == "mem":
        c = Ctx(MemKV(), "mem")
        yield c
        end_check(c)
        return
    from engramstore._mckv import MooncakeKV
    mc = request.getfixturevalue("mc_client")
    ns = f"pub{next(_ids)}-{time.time_ns() % 10**9}"
    kv = MooncakeKV(mc, ns)
    c = Ctx(kv, f"mooncake/{ns}")
    try:
        yield c
        end_check(c)
    finally:
        kv.close()


# ---- pushing and reading --------------------------------------------------

def rows_of(seed: int, nrows: int = NROWS) -> Any:
    return make_rows(nrows, RB, seed=seed)


def push(p: Any, name: str, seed: int, nrows: int = NROWS) -> None:
    p.push(name, rows_of(seed, nrows))


def listed(p: Any, name: str) -> int:
    names = p.list()
    assert names.count(name) <= 1
    return names.count(name)


def check_table(p: Any, name: str, seed: int, nrows: int = NROWS) -> int:
    """Table `name` is published, exactly the rows of `seed`, listed once
    and described by its manifest: returns its epoch."""
    assert p.read(name) == rows_of(seed, nrows).tobytes()
    m = p.manifest(name)
    assert m["name"] == name and m["num_rows"] == nrows and m["row_bytes"] == RB
    assert m["chunk_rows"] == min(CHUNK_ROWS, nrows)
    assert m["nchunks"] == -(-nrows // CHUNK_ROWS)
    assert m["layout"] == 0 and m["epoch"] != 0
    assert listed(p, name) == 1
    return int(m["epoch"])


def check_absent(p: Any, name: str) -> None:
    with pytest.raises(engramstore.TableNotFoundError):
        p.manifest(name)
    with pytest.raises(engramstore.TableNotFoundError):
        p.read(name)
    assert listed(p, name) == 0


def epoch_of(p: Any, name: str) -> int:
    try:
        return int(p.manifest(name)["epoch"])
    except engramstore.TableNotFoundError:
        return 0


# ---- what is left ---------------------------------------------------------

def records_of(c: Ctx, name: str | None) -> tuple[int, int]:
    """(manifests, other records) of table `name` (None: of all), asked of
    the store itself."""
    manifests = others = 0
    for rname, val in c.raw.rec_list():
        if name is not None and rname != name and f"\nname {name}\n".encode() not in val:
            continue
        if val.startswith(MANIFEST_HEAD):
            manifests += 1
        else:
            others += 1
    return manifests, others


def settled(c: Ctx, name: str, keep_epoch: int) -> bool:
    """Nothing of `name` is left but, if keep_epoch, its table of that epoch."""
    manifests, others = records_of(c, name)
    return others == 0 and manifests == (keep_epoch != 0) and \
        c.f.pieces_left(lambda n, e: e == keep_epoch, name) == 0


def gc_settle(c: Ctx, name: str, keep_epoch: int) -> None:
    """Runs gc until `name` is settled: it must be within a minute."""
    t0 = time.monotonic()
    while True:
        reports = c.p.gc()
        if settled(c, name, keep_epoch):
            return
        assert time.monotonic() - t0 < WAIT_S, \
            (f"'{name}' not settled: records {records_of(c, name)}, "
             f"{c.f.pieces_left(lambda n, e: e == keep_epoch, name)} pieces; gc said {reports}")
        time.sleep(0.02)


def end_check(c: Ctx) -> None:
    """A gc settles everything: what is left is the tables listed, whole."""
    c.f.revive()
    t0 = time.monotonic()
    while True:
        c.p.gc()
        tables = {n: c.p.manifest(n) for n in c.p.list()}
        epochs = {(n, m["epoch"]) for n, m in tables.items()}
        manifests, others = records_of(c, None)
        stray = c.f.pieces_left(lambda n, e: (n, e) in epochs)
        if others == 0 and stray == 0:
            break
        assert time.monotonic() - t0 < WAIT_S, \
            f"after a minute of gc: {others} pending records, {stray} pieces of no table listed"
        time.sleep(0.02)
    assert manifests == len(tables)
    for n, m in tables.items():
        assert c.f.pieces_left(name=n) == m["nchunks"]
    if isinstance(c.raw, MemKV):
        assert c.raw.census() == (len(tables), sum(m["nchunks"] for m in tables.values()))


# ---- kv.h itself ----------------------------------------------------------

def test_kv_contract(ctx: Ctx) -> None:
    kv = ctx.raw
    assert kv.rec_get("a") is None
    assert kv.rec_cas("a", None, b"v1") == DONE
    assert kv.rec_cas("a", None, b"v9") == PRESENT
    assert kv.rec_get("a") == b"v1"
    assert kv.rec_cas("a", b"v", b"v2") == DIFFERS
    assert kv.rec_cas("a", b"v1x", b"v2") == DIFFERS
    assert kv.rec_cas("a", b"v1", b"v2") == DONE
    assert kv.rec_cas("a", b"v2", b"v2") == DONE  # written again
    assert kv.rec_get("a") == b"v2"
    assert kv.rec_cas("b", b"v2", b"v3") == ABSENT
    assert kv.rec_cas("b", b"v2", None) == ABSENT
    binary = b"x\0y\nz"
    assert kv.rec_cas("b", None, binary) == DONE
    assert kv.rec_get("b") == binary
    assert kv.rec_cas("b", b"x", b"q") == DIFFERS
    assert kv.rec_cas("b", binary, None) == DONE
    assert kv.rec_list() == [("a", b"v2")]
    assert kv.rec_cas("a", b"v1", None) == DIFFERS
    assert kv.rec_cas("a", b"v2", None) == DONE
    assert kv.rec_get("a") is None and kv.rec_list() == []
    assert kv.rec_cas("a", None, b"again") == DONE  # a name deleted can be put again
    assert kv.rec_list() == [("a", b"again")]
    assert kv.rec_cas("a", b"again", None) == DONE
    assert abs(kv.now_ms() - time.time() * 1e3) < 600_000
    assert kv.sync() is None

    e, other = 0x0123456789ABCDEF, 0x0123456789ABCDEE
    kv.piece_put("p", e, 0, 0, memoryview(b"hello"), 60000)
    kv.piece_put("p", e, 0, 1, memoryview(b"abc"), 60000)
    buf = bytearray(16)

    def ranges(rs: list[tuple[int, int, int, bool]], epoch: int = e) -> bytes:
        n = sum(r[2] for r in rs)
        out = memoryview(buf)[:n]
        kv.get_ranges("p", epoch, 0, rs, out)
        return bytes(out)

    assert ranges([(0, 0, 5, True), (1, 1, 2, True)]) == b"hellobc"
    assert ranges([(0, 1, 3, False)]) == b"ell"
    for bad in ([(0, 0, 4, True)], [(0, 3, 4, False)], [(2, 0, 1, False)],
                [(0, 0, 5, True), (2, 0, 1, False)]):
        with pytest.raises(LookupError):
            ranges(bad)
    with pytest.raises(LookupError):
        ranges([(0, 1, 3, False)], other)  # another epoch's
    assert kv.piece_expire("p", e, 0, 2, 0) is False
    assert kv.piece_expire("p", e, 0, 1, 0) is True  # permanent
    kv.piece_del("p", e, 0, 5)  # missing ones are no failure
    with pytest.raises(LookupError):
        ranges([(1, 0, 3, True)])
    assert kv.piece_expire("p", e, 0, 0, 0) is False


def test_kv_expiry_mem() -> None:
    """MemKV's pieces expire as Redis's do (the Mooncake store's never do:
    _mckv documents why the protocol needs no expiry of them)."""
    kv = MemKV()
    kv.piece_put("p", 1, 0, 0, b"a", 60000)
    kv.piece_put("p", 1, 0, 1, b"b", 60000)
    assert kv.piece_expire("p", 1, 0, 0, 1) is True
    assert kv.piece_expire("p", 1, 0, 1, 0) is True
    time.sleep(0.01)
    assert kv.piece_expire("p", 1, 0, 0, 0) is False
    assert kv.census() == (0, 1)


def test_bad_arguments() -> None:
    """_Publication refuses what it would otherwise truncate or misread,
    before anything reaches the store."""
    kv = MemKV()
    for args in ((kv, "w", 0, 1000), (kv, "w", 1000, 0), (kv, "w", 1000, 1 << 32),
                 (kv, "w", 1000, -1)):
        with pytest.raises((ValueError, OverflowError)):
            _engram._Publication(*args)
    p = _engram._Publication(kv, "mem://bad", CHUNK_BYTES, 60000)
    for rows in (np.zeros((4, 8), np.int16), np.zeros(32, np.uint8),
                 np.zeros((8, 4), np.uint8)[:, ::2], np.zeros((0, 8), np.uint8)):
        with pytest.raises((ValueError, TypeError)):
            p.push("t", rows)
    with pytest.raises(TypeError):
        p.push("t", [[1, 2], [3, 4]])
    with pytest.raises(engramstore.TableNotFoundError):
        p.read("t")
    assert kv.recs == {} and kv.pieces == {}


def test_interrupt_is_raised() -> None:
    """A KeyboardInterrupt in a kv method fails that operation and is
    raised again once the protocol's call returns: Ctrl-C is never lost
    inside a push, and the namespace stays consistent."""

    class Interrupting(MemKV):
        def __init__(self) -> None:
            super().__init__()
            self.cas_calls = 0

        def rec_cas(self, name: str, expect: bytes | None, val: bytes | None) -> int:
            self.cas_calls += 1
            if self.cas_calls == 2:  # the commit's stamp
                raise KeyboardInterrupt
            return super().rec_cas(name, expect, val)

    kv = Interrupting()
    p = _engram._Publication(kv, "mem://interrupt", CHUNK_BYTES, 60000)
    with pytest.raises(KeyboardInterrupt):
        p.push("t", rows_of(1))
    # Whatever the push made of it, the name is a whole table or nothing.
    if "t" in p.list():
        assert p.read("t") == rows_of(1).tobytes()
    else:
        with pytest.raises(engramstore.TableNotFoundError):
            p.manifest("t")


def test_fault_harness(ctx: Ctx) -> None:
    """The decorator does what each fault says, as the store shows it."""
    f, raw = ctx.f, ctx.raw
    f.fail("rec_cas")
    with pytest.raises(TimeoutError):
        f.rec_cas("a", None, b"1")
    assert raw.rec_get("a") is None  # did not happen
    f.lost("rec_cas")
    with pytest.raises(TimeoutError):
        f.rec_cas("a", None, b"1")
    assert raw.rec_get("a") == b"1"  # happened
    f.defer("rec_cas", delete=True)
    assert f.rec_cas("a", b"1", b"2") == DONE  # not a delete: not its turn
    with pytest.raises(TimeoutError):
        f.rec_cas("a", b"2", None)
    assert raw.rec_get("a") == b"2"  # not yet
    assert f.release() == DONE
    assert raw.rec_get("a") is None
    f.fail("rec_cas", b"keep", skip=1)
    f.fail("piece_put")
    f.piece_put("p", 7, 0, 0, memoryview(b"x"), 60000)  # not its turn
    assert f.rec_cas("k", None, b"keep1") == DONE  # skipped
    with pytest.raises(TimeoutError):
        f.rec_cas("k", b"keep1", b"keep2")
    with pytest.raises(TimeoutError):
        f.piece_put("p", 7, 0, 1, memoryview(b"y"), 60000)
    assert f.fired == 5 and not f.faults
    assert f.pieces_left() == 1
    f.kill_after(2)
    f.rec_get("k")
    f.rec_get("k")
    with pytest.raises(ConnectionResetError):
        f.rec_get("k")
    assert f.killed == 1
    f.revive()
    assert f.rec_cas("k", b"keep1", None) == DONE
    f.piece_del("p", 7, 0, 2)
    assert f.pieces_left() == 0


# ---- the cases --------------------------------------------------------------

def test_read_into(ctx: Ctx) -> None:
    """read_into() streams a table in order, its views read-only and of
    memory of their own (a view or array kept past the call still holds
    the rows it was given), progress on the way; refuses a manifest that
    is not the one expected; what rows() raises stops it and is raised."""
    p = ctx.p
    push(p, "t", 1)
    m = p.manifest("t")
    got: list[bytes] = []
    kept: list[Any] = []
    done: list[tuple[int, int]] = []

    def rows(v: memoryview) -> None:
        assert v.readonly and v.ndim == 2 and v.shape[1] == m["row_bytes"]
        got.append(bytes(v))
        kept.append((v[0:1], np.asarray(v), bytes(v)))
    p.read_into("t", rows, m["num_rows"], m["row_bytes"], m["checksum"],
                lambda a, b: done.append((a, b)))
    assert b"".join(got) == rows_of(1).tobytes()
    for head, arr, want in kept:  # still the rows each call was given
        assert bytes(head) == want[:len(bytes(head))] and arr.tobytes() == want
    size = m["num_rows"] * m["row_bytes"]
    assert done and done[-1] == (size, size) and all(b == size for _, b in done)
    assert [a for a, _ in done] == sorted(set(a for a, _ in done))
    for bad in ((m["num_rows"] + 1, m["row_bytes"], m["checksum"]),
                (m["num_rows"], m["row_bytes"] * 2, m["checksum"]),
                (m["num_rows"], m["row_bytes"], m["checksum"] ^ 1)):
        with pytest.raises(engramstore.EngramError, match="changed since") as ei:
            p.read_into("t", rows, *bad)
        assert ei.value.errno == errno.EAGAIN

    class Stop(Exception):
        pass

    def stop(v: memoryview) -> None:
        raise Stop("enough")
    with pytest.raises(Stop):
        p.read_into("t", stop, m["num_rows"], m["row_bytes"], m["checksum"])
    with pytest.raises(engramstore.TableNotFoundError):
        p.read_into("nope", rows, 1, 1, 0)
    with pytest.raises(TypeError):
        p.read_into("t", None, m["num_rows"], m["row_bytes"], m["checksum"])


def test_direct_kv() -> None:
    """A kv made direct (its get_ranges keeps no view of out) reads into
    the protocol's own buffer: the table reads back exact; one that keeps
    a view of out past the call (here an array, which holds a view of its
    own) fails the read."""
    kv = MemKV()
    p = _engram._Publication(kv, "mem://direct", CHUNK_BYTES, 60000, 0, True)
    push(p, "t", 1)
    assert p.read("t") == rows_of(1).tobytes()
    kept: list[Any] = []
    for keep in (lambda out: np.frombuffer(out, np.uint8), lambda out: memoryview(out)[1:],
                 lambda out: out):

        class Keeping(MemKV):
            def get_ranges(self, *args: Any) -> None:
                super().get_ranges(*args)
                kept.append(keep(args[-1]))  # never read: its memory goes
        q = _engram._Publication(Keeping(), "mem://keeping", CHUNK_BYTES, 60000, 0, True)
        push(q, "t", 1)
        with pytest.raises(engramstore.EngramError, match="no view of out kept"):
            q.read("t")
        kept.clear()


def test_push_read(ctx: Ctx) -> None:
    p = ctx.p
    push(p, "t", 1)
    e = check_table(p, "t", 1)
    assert p.manifest("t")["nchunks"] == NCHUNKS
    assert ctx.f.pieces_left(name="t") == NCHUNKS
    # Create-only, whatever the rows.
    with pytest.raises(engramstore.TableExistsError):
        push(p, "t", 1)
    with pytest.raises(engramstore.TableExistsError):
        push(p, "t", 2, 5)
    assert epoch_of(p, "t") == e
    push(p, "v", 3, 5)  # one chunk, short
    check_table(p, "v", 3, 5)
    push(p, "w", 4, 1)
    check_table(p, "w", 4, 1)
    assert sorted(p.list()) == ["t", "v", "w"]
    check_absent(p, "nope")
    p.remove("v")
    check_absent(p, "v")
    with pytest.raises(engramstore.TableNotFoundError):
        p.remove("v")
    push(p, "v", 5)
    check_table(p, "v", 5)
    gc_settle(ctx, "v", epoch_of(p, "v"))


def race(work: Callable[[int], None], n: int) -> list[BaseException | None]:
    """Runs work(i) for i < n on n threads started together: what each raised."""
    out: list[BaseException | None] = [None] * n
    go = threading.Barrier(n)

    def run(i: int) -> None:
        go.wait()
        try:
            work(i)
        except BaseException as e:  # noqa: BLE001 - returned to the test
            out[i] = e

    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def test_racing_pushes(ctx: Ctx) -> None:
    """4 threads push one name: exactly one wins, the others raise
    TableExistsError; the table is the winner's and nothing of the losers
    is left after gc."""
    for rnd in range(4):
        name = f"r{rnd}"
        res = race(lambda i: push(ctx.p, name, 100 * rnd + i + 1), 4)
        winners = [i for i, e in enumerate(res) if e is None]
        assert len(winners) == 1, res
        assert all(isinstance(e, engramstore.TableExistsError) for e in res if e is not None), res
        gc_settle(ctx, name, check_table(ctx.p, name, 100 * rnd + winners[0] + 1))


def test_remove_race(ctx: Ctx) -> None:
    """A removal and a push of the name again, at once: the removal takes
    the table it read; the push either wins after it (the table is then
    exactly the push's) or raises TableExistsError (nothing listed)."""
    push(ctx.p, "x", 1000)
    for rnd in range(1, 9):
        if not epoch_of(ctx.p, "x"):
            push(ctx.p, "x", 1000 + rnd - 1)
        res = race(lambda i: ctx.p.remove("x") if i == 0 else push(ctx.p, "x", 1000 + rnd), 2)
        assert res[0] is None, res
        if res[1] is None:
            gc_settle(ctx, "x", check_table(ctx.p, "x", 1000 + rnd))
        else:
            assert isinstance(res[1], engramstore.TableExistsError), res
            check_absent(ctx.p, "x")
            gc_settle(ctx, "x", 0)


def test_killed_writer(ctx: Ctx) -> None:
    """A push killed at its step n (every kv call after its n-th fails),
    for n = 0, 1, ... until one ends before its kill: the killed push
    raises, and nothing of it shows; once its TTL passed, a gc leaves no
    record and no chunk of it, and the name can be pushed again."""
    p = ctx.pub(DEAD_TTL_MS)
    failed = []
    for n in itertools.count():
        assert n < 300
        name = f"k{n}"
        ctx.f.kill_after(n)
        try:
            push(p, name, n + 1)
            err: BaseException | None = None
        except engramstore.EngramError as e:
            err = e
        killed = ctx.f.killed
        ctx.f.revive()
        if epoch_of(p, name):
            # Published: whole, and said so (or said it could not tell).
            assert err is None or isinstance(err, engramstore.InDoubtError), err
            check_table(p, name, n + 1)
        else:
            assert err is not None
            check_absent(p, name)
            failed.append(name)
        if killed == 0:
            assert err is None
            break
    assert n > 5 and failed
    print(f"a push took {n} steps")
    time.sleep(DEAD_TTL_MS / 1e3)
    for i in range(n + 1):
        name = f"k{i}"
        epoch = epoch_of(p, name)
        gc_settle(ctx, name, epoch)
        if epoch:
            check_table(p, name, i + 1)
            continue
        push(p, name, i + 100)
        check_table(p, name, i + 100)


def test_lost_publish(ctx: Ctx) -> None:
    """The publication ran and its reply was lost: the push finds out that
    it was published, and succeeds; the table is whole."""
    ctx.f.lost(*PUBLICATION)
    push(ctx.p, "t", 1)
    assert ctx.f.fired == 1
    gc_settle(ctx, "t", check_table(ctx.p, "t", 1))


def test_lost_publish_rewrite_fails(ctx: Ctx) -> None:
    """The publication's reply is lost, the record then shows it ran (the
    manifest), and writing it again (for the sync to cover it) fails: the
    push cannot tell whether the replicas have it, and says
    ENGRAM_EINDOUBT; the table is published and whole.  (resolve() freed
    the record read twice here, before 623096f.)"""
    ctx.f.lost(*PUBLICATION)
    ctx.f.fail("rec_cas", MANIFEST_HEAD)  # the manifest written again, by resolve()
    with pytest.raises(engramstore.InDoubtError):
        push(ctx.p, "t", 1)
    assert ctx.f.fired == 2
    ctx.f.revive()
    gc_settle(ctx, "t", check_table(ctx.p, "t", 1))


def test_deferred_publish(ctx: Ctx) -> None:
    """The publication held back (still in flight) when the push asks what
    became of it: the push settles it as not published and fails; landing
    afterwards it must not show the table, whether the name is free then
    or was pushed again, and nothing is left after gc."""
    ctx.f.defer(*PUBLICATION)
    with pytest.raises(engramstore.EngramError) as ei:
        push(ctx.p, "t", 1)
    assert not isinstance(ei.value, engramstore.InDoubtError)
    check_absent(ctx.p, "t")
    assert ctx.f.release() != DONE
    check_absent(ctx.p, "t")
    gc_settle(ctx, "t", 0)
    push(ctx.p, "t", 2)
    gc_settle(ctx, "t", check_table(ctx.p, "t", 2))

    # Landing after the name was pushed again.
    ctx.f.defer(*PUBLICATION)
    with pytest.raises(engramstore.EngramError):
        push(ctx.p, "u", 1)
    check_absent(ctx.p, "u")
    push(ctx.p, "u", 2)
    e = check_table(ctx.p, "u", 2)
    assert ctx.f.release() != DONE
    assert check_table(ctx.p, "u", 2) == e
    gc_settle(ctx, "u", e)


def test_remove_lost(ctx: Ctx) -> None:
    """A removal whose reply is lost: the table ends up removed, and a gc
    leaves nothing of it; one held back that lands after the name was
    pushed again must not remove the new table."""
    p = ctx.p
    push(p, "t", 1)
    ctx.f.lost(*REMOVAL)
    try:
        p.remove("t")
    except engramstore.InDoubtError:
        pass
    assert ctx.f.fired == 1
    check_absent(p, "t")
    gc_settle(ctx, "t", 0)
    push(p, "t", 2)
    check_table(p, "t", 2)

    # Lost, and nothing after it answers either.
    ctx.f.lost(*REMOVAL, then_kill=True)
    with pytest.raises(engramstore.EngramError):
        p.remove("t")
    ctx.f.revive()
    check_absent(p, "t")
    gc_settle(ctx, "t", 0)

    # Held back.
    push(p, "u", 1)
    ctx.f.defer(*REMOVAL)
    try:
        p.remove("u")
    except engramstore.EngramError:
        p.remove("u")  # it gave up without it: once more
    assert len(ctx.f.deferred) == 1
    check_absent(p, "u")
    push(p, "u", 2)
    e = check_table(p, "u", 2)
    assert ctx.f.release() != DONE
    assert check_table(p, "u", 2) == e
    gc_settle(ctx, "u", e)


class Stalls:
    """Makes the push of a table stall after writing its chunk `index`,
    until go(name): installed on the decorator's piece_put."""

    def __init__(self, f: FaultKV, at: dict[str, int]) -> None:
        self.put, self.at = f.piece_put, at
        self.started = {n: threading.Event() for n in at}
        self.going = {n: threading.Event() for n in at}
        f.piece_put = self  # type: ignore[method-assign]

    def __call__(self, *args: Any) -> Any:
        r = self.put(*args)
        if self.at.get(args[0]) == args[3]:
            self.started[args[0]].set()
            self.going[args[0]].wait(WAIT_S)
        return r

    def go(self, name: str) -> None:
        self.going[name].set()


def in_thread(fn: Callable[[], None]) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 - checked by the caller
            errors.append(e)

    th = threading.Thread(target=run)
    th.start()
    return th, errors


def test_gc_live(ctx: Ctx) -> None:
    """gc keeps a live push (its record and its chunks), and settles a dead
    one once its TTL passed; the live push then publishes.  A push that
    stalls for longer than its TTL is taken for dead: it publishes nothing
    and, once it found out, nothing of it is left."""
    live, dead = ctx.p, ctx.pub(DEAD_TTL_MS)
    stalls = Stalls(ctx.f, {"live": 1, "stall": 0})
    th, errors = in_thread(lambda: push(live, "live", 5))
    th2: threading.Thread | None = None
    errors2: list[BaseException] = []
    try:
        assert stalls.started["live"].wait(WAIT_S)
        # A push killed after its record and two chunks (the ops: gc's
        # listing and clock, the claim's clock and swap, two chunks).
        ctx.f.kill_after(6)
        with pytest.raises(engramstore.EngramError):
            push(dead, "dead", 6)
        ctx.f.revive()
        assert records_of(ctx, "dead")[1] == 1
        th2, errors2 = in_thread(lambda: push(dead, "stall", 8))
        assert stalls.started["stall"].wait(WAIT_S)
        time.sleep(DEAD_TTL_MS / 1e3)
        t0 = time.monotonic()
        while True:
            ctx.p.gc()
            assert records_of(ctx, "live") == (0, 1)
            assert ctx.f.pieces_left(name="live") == 2
            if settled(ctx, "dead", 0) and records_of(ctx, "stall") == (0, 0):
                break
            assert time.monotonic() - t0 < WAIT_S
            time.sleep(0.02)
        check_absent(ctx.p, "dead")
        check_absent(ctx.p, "stall")
    finally:
        stalls.go("live")
        stalls.go("stall")
        th.join()
        if th2 is not None:
            th2.join()
    assert not errors, errors
    assert len(errors2) == 1 and isinstance(errors2[0], engramstore.EngramError), errors2
    check_absent(ctx.p, "stall")
    gc_settle(ctx, "stall", 0)
    gc_settle(ctx, "live", check_table(ctx.p, "live", 5))
    push(live, "dead", 7)
    gc_settle(ctx, "dead", check_table(ctx.p, "dead", 7))
    push(live, "stall", 9)
    gc_settle(ctx, "stall", check_table(ctx.p, "stall", 9))


OPS = ("rec_get", "rec_cas", "rec_list", "now_ms", "sync", "piece_put", "piece_expire",
       "piece_del", "get_ranges")


def random_faults(seed: int) -> None:
    """Pushes, removals and gcs of two names on MemKV, each under 0 to 3
    faults of random kinds (a fail, a lost reply, a write held back and
    landed later in random order, a kill after one fired), TTL 200 ms:
    whatever shows is a push that did not fail (and read back whole), a
    push that succeeded shows at once, a table removed never shows again,
    and in the end a gc leaves nothing but the tables listed."""
    rng = random.Random(seed)
    c = Ctx(MemKV(), "mem")
    p, f = c.pub(200), c.f
    seeds: dict[str, dict[int, str]] = {"a": {}, "b": {}}  # name -> {seed: ok | doubt | failed}
    removed: set[tuple[str, int]] = set()

    def check() -> None:
        for n in seeds:
            try:
                data, epoch = p.read(n), p.manifest(n)["epoch"]
            except engramstore.TableNotFoundError:
                continue
            who = [s for s in seeds[n] if rows_of(s).tobytes() == data]
            assert who and seeds[n][who[0]] != "failed", (seed, n, who)
            assert (n, epoch) not in removed, (seed, n)

    for step in range(12):
        for _ in range(rng.randint(0, 3)):
            kind = rng.choice(["fail", "lost", "defer"])
            op = rng.choice(WRITES if kind == "defer" else OPS)
            prefix = rng.choice([None, MANIFEST_HEAD, CLOSED_HEAD, PENDING_HEAD]) \
                if op == "rec_cas" else None
            getattr(f, kind)(op, prefix, skip=rng.randint(0, 3), then_kill=rng.random() < 0.1)
        name, act, s = rng.choice("ab"), rng.random(), 1000 * seed + step
        try:
            if act < 0.55:
                seeds[name][s] = "failed"
                try:
                    push(p, name, s)
                except engramstore.InDoubtError:
                    seeds[name][s] = "doubt"
                    raise
                seeds[name][s] = "ok"
                f.revive()
                assert p.read(name) == rows_of(s).tobytes(), (seed, step)
            elif act < 0.8:
                epoch = epoch_of(p, name)
                p.remove(name)
                removed.add((name, epoch))
                f.revive()
                assert listed(p, name) == 0, (seed, step)
            else:
                p.gc()
        except engramstore.EngramError:
            pass
        f.revive()
        if f.deferred and rng.random() < 0.5:
            f.deferred.insert(0, f.deferred.pop(rng.randrange(len(f.deferred))))
            f.release()
        check()
    while f.deferred:
        f.release()
        check()
    time.sleep(0.25)  # past the TTL: what is left is a gc's
    end_check(c)


def test_random_faults() -> None:
    for seed in range(40):
        random_faults(seed)


# ---- the Mooncake store's own guarantees (engramstore._mckv) ---------------

@pytest.fixture
def mckv(mc_client: Any) -> Any:
    """make() -> a new MooncakeKV of one namespace of the test's own, each
    with caches of its own (another process, as the store sees it)."""
    from engramstore._mckv import MooncakeKV
    ns = f"mckv{next(_ids)}-{time.time_ns() % 10**9}"
    made: list[Any] = []

    def make() -> Any:
        made.append(MooncakeKV(mc_client, ns))
        return made[-1]

    yield make
    for kv in made:
        kv.close()


def test_mckv_swaps_are_atomic(mckv: Any) -> None:
    """4 writers (each its own MooncakeKV) add 1 to a counter by swaps,
    20 times each: every increment lands exactly once, whatever the
    interleaving; a writer that deletes and puts the record again each
    time (a D version, and versions removed) keeps the count too."""
    kvs = [mckv() for _ in range(4)]
    assert kvs[0].rec_cas("n", None, b"0") == DONE
    assert kvs[0].rec_cas("m", None, b"0") == DONE

    def add(i: int) -> None:
        kv = kvs[i]
        for _ in range(20):
            for name in ("n", "m"):
                while True:
                    cur = kv.rec_get(name)
                    if cur is None:
                        continue  # "m" between its delete and its put again
                    new = str(int(cur) + 1).encode()
                    if name == "m":
                        # Delete, then put again: only the deleter can put it back.
                        if kv.rec_cas(name, cur, None) != DONE:
                            continue
                        assert kv.rec_cas(name, None, new) == DONE
                        break
                    if kv.rec_cas(name, cur, new) == DONE:
                        break

    assert race(add, 4) == [None] * 4
    fresh = mckv()
    assert fresh.rec_get("n") == b"80" and fresh.rec_get("m") == b"80"
    assert fresh.rec_list() == [("m", b"80"), ("n", b"80")]


def test_mckv_versions(mckv: Any, mc_client: Any) -> None:
    """A record put, changed and deleted over and over: a new MooncakeKV
    (no cache) finds its state from the milestones, the versions of the
    deleted cycles are removed, and the names index lists it once."""
    from engramstore._mckv import W
    kv = mckv()
    for i in range(60):
        assert kv.rec_cas("a", None, b"x%d" % i) == DONE
        assert kv.rec_cas("a", b"x%d" % i, b"y%d" % i) == DONE
        if i % 2:
            assert kv.rec_cas("a", b"y%d" % i, None) == DONE
        else:
            fresh = mckv()
            assert fresh.rec_get("a") == b"y%d" % i
            assert fresh.rec_cas("a", b"y%d" % i, None) == DONE
    top = 60 * 3 - 1
    fresh = mckv()
    assert fresh.rec_get("a") is None and fresh.rec_list() == []
    keys = [f"{kv.ns}/.rec/a/{v}" for v in range(top + 2)]
    have = [v for v, r in enumerate(mc_client.batch_is_exist(keys)) if r == 1]
    assert have[-1] == top  # the newest is kept
    assert all(v % W == 0 for v in have if v < top - top % W)  # below its window: milestones
    assert fresh.rec_cas("a", None, b"z") == DONE
    assert mckv().rec_list() == [("a", b"z")]
    assert mc_client.batch_is_exist([f"{kv.ns}/.names/0", f"{kv.ns}/.names/1"]) == [1, 0]


def test_mckv_reads_are_exact(mckv: Any) -> None:
    """A reader (its own MooncakeKV) while a writer puts, changes and
    deletes a record over and over, removing old versions: every value
    read is one the record held, never an older one than a value read
    before (reads are linearizable)."""
    w, r = mckv(), mckv()
    stop = threading.Event()
    seen: list[int] = []

    def write() -> None:
        seq = 0
        try:
            # Until the reader saw values enough (or a bound, for a reader
            # that is never scheduled); the record is left holding one.
            while len(seen) < 50 and seq < 20000:
                assert w.rec_cas("a", None, b"%d" % seq) == DONE
                assert w.rec_cas("a", b"%d" % seq, b"%d" % (seq + 1)) == DONE
                assert w.rec_cas("a", b"%d" % (seq + 1), None) == DONE
                seq += 2
            assert w.rec_cas("a", None, b"%d" % seq) == DONE
        finally:
            stop.set()

    def read() -> None:
        while True:
            last = stop.is_set()
            v = r.rec_get("a")
            if v is not None:
                seen.append(int(v))
            if last:
                return

    assert race(lambda i: write() if i == 0 else read(), 2) == [None, None]
    assert seen and seen == sorted(seen)


class KilledClient:
    """A Mooncake client that forwards every call, until kill_after(n):
    the next n calls go through, every one after them raises
    ConnectionResetError (a writer killed between any two of its calls to
    the store, not only between two kv operations).  Registrations of
    buffers always go through: a process that dies takes them along."""

    def __init__(self, mc: Any) -> None:
        self._mc = mc
        self.left: int | None = None
        self.killed = 0
        self.put_keys: set[str] = set()  # every key a put through it named

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._mc, name)
        if not callable(attr) or name in ("register_buffer", "unregister_buffer"):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            if self.left is not None:
                if self.left == 0:
                    self.killed += 1
                    raise ConnectionResetError(f"{name}: the writer was killed (test)")
                self.left -= 1
            if name in ("put", "batch_put_from"):
                self.put_keys.update([args[0]] if name == "put" else args[0])
            return attr(*args, **kw)
        return call


def test_mckv_killed_inside(mc_client: Any) -> None:
    """A push through MooncakeKV killed between any two of its calls to
    Mooncake (within a swap, between a version's put and its read-back,
    within a removal of old versions, ...), for n = 0, 1, ... until one
    ends before its kill: nothing half shows to another process, and once
    the TTL passed, that process's gc leaves no record and no chunk of it,
    and the name can be pushed again."""
    from engramstore._mckv import MooncakeKV
    ns = f"mckv{next(_ids)}-{time.time_ns() % 10**9}"
    kc = KilledClient(mc_client)
    writer, other = MooncakeKV(kc, ns), MooncakeKV(mc_client, ns)
    p = _engram._Publication(writer, ns, CHUNK_BYTES, DEAD_TTL_MS)
    q = _engram._Publication(other, ns, CHUNK_BYTES, DEAD_TTL_MS)
    try:
        for n in itertools.count():
            assert n < 1000
            name = f"k{n}"
            kc.left, kc.killed = n, 0
            try:
                push(p, name, n + 1)
                err: BaseException | None = None
            except engramstore.EngramError as e:
                err = e
            killed, kc.left = kc.killed, None
            if epoch_of(q, name):
                assert err is None or isinstance(err, engramstore.InDoubtError), err
                check_table(q, name, n + 1)
            else:
                assert err is not None
                check_absent(q, name)
            if killed == 0:
                assert err is None
                break
        print(f"a push took {n} calls to Mooncake")
        time.sleep(DEAD_TTL_MS / 1e3)
        q.gc()
        published = {(m, q.manifest(m)["epoch"]) for m in q.list()}
        assert all(not v.startswith(PENDING_HEAD) for _, v in other.rec_list())
        # No chunk is left but those of the tables published.
        left = [k for k in kc.put_keys if "/.chunk/" in k and
                (k.split("/")[2], int(k.split("/")[3], 16)) not in published]
        assert not any(mc_client.batch_is_exist(left) if left else ())
        for i in range(n + 1):
            if not epoch_of(q, f"k{i}"):
                push(p, f"k{i}", i + 100)
                check_table(q, f"k{i}", i + 100)
    finally:
        writer.close()
        other.close()
