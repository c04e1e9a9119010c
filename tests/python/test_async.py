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
