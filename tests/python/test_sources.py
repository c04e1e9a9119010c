"""Tables served by Python code (TableStore.add_source): exact rows with and
without the row cache, deduplicated and validated rows handed to the
callable, failures that leave the output untouched and cache nothing, the
callable's exception as the cause, and every bad argument."""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import engramstore
from esutil import expected, make_rows, run_in_threads, sentinel

N, R = 500, 264


class Source:
    """A read_rows that serves `rows` and records what it was asked."""

    def __init__(self, rows):
        self.rows = rows
        self.calls = []
        self.fail = None  # an exception to raise on the next call
        self.lock = threading.Lock()

    def __call__(self, rows, out):
        assert isinstance(rows, np.ndarray) and rows.dtype == np.uint64 and rows.ndim == 1
        assert isinstance(out, np.ndarray) and out.dtype == np.uint8
        assert out.shape == (len(rows), self.rows.shape[1]) and out.flags.writeable
        with self.lock:
            self.calls.append(rows.copy())
            fail, self.fail = self.fail, None
        if fail is not None:
            out[:] = 0x11  # written, but the call fails: none of it may be used
            raise fail
        out[:] = self.rows[rows.astype(np.int64)]


@pytest.fixture
def mem():
    st = engramstore.EngramStore(local_dir=None, cache_bytes=8 << 20)
    yield st
    st.close()


@pytest.mark.parametrize("cache_bytes", [0, 1 << 20])
def test_served_exactly(mem, cache_bytes):
    rows = make_rows(N, R, seed=3)
    src = Source(rows)
    mem.add_source("s", {"num_rows": N, "row_bytes": R}, src, cache_bytes=cache_bytes)
    mem.bind("m", rows)
    rng = np.random.default_rng(1)
    for rnd in range(3):
        ids = rng.integers(0, 60 if rnd else N, (200, 3), dtype=np.int64)
        ids[::13, 1] = -1
        out = sentinel((200, 3, R))
        calls = len(src.calls)
        mem.lookup(["s", "m", "s"], ids, out)
        np.testing.assert_array_equal(out, expected({"s": rows, "m": rows}, ["s", "m", "s"], ids))
        new = src.calls[calls:]
        # At most one call, with distinct, valid rows.
        assert len(new) <= 1
        for c in new:
            assert len(np.unique(c)) == len(c) and c.max() < N
    cs = mem.stats()["cache"]
    assert cs["tables"] == 1 and cs["dedup"] > 0 and cs["read_errors"] == 0
    assert cs["reads"] == sum(len(c) for c in src.calls)
    assert (cs["hits"] > 0) == (cache_bytes > 0)
    assert cs["cache_bytes"] + cs["staging_bytes"] <= cs["budget_bytes"]
    assert mem.get_table_spec("s")["kind"] == "source"


@pytest.mark.parametrize("keep_all", [False, True])
def test_admission(keep_all):
    """A full cache keeps a row only once it was asked for twice lately, so
    a scan of rows asked for once leaves the hot rows cached; with
    cache_keep_all=True every row read is kept and the scan flushes them."""
    n = 20000
    rows = make_rows(n, R, seed=9)
    src = Source(rows)
    with engramstore.EngramStore(local_dir=None, cache_keep_all=keep_all) as st:
        st.add_source("s", {"num_rows": n, "row_bytes": R}, src, cache_bytes=64 << 10)
        slots = st.stats()["cache"]["slots"]
        assert 100 <= slots <= 250

        def ask(ids):
            ids = np.asarray(ids, np.int64).reshape(-1, 1)
            out = sentinel((len(ids), 1, R))
            st.lookup(["s"], ids, out)
            np.testing.assert_array_equal(out, expected({"s": rows}, ["s"], ids))
            return st.stats()["cache"]

        hot = np.arange(50)
        for _ in range(3):
            ask(hot)
        before = ask(np.arange(1000, 1000 + 4 * slots))  # a scan, each row once
        after = ask(hot)
        hot_hits = after["hits"] - before["hits"]
        if keep_all:
            assert before["not_kept"] == 0 and hot_hits <= 5
        else:
            assert before["not_kept"] >= 3 * slots and hot_hits >= 45
            # Twice in one lookup: kept at once, then hits.
            c0 = ask(np.repeat(np.arange(5000, 5040), 2))
            c1 = ask(np.arange(5000, 5040))
            assert c0["not_kept"] - after["not_kept"] <= 2 and c1["hits"] - c0["hits"] >= 30


def test_keep_all_needs_a_mooncake_client_in_the_layer_api():
    cfg = engramstore.EngramStoreConfig([10], 8)
    with pytest.raises(TypeError, match="cache_keep_all"):
        engramstore.EngramStore({0: cfg}, None, cache_keep_all=True)


