"""Lookups ahead of time (TableStore.lookup_async, PendingLookup) and tokens to
rows in one call (NgramHasher.lookup and .submit).  No assertion depends on
timing: a lookup is held running by a source that waits for an Event, on a
store with one lookup thread, so what is queued behind it stays queued."""
from __future__ import annotations

import gc
import os
import signal
import threading

import numpy as np
import pytest

import engramstore as es

R = 16


@pytest.fixture
def mem():
    # One lookup thread: a lookup queued behind a held one stays queued.
    st = es.TableStore(local_dir=None, threads=1)
    rows = np.random.default_rng(3).integers(0, 256, (100, R), np.uint8)
    st.bind("t", rows)
    yield st, rows
    st.close()


def held_source(st, rows):
    """Table "s" served by a callable that blocks until `go` is set;
    `entered` is set when a lookup is inside it."""
    entered, go = threading.Event(), threading.Event()

    def read_rows(ids, out):
        entered.set()
        go.wait()
        out[:] = rows[np.asarray(ids)]

    st.add_source("s", (len(rows), R), read_rows)
    return entered, go


def test_lookup_async(mem):
    st, rows = mem
    rng = np.random.default_rng(1)
    jobs = []
    for _ in range(12):
        ids = rng.integers(0, 100, (30, 2))
        out = np.zeros((30, 2, R), np.uint8)
        jobs.append((st.lookup_async(["t", "t"], ids, out), ids, out))
    for p, ids, out in reversed(jobs):
        p.wait()
        assert p.done()
        assert (out == rows[ids]).all()
    # Offsets and zero_dead, as lookup() takes them.
    ids = np.array([[-1, 12], [5, 109]])
    out = np.full((2, 2, R), 9, np.uint8)
    st.lookup_async(["t", "t"], ids, out, np.array([0, 10]), zero_dead=True).wait()
    assert (out[0, 0] == 0).all() and (out[0, 1] == rows[2]).all()
    assert (out[1, 0] == rows[5]).all() and (out[1, 1] == rows[99]).all()


def test_bad_id_at_wait(mem):
    st, rows = mem
    out = np.full((3, 1, R), 7, np.uint8)
    p = st.lookup_async(["t"], np.array([[4], [100], [5]]), out)
    with pytest.raises(es.BadIdError, match=r"ids\[1\]\[0\] = 100") as e:
        p.wait()
    assert e.value.position == (1, 0) and e.value.id == 100
    assert (out == 7).all()
    with pytest.raises(es.StateError, match="already"):
        p.wait()
    with pytest.raises(es.TableNotFoundError):
        st.lookup_async(["nope"], np.zeros((1, 1), np.int64), np.zeros((1, 1, R), np.uint8))
    with pytest.raises(ValueError):
        st.lookup_async(["t"], np.zeros((1, 2), np.int64), np.zeros((1, 1, R), np.uint8))


def test_cancel_and_drop(mem):
    st, rows = mem
    entered, go = held_source(st, rows)
    ids = np.array([[3], [4]])
    busy_out = np.zeros((2, 1, R), np.uint8)
    busy = st.lookup_async(["s"], ids, busy_out)
    assert entered.wait(60)
    queued_out = np.full((2, 1, R), 5, np.uint8)
    queued = st.lookup_async(["t"], ids, queued_out)
    assert not queued.done()
    assert queued.cancel() is True          # never ran
    dropped_out = np.full((2, 1, R), 6, np.uint8)
    dropped = st.lookup_async(["t"], ids, dropped_out)
    del dropped                             # cancelled by its finalizer
    gc.collect()
    go.set()
    assert busy.cancel() is False           # it ran: waited for
    assert (busy_out == rows[ids]).all()
    assert (queued_out == 5).all() and (dropped_out == 6).all()