def test_failure_leaves_output_and_cache(mem):
    rows = make_rows(N, R, seed=4)
    src = Source(rows)
    mem.add_source("s", (N, R), src, cache_bytes=1 << 20)
    ids = np.arange(40, dtype=np.int64).reshape(40, 1)
    src.fail = KeyError("row 17 is on a node that is down")
    out = sentinel((40, 1, R))
    with pytest.raises(engramstore.EngramError) as ei:
        mem.lookup(["s"], ids, out)
    assert ei.value.errno == 5  # EIO
    assert "table 's'" in str(ei.value) and "KeyError" in str(ei.value)
    assert isinstance(ei.value.__cause__, KeyError)
    assert (out == 0xA5).all()  # untouched
    hits = mem.stats()["cache"]["hits"]
    mem.lookup(["s"], ids, out)  # read again: nothing was cached
    assert mem.stats()["cache"]["hits"] == hits
    np.testing.assert_array_equal(out[:, 0], rows[:40])
    mem.lookup(["s"], ids, out)
    assert mem.stats()["cache"]["hits"] == hits + 40


def test_bad_ids_never_reach_the_source(mem):
    src = Source(make_rows(N, R, seed=5))
    mem.add_source("s", (N, R), src)
    out = sentinel((2, 1, R))
    with pytest.raises(engramstore.BadIdError):
        mem.lookup(["s"], np.array([[3], [N]], dtype=np.int64), out)
    assert src.calls == [] and (out == 0xA5).all()


def test_reentry_is_refused(mem):
    rows = make_rows(N, R, seed=6)
    seen = {}

    def nested(r, out):
        for what, fn in (("lookup", lambda: mem.lookup(["s"], np.zeros((1, 1), np.int64),
                                                      sentinel((1, 1, R)))),
                         ("close", mem.close)):
            try:
                fn()
            except engramstore.StateError as e:
                seen[what] = str(e)
        out[:] = rows[r.astype(np.int64)]

    mem.add_source("s", (N, R), nested)
    out = sentinel((1, 1, R))
    mem.lookup(["s"], np.array([[9]], dtype=np.int64), out)
    np.testing.assert_array_equal(out[0, 0], rows[9])
    assert "read_rows" in seen["lookup"] and "read_rows" in seen["close"]
    assert not mem.closed


def test_threads(mem):
    rows = make_rows(N, R, seed=8)
    src = Source(rows)
    mem.add_source("s", (N, R), src, cache_bytes=64 << 10)

    def work(seed):
        rng = np.random.default_rng(seed)
        for _ in range(30):
            ids = rng.integers(0, N, (64, 1), dtype=np.int64)
            out = sentinel((64, 1, R))
            mem.lookup(["s"], ids, out)
            np.testing.assert_array_equal(out[:, 0], rows[ids[:, 0]])

    assert run_in_threads(work) == []


def test_bad_arguments(mem, local_dir):
    src = Source(make_rows(N, R, seed=9))
    with pytest.raises(TypeError, match="read_rows"):
        mem.add_source("s", (N, R), "not callable")
    with pytest.raises(TypeError, match="spec"):
        mem.add_source("s", [N, R], src)
    with pytest.raises(ValueError, match="spec"):
        mem.add_source("s", {"num_rows": N}, src)
    with pytest.raises(ValueError, match="row_pitch"):
        mem.add_source("s", (N, R, R + 8), src)
    with pytest.raises(engramstore.SpecError):
        mem.add_source("s", (0, R), src)
    with pytest.raises(engramstore.SpecError):
        mem.add_source(".s", (N, R), src)
    mem.add_source("s", (N, R), src)
    with pytest.raises(engramstore.TableExistsError):
        mem.add_source("s", (N, R), src)
    with pytest.raises(engramstore.EngramError) as ei:
        mem.remove("s")
    assert ei.value.errno == engramstore.EBOUND
    # A name stored in the namespace is taken.
    with engramstore.EngramStore(namespace="ns", local_dir=local_dir) as st:
        st.populate("t", make_rows(4, R, seed=1))
        with pytest.raises(engramstore.TableExistsError):
            st.add_source("t", (N, R), src)
    mem.close()
    with pytest.raises(engramstore.StoreClosedError):
        mem.add_source("x", (N, R), src)


def test_callable_released_at_close():
    import gc
    import weakref

    class Fn:
        def __call__(self, rows, out):
            out[:] = 0

    fn = Fn()
    ref = weakref.ref(fn)
    st = engramstore.EngramStore(local_dir=None)
    st.add_source("s", (10, 8), fn)
    del fn
    gc.collect()
    assert ref() is not None  # the store holds it
    st.close()
    gc.collect()
    assert ref() is None