def test_close_with_pending(tmp_path):
    st = es.TableStore(local_dir=None, threads=1)
    rows = np.random.default_rng(4).integers(0, 256, (50, R), np.uint8)
    st.bind("t", rows)
    entered, go = held_source(st, rows)
    ids = np.array([[1], [2]])
    out0 = np.zeros((2, 1, R), np.uint8)
    running = st.lookup_async(["s"], ids, out0)
    assert entered.wait(60)
    outs = [np.full((2, 1, R), 8, np.uint8) for _ in range(3)]
    queued = [st.lookup_async(["t"], ids, o) for o in outs]
    closer = threading.Thread(target=st.close)
    closer.start()
    for q in queued:                        # close cancels what did not start ...
        while not q.done():
            threading.Event().wait(0.001)
    go.set()                                # ... and waits for the running one
    closer.join(60)
    assert not closer.is_alive()
    running.wait()
    assert (out0 == rows[ids]).all()
    for q, o in zip(queued, outs):
        with pytest.raises(es.StateError, match="closed before the lookup ran"):
            q.wait()
        assert (o == 8).all()


def test_pending_lookups_of_the_parent_after_fork(mem):
    """A child of fork() has no thread that would ever finish a lookup its
    parent submitted: waiting for one, cancelling one or dropping one fails
    (or returns) at once there, where it used to block for ever, and the
    lookups are still the parent's."""
    st, rows = mem
    entered, go = held_source(st, rows)
    ids = np.array([[3], [4]])
    outs = [np.full((2, 1, R), k, np.uint8) for k in range(3)]
    running = st.lookup_async(["s"], ids, outs[0])
    assert entered.wait(60)
    queued = [st.lookup_async(["t"], ids, o) for o in outs[1:]]
    pid = os.fork()
    if pid == 0:  # the child: an exception, or a wait that blocks, is a nonzero status
        code = 1
        try:
            signal.alarm(60)
            assert running.done() and all(q.done() for q in queued)
            with pytest.raises(es.StateError, match="before a fork"):
                queued[0].wait()
            with pytest.raises(es.StateError, match="before a fork"):
                queued[1].cancel()
            del running          # its finalizer cancels it: at once too
            gc.collect()
            code = 0
        finally:
            os._exit(code)
    try:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
        assert not queued[0].done()
    finally:
        go.set()
    running.wait()
    for q in queued:
        q.wait()
    assert all((o == rows[ids]).all() for o in outs)


def make_layer(st):
    lay = es.NgramLayout(layer_ids=[2, 9], vocab_size=40, max_ngram=3, heads=3,
                         compressed_vocab=30, pad_id=1)
    rng = np.random.default_rng(6)
    whole = rng.integers(0, 256, (lay.num_rows[1], R), np.uint8)
    st.bind("layer9", whole)
    heads = []
    for c in range(lay.num_cols):
        h = rng.integers(0, 256, (int(lay.primes[1, c]), R), np.uint8)
        st.bind(f"engram:l9:h{c}", h)
        heads.append(h)
    return lay, whole, heads


def test_ngram_lookup(mem):
    st, _ = mem
    lay, whole, heads = make_layer(st)
    h = es.NgramHasher(lay)
    toks = np.array([3, 4, 29, -1, 2, 7, 7, 11])
    names = [f"engram:l9:h{c}" for c in range(lay.num_cols)]
    gids = h.hash(toks, layer=9)
    lids = h.hash(toks, layer=9, local=True)
    out = h.lookup(st, 9, "layer9", toks)
    assert out.shape == (8, 6, R) and (out == whole[gids]).all()
    out = h.lookup(st, 9, names, toks)
    assert all((out[:, c] == heads[c][lids[:, c]]).all() for c in range(6))
    # After a history, as hash() takes it; submitted.
    hist = np.array([5, 6, 8, 9])
    pend, out2 = h.submit(st, 9, "layer9", toks[:3], history=hist)
    assert not isinstance(pend, tuple)
    pend.wait()
    assert (out2 == whole[h.hash(toks[:3], history=hist, layer=9)]).all()
    # Bad tokens: at the call, or at the wait; nothing written.
    bad = toks.copy()
    bad[2] = 30
    o = np.full((8, 6, R), 3, np.uint8)
    with pytest.raises(es.BadIdError, match=r"tokens\[2\] = 30"):
        h.lookup(st, 9, "layer9", bad, out=o)
    pend, _ = h.submit(st, 9, "layer9", bad, out=o)
    with pytest.raises(es.BadIdError, match=r"tokens\[2\] = 30"):
        pend.wait()
    assert (o == 3).all()
    # A table smaller than the layer; wrong arguments.
    with pytest.raises(es.BadIdError):
        h.lookup(st, 9, names[0], toks, out=o)
    with pytest.raises(ValueError, match="layer 3 is not one of"):
        h.lookup(st, 3, "layer9", toks)
    with pytest.raises(ValueError, match="expected one name"):
        h.lookup(st, 9, names[:2], toks)
    with pytest.raises(ValueError, match=r"shape \(8, 6, 16\)"):
        h.lookup(st, 9, "layer9", toks, out=np.zeros((8, 6, 8), np.uint8))
    with pytest.raises(TypeError, match="store"):
        h.lookup("not a store", 9, "layer9", toks)
    with pytest.raises(TypeError, match="initialised already"):
        h._c.__init__(lay._c)