def refused_then_served(st, ids, out, cause, fix, want):
    """Looks ids up in table "s" and expects a failure (EIO) caused by a
    `cause`, with out untouched; then runs fix() and expects out[:, 0] to
    be served as `want`, with no cache hit: nothing of the failed call was
    kept.  Returns the failure."""
    with pytest.raises(engramstore.EngramError) as ei:
        st.lookup(["s"], ids, out)
    assert ei.value.errno == 5 and isinstance(ei.value.__cause__, cause)
    assert (out == 0xA5).all()
    hits = st.stats()["cache"]["hits"]
    fix()
    st.lookup(["s"], ids, out)
    np.testing.assert_array_equal(out[:, 0], want)
    assert st.stats()["cache"]["hits"] == hits  # nothing of the failed call was kept
    return ei.value


@pytest.mark.parametrize("row_bytes", [R, 5, 1 << 24])
@pytest.mark.parametrize("grouped", [False, True])
def test_rows_left_unwritten_are_an_error(row_bytes, grouped):
    # A row the callable leaves unwritten fails the lookup, its cause a
    # ValueError naming the row, rather than being served (and cached) as
    # whatever out started with: the output is untouched, nothing cached.
    n = 3 if row_bytes > 1 << 20 else 40
    rows = make_rows(n, row_bytes, seed=24)
    skip = {n - 1}

    def read_rows(ids, out, *tables):
        for i, r in enumerate(ids.astype(np.int64)):
            if r not in skip:
                out[i] = rows[r]
    st = engramstore.EngramStore(local_dir=None, cache_bytes=8 << 20)
    try:
        st.add_source("s", (n, row_bytes), read_rows, cache_bytes=0 if n == 3 else 1 << 20,
                      group="g" if grouped else None)
        ids = np.arange(n, dtype=np.int64).reshape(n, 1)
        out = sentinel((n, 1, row_bytes))
        err = refused_then_served(st, ids, out, ValueError, skip.clear, rows)
        which = f"row {n - 1} (of table 0 of the group)" if grouped else f"row {n - 1}"
        assert str(err) == (f"table 's': read_rows left {which} unwritten: it must fill "
                            "every row of out (a source that cannot serve a row must "
                            "raise)")
        assert st.stats()["cache"]["hits"] == 0
    finally:
        st.close()


def test_a_row_that_holds_what_out_starts_with_is_served(mem):
    # out starts filled with a pattern, and a row still holding it whole
    # after the call is asked for again (out then holding another): a
    # table row that is that very pattern is served, not refused.
    n = 12
    rows = make_rows(n, R, seed=25)
    calls = []

    def read_rows(ids, out):
        if not calls:
            rows[5] = out[0]  # what out started with
        calls.append(ids.copy())
        out[:] = rows[ids.astype(np.int64)]
    mem.add_source("s", (n, R), read_rows, cache_bytes=1 << 20)
    out = sentinel((n, 1, R))
    mem.lookup(["s"], np.arange(n, dtype=np.int64).reshape(n, 1), out)
    np.testing.assert_array_equal(out[:, 0], rows)
    assert [c.tolist() for c in calls] == [list(range(n)), [5]]
    assert len(set(rows[5].tobytes())) > 1  # a pattern, not one byte repeated


class Shrinker:
    """A read_rows that fills `out`, then reaches the bytearray behind it,
    releases every view of it it can reach and empties it: the library must
    not copy from memory the bytearray no longer has.  Once `good` is set it
    serves the rows and leaves `out` alone."""

    def __init__(self, rows):
        self.rows = rows
        self.good = False

    def __call__(self, ids, out):
        want = self.rows[np.asarray(ids).astype(np.int64)]
        if isinstance(out, np.ndarray):
            out[:] = want
            if self.good:
                return None
            # add_source's wrapper made `out` from the memoryview it got:
            # release numpy's view and the wrapper's.
            buf = out.base.obj
            out.base.release()
            sys._getframe(1).f_locals["out"].release()
        else:  # Store._add_source: memoryviews, as without numpy
            a = np.asarray(out)
            a[:] = want
            del a
            if self.good:
                return None
            buf = out.obj
            out.release()
        del buf[:]  # shrinks it to nothing, freeing its memory
        return None


@pytest.mark.parametrize("row_bytes", [R, 1 << 24])
@pytest.mark.parametrize("views", ["numpy", "memoryview"])
def test_read_rows_cannot_shrink_out(row_bytes, views):
    # The bytearray behind `out` stays exported to the library for the whole
    # call, so emptying it fails in the callable (BufferError), whatever
    # views of it the callable released, and the lookup fails with it as
    # the cause: output untouched, nothing cached.
    n = 3
    rows = make_rows(n, row_bytes, seed=21)
    src = Shrinker(rows)
    cache = 1 << 20 if row_bytes == R else 0
    st = engramstore.EngramStore(local_dir=None, cache_bytes=8 << 20)
    try:
        if views == "numpy":
            st.add_source("s", (n, row_bytes), src, cache_bytes=cache)
        else:
            st._add_source("s", n, row_bytes, src, cache)
        ids = np.array([[0], [2]], dtype=np.int64)
        out = sentinel((2, 1, row_bytes))
        err = refused_then_served(st, ids, out, BufferError,
                                  lambda: setattr(src, "good", True), rows[[0, 2]])
        assert "BufferError" in str(err)
    finally:
        st.close()