# ---- bad inputs: refused at the submit, with nothing queued -------------------

@pytest.mark.parametrize("args, exc, text", [
    ((["t"], np.array([[1.0]]), np.zeros((1, 1, R), np.uint8)), TypeError,
     "ids: expected int32 or int64, got float64"),
    ((["t"], np.array([[1]], np.uint64), np.zeros((1, 1, R), np.uint8)), TypeError,
     "ids: expected int32 or int64, got uint64"),
    ((["t"], np.array([[True]]), np.zeros((1, 1, R), np.uint8)), TypeError,
     "ids: expected int32 or int64, got bool"),
    ((["t"], np.array([[1]], object), np.zeros((1, 1, R), np.uint8)), TypeError,
     "ids: expected int32 or int64"),
    ((["t"], np.array([1, 2]), np.zeros((2, 1, R), np.uint8)), ValueError,
     r"ids: expected a 2-D array \[T, K\], got shape \(2,\)"),
    ((["t"], np.zeros((2, 1, 1), np.int64), np.zeros((2, 1, R), np.uint8)), ValueError,
     "ids: expected a 2-D array"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.int8)), TypeError,
     "out: expected uint8, got int8"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.float32)), TypeError,
     "out: expected uint8, got float32"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((2, 1, R - 1), np.uint8)), ValueError,
     r"out: expected shape \(2, 1, 16\)"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((3, 1, R), np.uint8)), ValueError,
     r"out: expected shape \(2, 1, 16\)"),
    ((["t"], np.zeros((2, 1), np.int64), bytes(2 * R)), ValueError, "out: the array is read-only"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.uint8), np.array([0, 1])),
     ValueError, r"offsets: expected shape \(1,\)"),
    ((["t"], np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.uint8), np.array([0.0])),
     TypeError, "offsets: expected integers .*, got float64"),
    (("t", np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.uint8)), TypeError,
     "tables: expected a list or tuple of table names, got str"),
    (([5], np.zeros((2, 1), np.int64), np.zeros((2, 1, R), np.uint8)), TypeError, "tables"),
])
def test_lookup_async_bad_arguments(mem, args, exc, text):
    st, _ = mem
    out = args[2]
    with pytest.raises(exc, match=text):
        st.lookup_async(*args)
    if isinstance(out, np.ndarray):
        assert not out.any()


def test_lookup_async_read_only_out(mem):
    st, _ = mem
    out = np.zeros((1, 1, R), np.uint8)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="out: the array is read-only"):
        st.lookup_async(["t"], np.array([[1]]), out)