@pytest.mark.parametrize("ret", ["rows", "count", "false", "copy of out"])
def test_read_rows_must_return_none(mem, ret):
    # None says every row of `out` is written; a callable that returns
    # anything else (its rows instead of writing them, a count, False) is
    # refused with a TypeError rather than served as the zeros `out` starts
    # with, and nothing of the call is used or cached.
    rows = make_rows(N, R, seed=22)
    fixed = []

    def read_rows(ids, out):
        got = rows[ids.astype(np.int64)]
        if fixed:
            out[:] = got
            return None
        if ret == "rows":
            return got
        out[:] = got
        return {"count": len(ids), "false": False, "copy of out": out.copy()}[ret]

    mem.add_source("s", (N, R), read_rows, cache_bytes=1 << 20)
    ids = np.arange(8, dtype=np.int64).reshape(8, 1)
    out = sentinel((8, 1, R))
    err = refused_then_served(mem, ids, out, TypeError, lambda: fixed.append(True), rows[:8])
    assert "must fill out and return None" in str(err)


@pytest.mark.parametrize("views", ["numpy", "memoryview"])
def test_read_rows_may_return_out(mem, views):
    # np.take(table, ids, axis=0, out=out) returns out: that is None's
    # meaning, and served.
    rows = make_rows(N, R, seed=23)

    def read_rows(ids, out):
        if isinstance(out, np.ndarray):
            return np.take(rows, ids.astype(np.int64), axis=0, out=out)
        a = np.asarray(out)
        np.take(rows, np.asarray(ids).astype(np.int64), axis=0, out=a)
        return out

    if views == "numpy":
        mem.add_source("s", (N, R), read_rows)
    else:
        mem._add_source("s", N, R, read_rows, 0)
    ids = np.array([[4], [9], [4]], dtype=np.int64)
    out = sentinel((3, 1, R))
    mem.lookup(["s"], ids, out)
    np.testing.assert_array_equal(out[:, 0], rows[[4, 9, 4]])


def test_group_reads_its_tables_in_one_call(mem):
    # Tables added with one group (same callable, same row size) are read
    # together: one call per lookup, with each row's table index.
    a, b, c = make_rows(N, R, seed=11), make_rows(200, R, seed=12), make_rows(50, 8, seed=13)
    rows_of = {0: a, 1: b}
    calls = []

    def grouped(rows, tables_or_out, *rest):
        if not rest:  # the 8-byte table: a group of its own, one table
            raise AssertionError("a grouped table must get its table indices")
        out, tables = tables_or_out, rest[0]
        assert tables.dtype == np.uint32 and tables.shape == rows.shape
        calls.append((rows.copy(), tables.copy()))
        for i, (r, t) in enumerate(zip(rows.astype(np.int64), tables)):
            out[i] = (rows_of[int(t)] if out.shape[1] == R else c)[r]

    assert mem.add_source("a", (N, R), grouped, group="g") == 0
    assert mem.add_source("b", (200, R), grouped, group="g", cache_bytes=64 << 10) == 1
    assert mem.add_source("c", (50, 8), grouped, group="g") == 0  # another row size
    with pytest.raises(ValueError, match="share one callable"):
        mem.add_source("d", (N, R), Source(a), group="g")
    with pytest.raises(engramstore.TableExistsError):
        mem.add_source("a", (N, R), grouped, group="g")
    assert mem.add_source("e", (N, R), grouped, group="g") == 2  # the failed add took no index
    rows_of[2] = a
    ids = np.array([[5, 7, 5], [9, 199, 5], [5, 7, 2]], np.int64)
    out = sentinel((3, 3, R))
    mem.lookup(["a", "b", "e"], ids, out)
    np.testing.assert_array_equal(out, expected({"a": a, "b": b, "e": a}, ["a", "b", "e"], ids))
    assert len(calls) == 1
    got = sorted(zip(calls[0][1].tolist(), calls[0][0].tolist()))
    assert got == [(0, 5), (0, 9), (1, 7), (1, 199), (2, 2), (2, 5)]  # distinct (table, row)
    out8 = sentinel((2, 1, 8))
    mem.lookup(["c"], np.array([[3], [49]], np.int64), out8)
    np.testing.assert_array_equal(out8[:, 0], c[[3, 49]])