def test_lookup_async_edges(mem):
    """Empty lookups; ids at the ends of int64 and ids with strides."""
    st, rows = mem
    st.lookup_async(["t"], np.zeros((0, 1), np.int64), np.zeros((0, 1, R), np.uint8)).wait()
    st.lookup_async([], np.zeros((3, 0), np.int64), np.zeros((3, 0, R), np.uint8)).wait()
    for bad in (2**63 - 1, -2**63, -2, 100):
        out = np.full((1, 1, R), 4, np.uint8)
        p = st.lookup_async(["t"], np.array([[bad]], np.int64), out)
        with pytest.raises(es.BadIdError, match=rf"ids\[0\]\[0\] = {bad} is outside table 't'"):
            p.wait()
        assert (out == 4).all()
    ids = np.array([[1, 90], [2, 91], [3, 92]])[::2, :1]
    out = np.zeros((2, 1, R), np.uint8)
    st.lookup_async(["t"], ids, out).wait()
    assert (out[:, 0] == rows[[1, 3]]).all()


def test_pending_used_twice_or_after_the_fact(mem):
    st, rows = mem
    ids = np.array([[5], [6]])
    out = np.zeros((2, 1, R), np.uint8)
    p = st.lookup_async(["t"], ids, out)
    p.wait()
    assert p.done()
    for again in (p.wait, p.cancel):
        with pytest.raises(es.StateError, match="already waited for or cancelled"):
            again()
    assert p.done()
    # Cancelled, then waited for or cancelled again.
    entered, go = held_source(st, rows)
    busy = st.lookup_async(["s"], ids, np.zeros((2, 1, R), np.uint8))
    assert entered.wait(60)
    q = st.lookup_async(["t"], ids, np.zeros((2, 1, R), np.uint8))
    assert q.cancel() is True
    assert q.done()
    for again in (q.wait, q.cancel):
        with pytest.raises(es.StateError, match="already waited for or cancelled"):
            again()
    go.set()
    busy.wait()
    # Cancel once it is done: too late, so False and its rows, or its error.
    out = np.zeros((2, 1, R), np.uint8)
    p = st.lookup_async(["t"], ids, out)
    while not p.done():
        threading.Event().wait(0.001)
    assert p.cancel() is False
    assert (out == rows[ids]).all()
    p = st.lookup_async(["t"], np.array([[100]]), np.zeros((1, 1, R), np.uint8))
    while not p.done():
        threading.Event().wait(0.001)
    with pytest.raises(es.BadIdError, match=r"ids\[0\]\[0\] = 100"):
        p.cancel()
    # A PendingLookup made by hand is no lookup.
    with pytest.raises(es.StateError):
        es.PendingLookup().wait()
    assert es.PendingLookup().done()


def test_submit_on_a_closed_store(tmp_path):
    st = es.TableStore(local_dir=None, threads=1)
    lay, _, _ = make_layer(st)
    h = es.NgramHasher(lay)
    st.close()
    toks = np.array([3, 4])
    out = np.zeros((2, 6, R), np.uint8)
    for call in (lambda: st.lookup_async(["layer9"], np.array([[1]]), out[:1, :1]),
                 lambda: h.submit(st, 9, "layer9", toks),
                 lambda: h.submit(st, 9, "layer9", toks, out=out),
                 lambda: h.lookup(st, 9, "layer9", toks, out=out),
                 lambda: h.lookup(st, 9, [f"engram:l9:h{c}" for c in range(6)], toks, out=out)):
        with pytest.raises(es.StoreClosedError, match="closed"):
            call()
    assert not out.any()


def test_ngram_lookup_bad_arguments(mem):
    st, _ = mem
    lay, _, _ = make_layer(st)
    h = es.NgramHasher(lay)
    toks = np.array([3, 4, 29])
    names = [f"engram:l9:h{c}" for c in range(lay.num_cols)]
    st.bind("r8", np.zeros((100, 8), np.uint8))
    ro = np.zeros((3, 6, R), np.uint8)
    ro.flags.writeable = False
    for kw, exc, text in [
        ({"tokens": np.array([1.5])}, TypeError, "tokens: expected int32 or int64, got float64"),
        ({"tokens": np.array([1], np.uint64)}, TypeError, "tokens: expected int32 or int64, got uint64"),
        ({"tokens": np.array([True])}, TypeError, "tokens: .* got bool"),
        ({"tokens": np.array([[1, 2]])}, ValueError, "tokens: expected a contiguous 1-D array"),
        ({"tokens": np.arange(6)[::2]}, ValueError, "tokens: expected a contiguous 1-D array"),
        ({"tokens": np.array([-3])}, es.BadIdError, r"tokens\[0\] = -3 is not a compressed id"),
        ({"tokens": np.array([2**63 - 1])}, es.BadIdError, r"tokens\[0\] = 9223372036854775807"),
        ({"history": np.array([1.0])}, TypeError, "history: expected int64, got float64"),
        ({"history": np.array([1], np.int32)}, TypeError, "history: expected int64, got int32"),
        ({"history": np.array([30])}, es.BadIdError, r"history\[0\] = 30"),
        ({"out": np.zeros((3, 6, R), np.int8)}, TypeError, "out: expected uint8, got int8"),
        ({"out": ro}, ValueError, "out: the array is read-only"),
        ({"out": np.zeros((6, 3, R), np.uint8).transpose(1, 0, 2)}, ValueError,
         r"out: expected a C-contiguous array of shape \(3, 6, 16\), got \(3, 6, 16\) \(not contiguous\)"),
        ({"out": np.zeros((3, 6, R + 1), np.uint8)}, ValueError, r"shape \(3, 6, 16\)"),
        ({"out": np.zeros((2, 6, R), np.uint8)}, ValueError, r"shape \(3, 6, 16\)"),
        ({"tables": "nope"}, es.TableNotFoundError, "'nope'"),
        ({"tables": 5, "out": np.zeros((3, 6, R), np.uint8)}, TypeError,
         "tables: expected a table name or a list of them, got int"),
        ({"tables": [1] * 6, "out": np.zeros((3, 6, R), np.uint8)}, TypeError,
         r"tables\[0\]: expected a table name \(str\), got int"),
        ({"tables": names[:5] + ["nope"]}, es.TableNotFoundError, "'nope'"),
        ({"tables": names[:5] + ["r8"]}, es.LayoutError, "tables: 5 has rows of 8 bytes, the first 16"),
        ({"layer": 0}, ValueError, r"layer 0 is not one of the layout's layers \[2, 9\]"),
    ]:
        args = {"layer": 9, "tables": "layer9", "tokens": toks, **kw}
        o = args.pop("out", None)
        for submit in (False, True):
            with pytest.raises(exc, match=text):
                call = h.submit if submit else h.lookup
                r = call(st, args["layer"], args["tables"], args["tokens"], out=o,
                         history=args.get("history"))
                if submit:       # what the hash finds comes at the wait
                    r[0].wait()
            if isinstance(o, np.ndarray) and o.flags.writeable:
                assert not o.any()
    with pytest.raises(TypeError, match="store: expected a TableStore, got str"):
        h.submit("not a store", 9, "layer9", toks)


def test_ngram_lookup_tables_and_tokens_sized_in_python(mem):
    """Without out, the tables and the tokens size it: tables that are
    neither a name nor C of them, and tokens that are no vector, are
    refused naming them (an empty list failed with "list index out of
    range", an int with "'int' object is not subscriptable", 0-d tokens
    with "len() of unsized object")."""
    st, _ = mem
    lay, _, _ = make_layer(st)
    h = es.NgramHasher(lay)
    toks = np.array([3, 4])
    for submit in (False, True):
        call = h.submit if submit else h.lookup
        for tables, exc, text in [([], ValueError, r"tables: expected one name \(the layer's table\) or 6 \(one per column\), got 0"),
                                  (["layer9"] * 2, ValueError, "or 6 .* got 2"),
                                  (5, TypeError, "tables: expected a table name or a list of them, got int"),
                                  ({"layer9"}, TypeError, "got set")]:
            with pytest.raises(exc, match=text):
                call(st, 9, tables, toks)
        with pytest.raises(ValueError, match=r"tokens: expected a contiguous 1-D array, got shape \(\)"):
            call(st, 9, "layer9", np.array(3))
