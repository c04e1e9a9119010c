"""Store-backed tables on a real Mooncake Store (its metadata server and
master on 127.0.0.1, started by the `mooncake` fixture): the layer API's
store= and the table API's store_client=.  Exact rows, the contract's
errors, create-only populate and its rollback, reads that fail (missing or
resized objects, short reads, transient errors, a master restarted empty)
without ever giving wrong bytes, bounded calls, the row cache, threads, and
a second process."""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import threading
import time
import types

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, make_rows, run_in_threads, sentinel

R = 264
SIZES = [300, 170, 45]
_ids = itertools.count(100)


@pytest.fixture
def layer_id():
    """A layer id no other test uses (the tests share one store)."""
    return next(_ids)


@pytest.fixture
def namespace():
    return f"ns{next(_ids)}"


def cfg(sizes=SIZES, row_bytes=R):
    return engramstore.EngramStoreConfig(list(sizes), row_bytes)


def heads(seed, sizes=SIZES, row_bytes=R):
    return [make_rows(n, row_bytes, seed=seed + h) for h, n in enumerate(sizes)]


def rand_ids(seed, B, L, sizes=SIZES, dead=False):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(-1 if dead else 0, n, (B, L)) for n in sizes],
                    -1).astype(np.int64)


def served_or_untouched(out, bufs, ids):
    """After a failed lookup: every output row is either untouched or the
    exact row (rows another head or the row cache served); never another
    byte."""
    want = expect(bufs, ids)
    rows_ok = (out == want).all(-1) | (out == SENTINEL).all(-1)
    return bool(rows_ok.all())


def expect(bufs, ids, out=None):
    res = sentinel(ids.shape + (bufs[0].shape[1],)) if out is None else out.copy()
    for h, b in enumerate(bufs):
        col = ids[..., h]
        live = col != -1
        res[..., h, :][live] = b[col[live]]
    return res


class Faulty:
    """A Mooncake client that passes every call on, except those a test
    replaces on the instance."""

    def __init__(self, mc):
        self._mc = mc

    def __getattr__(self, name):
        return getattr(self._mc, name)


@pytest.fixture
def layer(mc_client, layer_id):
    """(LayerStore on the Mooncake store with a row cache, layer id,
    head arrays), the layer populated; its keys removed at the end."""
    t = engramstore.EngramStore({layer_id: cfg()}, mc_client, cache_bytes=256 << 10)
    bufs = heads(layer_id)
    t.populate(layer_id, bufs)
    yield t, layer_id, bufs
    t.close()
    for k in t.get_store_keys(layer_id):
        mc_client.remove(k, True)


# ---- the layer API ---------------------------------------------------------

def test_layer_lookup_exact(layer, mc_client):
    t, L, bufs = layer
    assert t.store is mc_client
    for rnd in range(3):
        ids = rand_ids(rnd, 6, 40, dead=True)
        out = sentinel((6, 40, 3, R))
        assert t.lookup_into(L, ids, out) is None
        np.testing.assert_array_equal(out, expect(bufs, ids))  # -1 rows untouched
    st = t.stats()
    assert st["cache"]["hits"] > 0 and st["cache"]["read_errors"] == 0
    assert st["cache"]["tables"] == 3
    assert st["mooncake"]["get_into_ranges_calls"] > 0 and st["mooncake"]["retries"] == 0


def test_layer_output_registered_or_not(layer, mc_client):
    # Reads go through a staging buffer: an output registered with the
    # client (as Mooncake's own EngramStore requires) and one that is not
    # both get the exact rows.
    t, L, bufs = layer
    ids = rand_ids(7, 2, 16)
    plain = sentinel((2, 16, 3, R))
    t.lookup_into(L, ids, plain)
    reg = sentinel((2, 16, 3, R))
    assert mc_client.register_buffer(reg.ctypes.data, reg.nbytes) == 0
    try:
        t.lookup_into(L, ids, reg)
    finally:
        mc_client.unregister_buffer(reg.ctypes.data)
    np.testing.assert_array_equal(plain, expect(bufs, ids))
    np.testing.assert_array_equal(reg, plain)


def test_layer_getters_and_empty_batch(mc_client, layer_id):
    t = engramstore.EngramStore({layer_id: cfg(), layer_id + 1000: cfg([5], 8)}, mc_client)
    assert t.get_layer_ids() == [layer_id, layer_id + 1000]
    assert t.get_table_vocab_sizes(layer_id) == SIZES
    assert t.get_store_keys(layer_id) == [f"engram:l{layer_id}:h{h}" for h in range(3)]
    assert t.get_num_heads(layer_id) == 3 and t.get_row_bytes(layer_id + 1000) == 8
    # Not populated: a lookup says which keys are missing.
    with pytest.raises(engramstore.TableNotFoundError, match=f"engram:l{layer_id}:h0"):
        t.lookup_into(layer_id, np.zeros((1, 1, 3), np.int64), sentinel((1, 1, 3, R)))
    t.populate(layer_id, heads(1))
    calls = t.stats()["mooncake"]["get_into_ranges_calls"]
    t.lookup_into(layer_id, np.zeros((0, 4, 3), np.int64), np.zeros((0, 4, 3, R), np.uint8))
    assert t.stats()["mooncake"]["get_into_ranges_calls"] == calls  # a no-op
    assert t.remove_from_store(layer_id, force=True) == 3
    t.close()
    with pytest.raises(engramstore.StoreClosedError):
        t.lookup_into(layer_id, np.zeros((1, 1, 3), np.int64), sentinel((1, 1, 3, R)))
    with pytest.raises(engramstore.StoreClosedError):
        t.populate(layer_id, heads(1))
    with pytest.raises(engramstore.StoreClosedError):
        t.remove_from_store(layer_id, force=True)


def test_layer_populate_is_create_only(layer, mc_client):
    t, L, bufs = layer
    other = heads(999)
    with pytest.raises(engramstore.TableExistsError, match="already in the Mooncake store"):
        t.populate(L, other)
    # A second store on the same client refuses too, and the rows are the first ones.
    t2 = engramstore.EngramStore({L: cfg()}, mc_client)
    with pytest.raises(engramstore.TableExistsError):
        t2.populate(L, other)
    ids = rand_ids(3, 4, 10)
    out = sentinel((4, 10, 3, R))
    t2.lookup_into(L, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    t2.close()


def test_layer_populate_rolls_back(mc_client, layer_id):
    # The upload of head 1 fails after heads 0 and 2 were written: both are
    # removed before the error is raised, and a later populate works.
    f = Faulty(mc_client)

    def put(keys, ptrs, sizes, *cfg_):
        res = mc_client.batch_put_from(keys, ptrs, sizes, *cfg_)
        return [r if i != 1 else -800 for i, r in enumerate(res)]
    f.batch_put_from = put
    t = engramstore.EngramStore({layer_id: cfg()}, f)
    keys = t.get_store_keys(layer_id)
    with pytest.raises(engramstore.MooncakeError) as ei:
        t.populate(layer_id, heads(5))
    assert ei.value.key == keys[1] and ei.value.code == -800
    assert "the others were removed" in str(ei.value)
    assert mc_client.batch_is_exist(keys) == [0, 0, 0]
    with pytest.raises(engramstore.TableNotFoundError):
        t.lookup_into(layer_id, np.zeros((1, 1, 3), np.int64), sentinel((1, 1, 3, R)))
    del f.batch_put_from
    bufs = heads(6)
    t.populate(layer_id, bufs)
    ids = rand_ids(1, 3, 5)
    out = sentinel((3, 5, 3, R))
    t.lookup_into(layer_id, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    t.remove_from_store(layer_id, force=True)
    t.close()


@pytest.mark.parametrize("other", ["same rows", "other rows", "other rows, one head"])
def test_layer_populated_by_two_writers_at_once(mc_client, layer_id, other):
    # Another writer populates the same layer between this populate's check
    # that its keys are free and its upload: Mooncake answers a put to a
    # key that exists with success, keeping the other writer's object.  The
    # same rows are fine; other rows are TableExistsError (the other
    # writer's layer stays, whole); a layer whose heads are some of each is
    # removed, and this writer told so.  Never a populate that "succeeds"
    # and leaves other rows, or a mixed layer, in the store.
    mine, theirs = heads(layer_id), heads(layer_id + 500)
    if other == "same rows":
        theirs = [b.copy() for b in mine]
    them = engramstore.EngramStore({layer_id: cfg()}, mc_client)
    f = Faulty(mc_client)
    keys = them.get_store_keys(layer_id)

    def put_after_them(*args):
        if other == "other rows, one head":
            assert mc_client.put(keys[0], theirs[0].tobytes()) == 0
        else:
            them.populate(layer_id, theirs)
        return mc_client.batch_put_from(*args)
    f.batch_put_from = put_after_them
    t = engramstore.EngramStore({layer_id: cfg()}, f)
    ids = rand_ids(3, 2, 40)
    try:
        if other == "same rows":
            t.populate(layer_id, mine)
        elif other == "other rows":
            with pytest.raises(engramstore.TableExistsError, match=f"layer {layer_id}"):
                t.populate(layer_id, mine)
        else:
            with pytest.raises(engramstore.MooncakeError, match="removed") as ei:
                t.populate(layer_id, mine)
            assert ei.value.key == keys[0]
            assert mc_client.batch_is_exist(keys) == [0, 0, 0]
            return
        for st in (t, them):
            out = sentinel((2, 40, 3, R))
            st.lookup_into(layer_id, ids, out)
            np.testing.assert_array_equal(out, expect(theirs, ids))
    finally:
        t.close()
        them.remove_from_store(layer_id, force=True)
        them.close()


def test_layer_populate_refusals_write_nothing(mc_client, layer_id):
    t = engramstore.EngramStore({layer_id: cfg()}, mc_client)
    keys = t.get_store_keys(layer_id)
    good = heads(2)
    cases = [
        (good[:2], ValueError, "has 3 heads"),
        ([good[0], good[1], good[2].astype(np.int8)], TypeError, r"embedding_buffers\[2\]"),
        ([good[0], good[1][:100], good[2]], ValueError, r"embedding_buffers\[1\]"),
        ([good[0], np.asfortranarray(good[1]), good[2]], ValueError, r"embedding_buffers\[1\]"),
        (tuple(g.tolist() for g in good), TypeError, r"embedding_buffers\[0\]"),
    ]
    for bufs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            t.populate(layer_id, bufs)
    assert mc_client.batch_is_exist(keys) == [0, 0, 0]
    with pytest.raises(ValueError, match="layer_id: 7 is not a layer"):
        t.populate(7, good)
    t.close()


def test_layer_bad_ids_and_arguments(layer):
    t, L, bufs = layer
    calls = t.stats()["mooncake"]["get_into_ranges_calls"]
    ids = rand_ids(4, 2, 3)
    ids[1, 2, 1] = SIZES[1]
    out = sentinel((2, 3, 3, R))
    with pytest.raises(engramstore.BadIdError) as ei:
        t.lookup_into(L, ids, out)
    # The same message as the local mode's, and nothing read or written.
    assert str(ei.value) == (f"row_ids[1][2][1] = {SIZES[1]} is outside table "
                             f"'engram:l{L}:h1' (0 <= id < {SIZES[1]})")
    assert ei.value.position == (1, 2, 1)
    ids[1, 2, 1] = -7
    with pytest.raises(engramstore.BadIdError, match=r"= -7 is outside"):
        t.lookup_into(L, ids, out)
    assert (out == SENTINEL).all()
    assert t.stats()["mooncake"]["get_into_ranges_calls"] == calls
    ok = rand_ids(4, 2, 3)
    ro = sentinel((2, 3, 3, R))
    ro.flags.writeable = False
    for a, o, exc, msg in [
        (ok.astype(np.int32), out, TypeError, "^row_ids: expected int64, got int32"),
        (ok.astype(np.float64), out, TypeError, "^row_ids: expected int64"),
        (ok.tolist(), out, TypeError, "^row_ids: expected an array"),
        (np.asfortranarray(ok), out, ValueError, "^row_ids: must be C-contiguous"),
        (ok[:, :, :2], out, ValueError, "^row_ids: shape"),
        (ok, out.view(np.int8), TypeError, "^output: expected uint8"),
        (ok, out[..., :200], ValueError, "^output: expected shape"),
        (ok, ro, ValueError, "^output: the array is read-only"),
    ]:
        with pytest.raises(exc, match=msg):
            t.lookup_into(L, a, o)
    assert (out == SENTINEL).all()


def test_layer_output_views_as_local_mode(layer, local_dir):
    # The Store-backed lookup_into takes and refuses the same outputs as
    # the local mode, with the same errors: views whose [B, L] dimensions
    # flatten and whose rows' bytes are contiguous are written in place;
    # anything else (and an output with overlapping rows) is refused before
    # anything is read or written.
    t, L, bufs = layer
    with engramstore.EngramStore({L: cfg()}, engramstore.LocalStore(local_dir, "views")) as loc:
        loc.populate(L, bufs)
        ids = rand_ids(3, 2, 3)
        strided = np.lib.stride_tricks.as_strided
        views = {
            "contiguous": lambda: sentinel((2, 3, 3, R)),
            "wider rows": lambda: sentinel((2, 3, 3, R + 8))[..., 8:],
            "head-major": lambda: sentinel((3, 2, 3, R)).transpose(1, 2, 0, 3),
            "heads reversed": lambda: sentinel((2, 3, 3, R))[:, :, ::-1],
            "L sliced": lambda: sentinel((2, 4, 3, R))[:, :3],
            "B strided": lambda: sentinel((4, 3, 3, R))[::2],
            "B reversed": lambda: sentinel((2, 3, 3, R))[::-1],
            "Fortran order": lambda: np.asfortranarray(sentinel((2, 3, 3, R))),
            "every other byte": lambda: sentinel((2, 3, 3, 2 * R))[..., ::2],
            "rows overlap": lambda: strided(sentinel((2, 3, 1, R)), (2, 3, 3, R),
                                            (3 * R, R, 0, 1)),
        }
        for what, make in views.items():
            got = {}
            for mode, st in (("local", loc), ("mooncake", t)):
                out = make()
                try:
                    st.lookup_into(L, ids, out)
                    got[mode] = ("written", (np.asarray(out) == expect(bufs, ids)).all())
                except (ValueError, TypeError, engramstore.EngramError) as e:
                    got[mode] = (type(e).__name__, str(e), (out == SENTINEL).all())
            assert got["local"] == got["mooncake"], (what, got)
            assert got["local"][-1], (what, got)  # exact rows, or untouched


def test_layer_remove_and_populate_again(layer, mc_client):
    # Rows cached before a remove are never served for the new tables.
    t, L, bufs = layer
    ids = rand_ids(9, 4, 30)
    out = sentinel((4, 30, 3, R))
    t.lookup_into(L, ids, out)
    t.lookup_into(L, ids, out)  # all cached now
    keys = t.get_store_keys(L)
    mc_client.remove(keys[2], True)
    with pytest.raises(engramstore.TableNotFoundError, match=keys[2]):
        t.remove_from_store(L)  # a head is missing: nothing removed
    assert mc_client.batch_is_exist(keys) == [1, 1, 0]
    assert t.remove_from_store(L, force=True) == 2
    assert mc_client.batch_is_exist(keys) == [0, 0, 0]
    with pytest.raises(engramstore.TableNotFoundError):
        t.lookup_into(L, ids, out)
    new = heads(L + 50)
    t.populate(L, new)
    out2 = sentinel((4, 30, 3, R))
    t.lookup_into(L, ids, out2)
    np.testing.assert_array_equal(out2, expect(new, ids))


def test_layer_remove_waits_out_the_lease(layer, mc_client):
    # Mooncake refuses a remove of a key read less than a lease (10 s) ago
    # (-706): without force, remove_from_store waits it out.
    t, L, _ = layer
    t.lookup_into(L, rand_ids(1, 1, 4), sentinel((1, 4, 3, R)))
    t0 = time.monotonic()
    assert t.remove_from_store(L) == 3
    assert mc_client.batch_is_exist(t.get_store_keys(L)) == [0, 0, 0]
    assert time.monotonic() - t0 < 20


# ---- reads that fail -------------------------------------------------------

def test_missing_object_is_an_error_naming_the_key(layer, mc_client):
    t, L, bufs = layer
    key = t.get_store_keys(L)[1]
    assert mc_client.remove(key, True) == 0  # behind the store's back
    ids = rand_ids(11, 2, 50)
    out = sentinel((2, 50, 3, R))
    with pytest.raises(engramstore.EngramError) as ei:
        t.lookup_into(L, ids, out)
    assert ei.value.errno == 5 and key in str(ei.value)
    cause = ei.value.__cause__
    assert isinstance(cause, engramstore.MooncakeError)
    assert cause.key == key and cause.code == -704 and "not in the store" in str(cause)
    # The missing head's rows are untouched; the other heads' are exact.
    assert (out[:, :, 1] == SENTINEL).all()
    assert served_or_untouched(out, bufs, ids)
    assert t.stats()["cache"]["read_errors"] > 0


def test_resized_object_is_refused(mc_client, layer_id):
    # An object of another size under a head's key: the layer does not open.
    t = engramstore.EngramStore({layer_id: cfg()}, mc_client)
    keys = t.get_store_keys(layer_id)
    bufs = heads(3)
    bufs[1] = make_rows(SIZES[1] - 1, R, seed=1)
    other = engramstore.EngramStore({layer_id: cfg([SIZES[0], SIZES[1] - 1, SIZES[2]])},
                                    mc_client)
    other.populate(layer_id, bufs)
    with pytest.raises(engramstore.LayoutMismatchError, match=keys[1]):
        t.lookup_into(layer_id, np.zeros((1, 1, 3), np.int64), sentinel((1, 1, 3, R)))
    other.remove_from_store(layer_id, force=True)
    other.close()
    t.close()


def test_object_replaced_by_another_size_behind_an_open_layer(mc_client, layer_id):
    # A head's object replaced, behind an open layer's back, by one of
    # another size: larger, its reads would succeed; smaller, they fail past
    # its end.  Either way the next lookup that reads the head fails naming
    # the key and both sizes, with none of its bytes served, and the layer
    # is opened from the Store again at the next lookup: refused while the
    # object has another size, then served from new source tables (never
    # the rows cached before) once it has the layer's size again.
    t = engramstore.EngramStore({layer_id: cfg()}, mc_client, cache_bytes=256 << 10)

    def put(rows):
        assert mc_client.remove(key, True) == 0
        assert mc_client.put(key, rows.tobytes()) == 0
    try:
        bufs = heads(layer_id)
        t.populate(layer_id, bufs)
        key = t.get_store_keys(layer_id)[1]
        cached = rand_ids(5, 2, 20)
        cached[..., 1] %= SIZES[1] - 40  # the last 40 rows of head 1: 20 a round
        for rnd, n in enumerate((SIZES[1] + 40, SIZES[1] - 40)):
            ids = rand_ids(6, 2, 20)
            ids[1, :, 1] %= SIZES[1] - 40
            ids[0, :, 1] = np.arange(SIZES[1] - 40 + 20 * rnd, SIZES[1] - 20 + 20 * rnd)
            for _ in range(2):
                out = sentinel((2, 20, 3, R))
                t.lookup_into(layer_id, cached, out)
                np.testing.assert_array_equal(out, expect(bufs, cached))
            put(make_rows(n, R, seed=5))
            out = sentinel((2, 20, 3, R))
            with pytest.raises(engramstore.EngramError) as ei:
                t.lookup_into(layer_id, ids, out)
            cause = ei.value.__cause__
            assert isinstance(cause, engramstore.MooncakeError) and cause.key == key, ei.value
            assert f"holds {n * R} bytes, not the {SIZES[1] * R}" in str(cause), cause
            # The rows of head 1 it read are untouched; the others served
            # (from the other heads, or cached before) are the layer's.
            assert (out[0, :, 1] == SENTINEL).all() and served_or_untouched(out, bufs, ids)
            with pytest.raises(engramstore.LayoutMismatchError, match=key):
                t.lookup_into(layer_id, ids, sentinel((2, 20, 3, R)))
            bufs[1] = make_rows(SIZES[1], R, seed=layer_id + n)  # the right size again
            put(bufs[1])
            for i in (ids, cached):
                out = sentinel((2, 20, 3, R))
                t.lookup_into(layer_id, i, out)
                np.testing.assert_array_equal(out, expect(bufs, i))  # none cached before
    finally:
        t.remove_from_store(layer_id, force=True)
        t.close()


@pytest.mark.parametrize("fault", ["short", "malformed", "invalid"])
def test_bad_answers_never_give_bytes(layer, mc_client, fault):
    t, L, bufs = layer
    f = Faulty(mc_client)

    def get(ptrs, keys, dst, src, sizes):
        res = mc_client.get_into_ranges(ptrs, keys, dst, src, sizes)
        if fault == "short":
            res[0][0][-1] = 100
        elif fault == "malformed":
            res[0][0].pop()
        else:
            res[0][0][0] = -600
        return res
    f.get_into_ranges = get
    t2 = engramstore.EngramStore({L: cfg()}, f, cache_bytes=64 << 10)
    ids = rand_ids(12, 3, 20)
    out = sentinel((3, 20, 3, R))
    with pytest.raises(engramstore.EngramError) as ei:
        t2.lookup_into(L, ids, out)
    cause = ei.value.__cause__
    assert isinstance(cause, engramstore.MooncakeError) and cause.key.startswith(f"engram:l{L}:")
    assert {"short": "short read", "malformed": "answered", "invalid": "INVALID_PARAMS"}[fault] \
        in str(cause)
    assert (out == SENTINEL).all()
    # Nothing was cached: the next lookup reads again, and gets the rows.
    del f.get_into_ranges
    t2.lookup_into(L, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    assert t2.stats()["cache"]["hits"] == 0
    t2.close()


def test_transient_errors_are_retried_until_the_deadline(layer, mc_client):
    t, L, bufs = layer
    f = Faulty(mc_client)
    fails = {"n": 2}

    def get(ptrs, keys, dst, src, sizes):
        res = mc_client.get_into_ranges(ptrs, keys, dst, src, sizes)
        if fails["n"] > 0:
            fails["n"] -= 1
            res[0][0][0] = -900  # RPC_FAIL
        return res
    f.get_into_ranges = get
    t2 = engramstore.EngramStore({L: cfg()}, f, read_deadline=0.5)
    ids = rand_ids(13, 2, 10)
    out = sentinel((2, 10, 3, R))
    t2.lookup_into(L, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    assert t2.stats()["mooncake"]["retries"] == 2
    fails["n"] = 10 ** 9
    out = sentinel((2, 10, 3, R))
    t0 = time.monotonic()
    with pytest.raises(engramstore.EngramError) as ei:
        t2.lookup_into(L, rand_ids(14, 2, 10), out)
    assert 0.3 < time.monotonic() - t0 < 5
    assert "after 0.5 s of retries" in str(ei.value.__cause__) and "RPC_FAIL" in str(ei.value)
    assert (out == SENTINEL).all()
    t2.close()


def test_calls_are_bounded(layer, mc_client):
    t, L, bufs = layer
    seen = []
    f = Faulty(mc_client)

    def get(ptrs, keys, dst, src, sizes):
        seen.append((len(keys[0]), sum(len(x) for x in src[0])))
        return mc_client.get_into_ranges(ptrs, keys, dst, src, sizes)
    f.get_into_ranges = get
    t2 = engramstore.EngramStore({L: cfg()}, f, max_ranges=16)
    ids = np.stack([np.arange(200) % n for n in SIZES], -1).astype(np.int64).reshape(1, 200, 3)
    out = sentinel((1, 200, 3, R))
    t2.lookup_into(L, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    # The distinct rows of all heads (200 + 170 + 45) in calls of at most
    # 16 ranges, the heads' ranges sharing calls.
    assert max(n for _, n in seen) == 16 and sum(n for _, n in seen) == 200 + 170 + 45
    assert len(seen) == -(-(200 + 170 + 45) // 16)
    assert any(k > 1 for k, _ in seen)
    seen.clear()
    t2.lookup_into(L, rand_ids(1, 1, 5), sentinel((1, 5, 3, R)))
    assert len(seen) == 1 and seen[0] == (3, 15)  # one call for the heads of a lookup
    t2.close()


def test_calls_are_bounded_in_keys(layer, mc_client, monkeypatch):
    t, L, bufs = layer
    seen = []
    f = Faulty(mc_client)

    def get(ptrs, keys, dst, src, sizes):
        seen.append(len(keys[0]))
        return mc_client.get_into_ranges(ptrs, keys, dst, src, sizes)
    f.get_into_ranges = get
    monkeypatch.setattr(engramstore._mooncake, "MAX_KEYS", 2)
    t2 = engramstore.EngramStore({L: cfg()}, f)
    ids = rand_ids(21, 2, 40)
    out = sentinel((2, 40, 3, R))
    t2.lookup_into(L, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    assert seen == [2, 1]
    t2.close()


def test_master_restarted_empty_during_lookups(tmp_path):
    # A master that dies and comes back empty: lookups fail with an error
    # naming a key, and no lookup ever returns a wrong byte.
    import mcserver
    mcserver.require_mooncake()
    srv = mcserver.MooncakeServers(str(tmp_path))
    srv.start()
    clients = []
    try:
        clients.append(srv.client(segment_bytes=64 << 20))
        c = srv.client()
        clients.append(c)
        t = engramstore.EngramStore({1: cfg()}, c, read_deadline=1.0)
        bufs = heads(21)
        t.populate(1, bufs)
        results = {"ok": 0, "errors": [], "wrong": 0}
        stop = threading.Event()

        def work():
            rng = 0
            while not stop.is_set() and len(results["errors"]) < 3:
                rng += 1
                ids = rand_ids(rng, 2, 30)
                out = sentinel((2, 30, 3, R))
                try:
                    t.lookup_into(1, ids, out)
                except engramstore.EngramError as e:
                    results["errors"].append(e)
                    if not served_or_untouched(out, bufs, ids):
                        results["wrong"] += 1
                    continue
                if (out != expect(bufs, ids)).any():
                    results["wrong"] += 1
                else:
                    results["ok"] += 1
        th = threading.Thread(target=work)
        th.start()
        # Lookups served before the restart: waited for, not a time (the
        # thread may run late on a busy machine).
        end = time.monotonic() + 60
        while results["ok"] == 0 and not results["errors"] and time.monotonic() < end:
            time.sleep(0.01)
        srv.restart_master()
        th.join(timeout=60)
        stop.set()
        th.join(timeout=30)
        assert not th.is_alive()
        assert results["ok"] > 0 and results["wrong"] == 0
        errors = results["errors"]
        assert errors, "no lookup failed after the master came back empty"
        # A read that met the empty master fails naming a key (its cause a
        # MooncakeError); that closes the layer, and the lookups after it
        # find its heads gone (TableNotFoundError naming them).
        assert any(isinstance(e.__cause__, engramstore.MooncakeError) for e in errors), errors
        for e in errors:
            assert "engram:l1:h" in str(e), e
            assert isinstance(e.__cause__, engramstore.MooncakeError) or \
                isinstance(e, (engramstore.MooncakeError, engramstore.TableNotFoundError)), e
        t.close()
    finally:
        for cl in clients:
            cl.close()
        srv.stop()


# ---- the row cache, threads, a second process -------------------------------

def test_cache_is_exact_under_zipf(mc_client, layer_id):
    sizes = [2000, 1500]
    t = engramstore.EngramStore({layer_id: cfg(sizes)}, mc_client,
                                cache_bytes=(3500 * R) // 20)  # 5% of the rows' bytes
    bufs = heads(layer_id, sizes)
    t.populate(layer_id, bufs)
    rng = np.random.default_rng(0)
    perm = [rng.permutation(n) for n in sizes]
    total = 0
    for rnd in range(12):
        ranks = [np.minimum(rng.zipf(1.2, (8, 32)), n) - 1 for n in sizes]
        ids = np.stack([p[r] for p, r in zip(perm, ranks)], -1).astype(np.int64)
        out = sentinel((8, 32, 2, R))
        t.lookup_into(layer_id, ids, out)
        np.testing.assert_array_equal(out, expect(bufs, ids))
        total += ids.size
    cs = t.stats()["cache"]
    assert cs["hits"] + cs["misses"] == total
    assert cs["hits"] > total // 3 and cs["reads"] < total // 2
    t.remove_from_store(layer_id, force=True)
    t.close()


@pytest.mark.parametrize("keep_all", [False, True])
def test_cache_admission(mc_client, layer_id, keep_all):
    """The Mooncake layer API's row cache filters like every row cache: a
    scan of rows asked for once leaves the hot rows cached, unless
    cache_keep_all=True (then the scan flushes them)."""
    sizes = [6000]
    t = engramstore.EngramStore({layer_id: cfg(sizes)}, mc_client, cache_bytes=40 << 10,
                                cache_keep_all=keep_all)
    bufs = heads(layer_id, sizes)
    t.populate(layer_id, bufs)

    def ask(rows):
        ids = np.asarray(rows, np.int64).reshape(1, -1, 1)
        out = sentinel((1, ids.shape[1], 1, R))
        t.lookup_into(layer_id, ids, out)
        np.testing.assert_array_equal(out, expect(bufs, ids))
        return t.stats()["cache"]

    slots = t.stats()["cache"]["slots"]
    assert 50 <= slots <= 200
    for _ in range(3):
        ask(range(30))
    before = ask(range(1000, 1000 + 4 * slots))
    after = ask(range(30))
    if keep_all:
        assert before["not_kept"] == 0 and after["hits"] - before["hits"] <= 3
    else:
        assert before["not_kept"] >= 3 * slots and after["hits"] - before["hits"] >= 27
    t.remove_from_store(layer_id, force=True)
    t.close()


def test_threads(layer):
    t, L, bufs = layer

    def work(seed):
        for r in range(8):
            ids = rand_ids(seed * 100 + r, 2, 25)
            out = sentinel((2, 25, 3, R))
            t.lookup_into(L, ids, out)
            np.testing.assert_array_equal(out, expect(bufs, ids))
    assert run_in_threads(work) == []


def run_child(mooncake, **job):
    job.update(metadata=mooncake.metadata_url, master=mooncake.master_addr)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "mc_child.py"),
                        json.dumps(job)], capture_output=True, text=True, timeout=120, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert r.returncode == 0 and lines, r.stderr[-3000:]
    return json.loads(lines[-1])


def test_two_processes_layer(mooncake, mc_client, layer_id):
    # Another process populates; this one looks up; then another process
    # looks up what this one populated.
    job = dict(layer=layer_id, sizes=SIZES, row_bytes=R, seed=layer_id)
    assert run_child(mooncake, job="populate", **job) == {"ok": True}
    t = engramstore.EngramStore({layer_id: cfg()}, mc_client)
    bufs = heads(layer_id)
    ids = rand_ids(2, 16, 64)
    out = sentinel((16, 64, 3, R))
    t.lookup_into(layer_id, ids, out)
    np.testing.assert_array_equal(out, expect(bufs, ids))
    t.remove_from_store(layer_id, force=True)
    t.populate(layer_id, heads(layer_id + 1))
    res = run_child(mooncake, job="lookup", rounds=6, B=4, L=512, cache=1 << 20,
                    **dict(job, seed=layer_id + 1))
    assert res["ok"] and res["bad_rows"] == 0 and res["hits"] > 0, res
    t.remove_from_store(layer_id, force=True)
    t.close()


def lifetime_orders():
    """Every order of what a program may do to its stores (close, drop the
    last reference) and to their Mooncake client (close, drop), from
    nothing at all to everything, before the interpreter exits."""
    store = [[], ["close_store"], ["drop_store"], ["close_store", "drop_store"]]
    client = [[], ["close_client"], ["drop_client"], ["close_client", "drop_client"]]
    for s in store:
        for c in client:
            n = len(s) + len(c)
            for at in itertools.combinations(range(n), len(s)):
                si, ci = iter(s), iter(c)
                yield [next(si) if i in at else next(ci) for i in range(n)]


@pytest.fixture(scope="module")
def lifetime_job(mooncake, mc_client):
    """A populated layer and a published table "t" for the lifetime
    children to read."""
    layer, ns = next(_ids), f"ns{next(_ids)}"
    job = dict(job="lifetime", layer=layer, namespace=ns, sizes=SIZES, row_bytes=R, seed=layer)
    t = engramstore.EngramStore({layer: cfg()}, mc_client)
    t.populate(layer, heads(layer))
    with engramstore.EngramStore(namespace=ns, store_client=mc_client) as st:
        st.populate("t", heads(layer)[0])
    yield job
    t.remove_from_store(layer, force=True)
    t.close()
    drop_namespace(mc_client, ns)


@pytest.mark.parametrize("steps", list(lifetime_orders()), ids=lambda s: "+".join(s) or "exit")
def test_store_and_client_lifetimes(mooncake, lifetime_job, steps):
    # A store never calls into its client once the client may be closed or
    # gone: Mooncake's client crashes the process on any call after close(),
    # and at the interpreter's exit a store's last reference may go after
    # the client was torn down.  Whatever the program does, in whatever
    # order, the process exits with status 0.
    job = dict(lifetime_job, steps=steps, metadata=mooncake.metadata_url,
               master=mooncake.master_addr)
    # faulthandler: a crash shows the Python stack it happened in.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p),
               PYTHONFAULTHANDLER="1")
    r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "mc_child.py"),
                        json.dumps(job)], capture_output=True, text=True, timeout=120, env=env)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines and json.loads(lines[-1]) == {"ok": True}, r.stderr[-3000:]
    assert r.returncode == 0, (f"exit status {r.returncode}" + (
        f" (signal {-r.returncode})" if r.returncode < 0 else "") + "\n" + r.stderr[-3000:])


def test_two_processes_populate_one_layer_at_once(mooncake, mc_client, layer_id):
    # Two processes populate the same layer with other rows at the same
    # moment, however they interleave: at most one succeeds, and the layer
    # in the store is then all of its rows; or none does, and it is gone.
    sizes = [4000] * 6
    at = time.time() + 2.0  # both children are up by then
    job = dict(job="populate", layer=layer_id, sizes=sizes, row_bytes=R, at=at,
               metadata=mooncake.metadata_url, master=mooncake.master_addr)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = [subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__),
                                                            "mc_child.py"),
                               json.dumps(dict(job, seed=seed))], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env)
             for seed in (layer_id, layer_id + 500)]
    res = []
    for p in procs:
        o, e = p.communicate(timeout=120)
        lines = [ln for ln in o.splitlines() if ln.startswith("{")]
        assert p.returncode == 0 and lines, e[-3000:]
        res.append(json.loads(lines[-1]))
    t = engramstore.EngramStore({layer_id: cfg(sizes)}, mc_client)
    try:
        ok = [r.get("ok") is True for r in res]
        assert sum(ok) <= 1, res
        for r in res:
            assert r.get("ok") or r["error"].startswith(("TableExistsError", "MooncakeError")), res
        keys = t.get_store_keys(layer_id)
        if not any(mc_client.batch_is_exist(keys)):
            assert not any(ok), res
            return
        ids = np.stack([np.arange(4000) % 4000] * 6, -1).reshape(1, 4000, 6).astype(np.int64)
        out = sentinel((1, 4000, 6, R))
        t.lookup_into(layer_id, ids, out)
        winner = [w for w, seed in enumerate((layer_id, layer_id + 500))
                  if (out == expect(heads(seed, sizes), ids)).all()]
        assert winner and ok[winner[0]], res  # the layer is one writer's whole, and it said so
    finally:
        t.remove_from_store(layer_id, force=True)
        t.close()


# ---- the table API -----------------------------------------------------------

@pytest.fixture
def tables(mc_client, namespace):
    st = engramstore.EngramStore(tables={"a": {"num_rows": 300, "row_bytes": R},
                                         "b": (170, R)},
                                 namespace=namespace, store_client=mc_client,
                                 cache_bytes=256 << 10)
    rows = {"a": make_rows(300, R, seed=31), "b": make_rows(170, R, seed=32)}
    yield st, rows
    st.close()
    drop_namespace(mc_client, namespace)


def drop_namespace(mc_client, namespace):
    """Removes what a test published in its namespace (best effort)."""
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as s:
        for n in s.list_tables():
            s.remove(n, force=True)


def test_table_api_full_lookup_contract(tables):
    st, rows = tables
    assert isinstance(st, engramstore.MooncakeTableStore)
    assert isinstance(st, engramstore.TableStore)
    assert st.get_table_spec("a")["stored"] is False
    st.populate("a", rows["a"])
    st.populate("b", rows["b"][:, :])
    assert st.list_tables() == ["a", "b"]
    spec = st.get_table_spec("b")
    assert (spec["num_rows"], spec["row_bytes"], spec["stored"]) == (170, R, True)
    names = ["a", "b", "a"]
    rng = np.random.default_rng(3)
    ids = np.stack([rng.integers(0, 300, 50), rng.integers(1000, 1170, 50),
                    rng.integers(0, 300, 50)], -1).astype(np.int32)
    ids[::7, 1] = -1
    offsets = np.array([0, 1000, 0], np.int64)
    out_km = sentinel((3, 50, R))  # head-major through strides
    st.lookup(names, ids, out_km.transpose(1, 0, 2), offsets)
    for k, n in enumerate(names):
        col = ids[:, k].astype(np.int64)
        live = col != -1
        np.testing.assert_array_equal(out_km[k][live], rows[n][col[live] - offsets[k]])
        assert (out_km[k][~live] == SENTINEL).all()
    out = sentinel((50, 3, R))
    st.lookup(names, ids, out, offsets, zero_dead=True)
    assert (out[::7, 1] == 0).all()
    ids[4, 2] = 300
    out = sentinel((50, 3, R))
    with pytest.raises(engramstore.BadIdError, match=r"^ids\[4\]\[2\] = 300 is outside table 'a'"):
        st.lookup(names, ids, out, offsets)
    assert (out == SENTINEL).all()
    st.verify("a")


def test_table_api_create_only_and_specs(tables, mc_client, namespace, monkeypatch):
    st, rows = tables
    st.populate("a", rows["a"])
    with pytest.raises(engramstore.TableExistsError):
        st.populate("a", rows["a"])
    with pytest.raises(ValueError, match=r"expected shape \(170, 264\)"):
        st.populate("b", rows["a"])
    with pytest.raises(engramstore.LayoutMismatchError):
        engramstore.EngramStore(tables={"a": (301, R)}, namespace=namespace,
                                store_client=mc_client)
    # A writer that dies between its chunks and its manifest (every call
    # of its client fails from then on): its chunks are invisible, hold
    # the name only until its TTL has passed, and the next populate then
    # deletes them.
    monkeypatch.setattr(engramstore._mooncake, "PUSH_TTL_MS", 300)
    dead_client, orphans = dying_client(mc_client, "/.rec/c/")
    with engramstore.EngramStore(namespace=namespace, store_client=dead_client,
                                 chunk_bytes=2 * R) as dead:
        with pytest.raises(engramstore.EngramError, match="died"):
            dead.populate("c", make_rows(4, R, seed=9))
    assert len(orphans) == 2 and mc_client.batch_is_exist(orphans) == [1, 1], orphans
    with pytest.raises(engramstore.TableNotFoundError):
        st.get_table_spec("c")
    with pytest.raises(engramstore.TableNotFoundError):
        st.lookup(["c"], np.zeros((1, 1), np.int64), sentinel((1, 1, R)))
    assert "c" not in st.list_tables()
    time.sleep(0.5)  # past the dead populate's TTL (by this host's clock)
    new = make_rows(4, R, seed=1)
    st.populate("c", new)
    assert mc_client.batch_is_exist(orphans) == [0, 0]  # settled by the populate
    spec = st.get_table_spec("c")
    assert not set(spec["chunk_keys"]) & set(orphans)
    out = sentinel((4, 1, R))
    st.lookup(["c"], np.arange(4).reshape(4, 1), out)
    np.testing.assert_array_equal(out[:, 0], new)
    st.remove("c", force=True)
    assert mc_client.batch_is_exist(spec["chunk_keys"]) == [0] * len(spec["chunk_keys"])
    with pytest.raises(TypeError, match="file_cache"):
        engramstore.EngramStore(namespace=namespace, store_client=mc_client, file_cache=True)
    with pytest.raises(engramstore.SpecError):
        st.populate(".x", rows["a"])


def dying_client(mc_client, record):
    """(a client that dies at the first put of a manifest into a record
    whose key holds `record`: that call and every call after it raise,
    [the chunk keys it uploaded])."""
    f, chunks, dead = Faulty(mc_client), [], []

    def check():
        if dead:
            raise RuntimeError("the writer died")

    def put(key, value, *args):
        check()
        if record in key and b"engram-redis 1" in bytes(value):
            dead.append(1)
            check()
        return mc_client.put(key, value, *args)

    def batch_put_from(keys, *args):
        check()
        chunks.extend(k for k in keys if "/.chunk/" in k)
        return mc_client.batch_put_from(keys, *args)
    f.put, f.batch_put_from = put, batch_put_from
    for name in ("get", "get_batch", "batch_is_exist", "remove", "batch_remove",
                 "get_into_ranges", "batch_get_replica_desc", "get_size"):
        def passed(*args, _fn=getattr(mc_client, name)):
            check()
            return _fn(*args)
        setattr(f, name, passed)
    return f, chunks


def namespace_objects(mc_client, namespace, names, versions=64):
    """The objects of MooncakeKV's records of `names` and of its names
    index that exist (versions 0..versions-1, window digests, entries)."""
    keys = [f"{namespace}/.names/{k}" for k in range(versions)]
    for n in names:
        keys += [f"{namespace}/.rec/{n}/{v}" for v in range(versions)]
        keys += [f"{namespace}/.rec/{n}/w{k}" for k in range(versions // 16)]
    return [k for k, e in zip(keys, mc_client.batch_is_exist(keys)) if e == 1]


@pytest.mark.parametrize("chunk_rows", [1, 7, 64, 300])
def test_table_api_chunked_tables(mc_client, namespace, chunk_rows):
    # Tables cut into chunk objects (the last one shorter), looked up
    # together with a table of one chunk, through the row cache: every row
    # from its chunk, exact, the same from a store that did not write them.
    a, b = make_rows(300, R, seed=21), make_rows(5, R, seed=22)
    rng = np.random.default_rng(chunk_rows)
    ids = np.stack([rng.integers(0, 300, 400), rng.integers(0, 5, 400)], -1).astype(np.int64)
    ids[::9, 0] = 299  # the last row of the last chunk
    try:
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                     chunk_bytes=chunk_rows * R) as st:
            st.populate("a", a)
            spec = st.get_table_spec("a")
            assert spec["chunk_rows"] == chunk_rows
            assert len(spec["chunk_keys"]) == -(-300 // chunk_rows)
            assert mc_client.get_size(spec["chunk_keys"][-1]) == (300 - (
                len(spec["chunk_keys"]) - 1) * chunk_rows) * R
            with engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                         chunk_bytes=1 << 20) as w:
                w.populate("b", b)
            assert len(st.get_table_spec("b")["chunk_keys"]) == 1
            st.verify("a")
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                     cache_bytes=64 << 10) as r:
            for _ in range(2):
                out = sentinel((400, 2, R))
                r.lookup(["a", "b"], ids, out)
                np.testing.assert_array_equal(out[:, 0], a[ids[:, 0]])
                np.testing.assert_array_equal(out[:, 1], b[ids[:, 1]])
            with pytest.raises(engramstore.BadIdError):
                r.lookup(["a"], np.array([[300]], np.int64), sentinel((1, 1, R)))
    finally:
        drop_namespace(mc_client, namespace)


def test_table_api_chunk_bytes_refused(mc_client, namespace):
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="chunk_bytes"):
            engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                    chunk_bytes=bad)


def test_table_api_removal_racing_lookups_never_gives_other_rows(mc_client, namespace):
    # Chunks are deleted at once, leases of recent reads or not, and
    # Mooncake then gives their memory to the next put: a lookup whose
    # read raced the removal must fail, never return those other bytes.
    # One store looks up table t (bytes 0xAA, its row number in front)
    # without a pause while another removes it, populates a table of 0x55
    # bytes (likely in the memory just freed), and populates t again.
    n, rb = 2048, 1024
    mine = np.full((n, rb), 0xAA, np.uint8)
    mine[:, :8] = np.arange(n, dtype=np.int64).view(np.uint8).reshape(n, 8)
    other = np.full((n, rb), 0x55, np.uint8)
    stop, seen = threading.Event(), {"ok": 0, "failed": 0, "wrong": []}
    ids = np.arange(n, dtype=np.int64).reshape(n, 1)
    try:
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as w, \
                engramstore.EngramStore(namespace=namespace, store_client=mc_client) as rd:
            w.populate("t", mine)

            def reader():
                while not stop.is_set():
                    out = sentinel((n, 1, rb))
                    try:
                        rd.lookup(["t"], ids, out)
                    except engramstore.EngramError:
                        seen["failed"] += 1
                        continue
                    bad = np.flatnonzero(~(out[:, 0] == mine).all(-1))
                    if len(bad):
                        seen["wrong"].append((len(bad), out[bad[0], 0, :16].tobytes()))
                    else:
                        seen["ok"] += 1
            th = threading.Thread(target=reader)
            th.start()
            try:
                for _ in range(20):
                    w.remove("t")
                    w.populate("u", other)
                    w.remove("u")
                    w.populate("t", mine)
            finally:
                stop.set()
                th.join()
            assert seen["wrong"] == [], seen
    finally:
        drop_namespace(mc_client, namespace)


def test_table_api_removed_table_closed_by_a_failed_read(mc_client, namespace):
    # A removal that deleted some chunks but not the first (here the
    # Store refuses to delete it: remove() raises): a store that has the
    # table open finds a chunk missing at its next read of it, reads the
    # manifest again, and closes the table: TableNotFoundError, saying so.
    rows = make_rows(40, R, seed=2)
    f = Faulty(mc_client)

    def batch_remove(keys, force):
        keep = [k for k in keys if "/.chunk/t/" in k and k.endswith("/0")]
        res = mc_client.batch_remove([k for k in keys if k not in keep], force)
        it = iter(res)
        return [-600 if k in keep else next(it) for k in keys]
    f.batch_remove = batch_remove
    try:
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                     chunk_bytes=10 * R) as w, \
                engramstore.EngramStore(namespace=namespace, store_client=mc_client) as rd, \
                engramstore.EngramStore(namespace=namespace, store_client=f) as rm:
            w.populate("t", rows)
            keys = w.get_table_spec("t")["chunk_keys"]
            out = sentinel((40, 1, R))
            rd.lookup(["t"], np.arange(40, dtype=np.int64).reshape(40, 1), out)
            np.testing.assert_array_equal(out[:, 0], rows)
            with pytest.raises(engramstore.EngramError, match="INVALID_PARAMS"):
                rm.remove("t")
            assert rd.list_tables() == []
            out = sentinel((1, 1, R))
            with pytest.raises(engramstore.TableNotFoundError, match="no longer in the Mooncake"):
                rd.lookup(["t"], np.array([[31]], np.int64), out)
            assert (out == SENTINEL).all()
            assert mc_client.batch_is_exist(keys) == [1, 0, 0, 0]
            assert [n for n, code, _ in w.gc() if code == 0] == ["t"]  # the chunk left
            assert mc_client.batch_is_exist(keys) == [0, 0, 0, 0]
    finally:
        drop_namespace(mc_client, namespace)


def test_table_api_other_store_sees_published_tables(tables, mc_client, namespace):
    st, rows = tables
    st.populate("b", rows["b"])
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as other:
        assert other.list_tables() == ["b"]  # from the namespace's index
        out = sentinel((3, 1, R))
        other.lookup(["b"], np.array([[0], [169], [5]], np.int64), out)  # opened on first use
        np.testing.assert_array_equal(out[:, 0], rows["b"][[0, 169, 5]])
        assert other.list_tables() == ["b"]


def test_table_api_remove_verify_and_corruption(tables, mc_client, namespace):
    st, rows = tables
    st.populate("a", rows["a"])
    ids = np.arange(300, dtype=np.int64).reshape(300, 1)
    out = sentinel((300, 1, R))
    st.lookup(["a"], ids, out)  # now cached
    st.remove("a", force=True)
    with pytest.raises(engramstore.TableNotFoundError, match="removed"):
        st.lookup(["a"], ids, out)
    new = make_rows(300, R, seed=77)
    st.populate("a", new)
    st.lookup(["a"], ids, out)
    np.testing.assert_array_equal(out[:, 0], new)  # never the cached old rows
    # Data replaced behind the manifest's back: verify says so.
    key = st.get_table_spec("a")["chunk_keys"][0]
    assert key.startswith(f"{namespace}/.chunk/a/")
    mc_client.remove(key, True)
    assert mc_client.put(key, rows["a"].tobytes()) == 0
    with pytest.raises(engramstore.CorruptTableError, match="checksum"):
        st.verify("a")


def test_table_api_two_processes(mooncake, mc_client, namespace):
    sizes = [120, 80]
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as st:
        for h, n in enumerate(sizes):
            st.populate(f"t{h}", make_rows(n, R, seed=40 + h))
        res = run_child(mooncake, job="lookup_table", namespace=namespace, sizes=sizes,
                        row_bytes=R, seed=40, B=300)
        assert res["ok"] and res["tables"] == ["t0", "t1"], res
        for h in range(2):
            st.remove(f"t{h}", force=True)


def test_table_api_local_only_methods_say_so(tables):
    st, rows = tables
    with pytest.raises(engramstore.StateError, match="first wins"):
        st.populate_shared("a", rows["a"])
    with pytest.raises(engramstore.StateError, match="local namespace"):
        st.wait_for("a", timeout=0)
    with pytest.raises(engramstore.StateError, match="table file"):
        st.usage("a")


def test_table_api_list_tables_of_other_processes(mooncake, mc_client, namespace):
    # list_tables() names what any process published in the namespace, and
    # drops what any process removed.
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as st:
        assert st.list_tables() == []
        res = run_child(mooncake, job="tables", namespace=namespace, row_bytes=R,
                        ops=[["populate", "t1", 20, 1], ["populate", "t0", 30, 2], ["list"]])
        assert res == {"ok": True, "lists": [["t0", "t1"]]}, res
        assert st.list_tables() == ["t0", "t1"]
        st.populate("t2", make_rows(10, R, seed=3))
        st.remove("t1", force=True)
        res = run_child(mooncake, job="tables", namespace=namespace, row_bytes=R,
                        ops=[["list"], ["remove", "t2"], ["populate", "t1", 5, 4], ["list"]])
        assert res == {"ok": True, "lists": [["t0", "t2"], ["t0", "t1"]]}, res
        assert st.list_tables() == ["t0", "t1"]
        assert st.get_table_spec("t1")["num_rows"] == 5
        # Another namespace's tables are not this one's.
        with engramstore.EngramStore(namespace=namespace + "x", store_client=mc_client) as o:
            assert o.list_tables() == []
    drop_namespace(mc_client, namespace)


@pytest.mark.parametrize("where", ["store", "process"])
def test_table_api_cache_never_stale_after_republish(mooncake, mc_client, namespace, where):
    # A store whose row cache holds every row of a table: once another store
    # (or another process) removes the table and populates other rows under
    # its name, the next lookup returns the new rows, never a cached old
    # one; once it is removed for good, the lookup fails, all rows cached
    # or not.
    old, new = make_rows(64, R, seed=50), make_rows(64, R, seed=51)
    ids = np.arange(64, dtype=np.int64).reshape(64, 1)
    st = engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                 cache_bytes=1 << 20)
    other = engramstore.EngramStore(namespace=namespace, store_client=mc_client)
    try:
        st.populate("t", old)
        for _ in range(2):
            out = sentinel((64, 1, R))
            st.lookup(["t"], ids, out)
            np.testing.assert_array_equal(out[:, 0], old)
        hits = st.stats()["cache"]["hits"]
        assert hits == 64  # the second lookup came from the cache alone
        epoch = st.get_table_spec("t")["epoch"]
        if where == "store":
            other.remove("t", force=True)
            other.populate("t", new)
        else:
            res = run_child(mooncake, job="tables", namespace=namespace, row_bytes=R,
                            ops=[["remove", "t"], ["populate", "t", 64, 51]])
            assert res["ok"], res
        assert st.get_table_spec("t")["epoch"] != epoch
        for _ in range(2):
            out = sentinel((64, 1, R))
            st.lookup(["t"], ids, out)
            np.testing.assert_array_equal(out[:, 0], new)
        assert st.stats()["cache"]["hits"] == hits + 64  # the new rows, cached
        other.remove("t", force=True)
        out = sentinel((64, 1, R))
        with pytest.raises(engramstore.TableNotFoundError):
            st.lookup(["t"], ids, out)
        assert (out == SENTINEL).all()
        # Another size under the same name: ids are checked against it.
        other.populate("t", make_rows(8, R, seed=52))
        out = sentinel((8, 1, R))
        st.lookup(["t"], ids[:8], out)
        np.testing.assert_array_equal(out[:, 0], make_rows(8, R, seed=52))
        with pytest.raises(engramstore.BadIdError):
            st.lookup(["t"], ids, sentinel((64, 1, R)))
    finally:
        st.close()
        other.close()
        drop_namespace(mc_client, namespace)


def test_table_api_rows_gone_during_lookup(mc_client, namespace):
    # The rows of an open table removed behind the store's back (as between
    # its check and its read): the lookup checks again and fails with
    # TableNotFoundError, or reads the table populated since.
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as st:
        st.populate("t", make_rows(16, R, seed=60))
        key = st.get_table_spec("t")["chunk_keys"][0]
        f = Faulty(mc_client)
        with engramstore.EngramStore(namespace=namespace, store_client=f) as racy:
            out = sentinel((16, 1, R))
            racy.lookup(["t"], np.arange(16).reshape(16, 1), out)
            seen = []

            def exist_then_gone(keys):
                res = mc_client.batch_is_exist(keys)
                if key in keys and not seen:  # the check passes, then the rows go
                    seen.append(1)
                    assert mc_client.remove(key, True) == 0
                return res
            f.batch_is_exist = exist_then_gone
            with pytest.raises(engramstore.TableNotFoundError):
                racy.lookup(["t"], np.arange(16).reshape(16, 1), sentinel((16, 1, R)))
            assert seen == [1]
            st.remove("t", force=True)  # its manifest (its rows are gone)
            st.populate("t", make_rows(16, R, seed=61))
            seen.clear()
            key = st.get_table_spec("t")["chunk_keys"][0]
            out = sentinel((16, 1, R))
            racy.lookup(["t"], np.arange(16).reshape(16, 1), out)  # opens the new one
            np.testing.assert_array_equal(out[:, 0], make_rows(16, R, seed=61))
    drop_namespace(mc_client, namespace)


def test_table_api_writer_gone(tmp_path):
    # A Mooncake object lives in the segment of the client the master put it
    # in; here the writer's is the only segment, so when the writer goes,
    # its tables go with it.  A lookup then says that the Mooncake Store no
    # longer holds the table, and why, never that a memory store lacks it.
    import mcserver
    mcserver.require_mooncake()
    srv = mcserver.MooncakeServers(str(tmp_path))
    srv.start()
    c = writer = None
    try:
        c = srv.client()  # no segment: it holds nothing
        ids, out = np.arange(4, dtype=np.int64).reshape(4, 1), sentinel((4, 1, R))
        # A writer process that exits.
        res = run_child(srv, job="tables", namespace="gone", row_bytes=R, segment=32 << 20,
                        ops=[["populate", "t", 64, 70]])
        assert res["ok"], res
        with engramstore.EngramStore(namespace="gone", store_client=c) as fresh:
            with pytest.raises(engramstore.TableNotFoundError) as ei:
                fresh.lookup(["t"], ids, out)
            msg = str(ei.value)
            assert msg.startswith("tables[0]: table 't' is not in the Mooncake namespace "
                                  "'gone': the Mooncake Store holds no manifest of it"), msg
            assert "memory segment" in msg and "its process exits" in msg, msg
            assert "memory store" not in msg, msg
        # A writer client that closes while a reader has its table open.
        writer = srv.client(segment_bytes=32 << 20)
        with engramstore.EngramStore(namespace="gone2", store_client=writer) as w:
            w.populate("t", make_rows(64, R, seed=71))
            key = w.get_table_spec("t")["chunk_keys"][0]
        with engramstore.EngramStore(namespace="gone2", store_client=c) as early:
            early.lookup(["t"], ids, out)
            np.testing.assert_array_equal(out[:, 0], make_rows(64, R, seed=71)[:4])
            writer.close()
            writer = None
            out = sentinel((4, 1, R))
            with pytest.raises(engramstore.TableNotFoundError) as ei:
                early.lookup(["t"], ids, out)
            msg = str(ei.value)
            assert msg.startswith("tables[0]: table 't' is no longer in the Mooncake "
                                  f"namespace 'gone2': its rows ({key}) are gone"), msg
            assert "memory segment" in msg and "memory store" not in msg, msg
            assert (out == SENTINEL).all()
    finally:
        for cl in (writer, c):
            if cl is not None:
                cl.close()
        srv.stop()


def test_table_api_cache_never_stale_after_the_namespace_is_lost(mc_client, namespace):
    # Every object of a namespace gone at once behind a reader's back (the
    # segment that held them left, or a master restarted empty), then the
    # table populated again by a writer that never saw the old records.
    # The reader, which had the old table open with its rows cached, must
    # read the new rows, never the old.
    old, new = make_rows(64, R, seed=80), make_rows(64, R, seed=81)
    ids = np.arange(64, dtype=np.int64).reshape(64, 1)
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client,
                                 cache_bytes=1 << 20) as reader:
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as w:
            w.populate("t", old)
            spec = w.get_table_spec("t")
        for _ in range(2):
            out = sentinel((64, 1, R))
            reader.lookup(["t"], ids, out)
            np.testing.assert_array_equal(out[:, 0], old)
        assert reader.stats()["cache"]["hits"] == 64
        lost = spec["chunk_keys"] + namespace_objects(mc_client, namespace, ["t"])
        assert len(lost) >= 3  # its chunk, its record's version, the names index entry
        for key in lost:
            assert mc_client.remove(key, True) == 0
        with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as w2:
            w2.populate("t", new)
        out = sentinel((64, 1, R))
        reader.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out[:, 0], new)
    drop_namespace(mc_client, namespace)


def test_table_api_populate_races(mc_client, namespace):
    # Stores populating at once: every distinct table is published with its
    # own epoch; of writers of the same name exactly one wins, and the
    # losers leave no rows behind.
    chunks = []

    def recording():
        f = Faulty(mc_client)

        def batch_put_from(keys, *args):
            chunks.extend(k for k in keys if "/.chunk/same/" in k)
            return mc_client.batch_put_from(keys, *args)
        f.batch_put_from = batch_put_from
        return f
    stores = [engramstore.EngramStore(namespace=namespace, store_client=recording())
              for _ in range(4)]
    won, lost = [], []

    def work(i):
        stores[i].populate(f"d{i}", make_rows(8, R, seed=70 + i))
        try:
            stores[i].populate("same", make_rows(8, R, seed=80 + i))
            won.append(i)
        except engramstore.TableExistsError:
            lost.append(i)
    try:
        assert run_in_threads(work, n=4) == []
        assert len(won) == 1 and len(lost) == 3
        assert stores[0].list_tables() == ["d0", "d1", "d2", "d3", "same"]
        epochs = [stores[0].get_table_spec(f"d{i}")["epoch"] for i in range(4)]
        assert len(set(epochs)) == 4
        out = sentinel((8, 1, R))
        stores[lost[0]].lookup(["same"], np.arange(8).reshape(8, 1), out)
        np.testing.assert_array_equal(out[:, 0], make_rows(8, R, seed=80 + won[0]))
        have = [k for k, e in zip(chunks, mc_client.batch_is_exist(chunks)) if e == 1]
        assert have == stores[won[0]].get_table_spec("same")["chunk_keys"], (have, chunks)
    finally:
        for s in stores:
            s.close()
        drop_namespace(mc_client, namespace)


def test_table_api_bad_records(mc_client, namespace):
    # Objects of the namespace that are not what the protocol writes: a
    # record version that holds no manifest is a corrupt table, said so
    # naming the record; objects of another layout (the JSON manifests of
    # earlier releases) are no tables of the namespace.
    rec = f"{namespace}/.rec/bad/0"
    assert mc_client.put(f"{namespace}/.names/0", b"bad") == 0
    assert mc_client.put(rec, b"V" + bytes(8) + b"engram-redis 1\nname bad\n") == 0
    assert mc_client.put(f"{namespace}/.manifest/old", b'{"format": "engramstore-mooncake/3"}') == 0
    with engramstore.EngramStore(namespace=namespace, store_client=mc_client) as st:
        with pytest.raises(engramstore.CorruptTableError, match="bad"):
            st.get_table_spec("bad")
        with pytest.raises(engramstore.CorruptTableError, match="bad"):
            st.lookup(["bad"], np.zeros((1, 1), np.int64), sentinel((1, 1, R)))
        with pytest.raises(engramstore.TableNotFoundError):
            st.get_table_spec("old")
        with pytest.raises(engramstore.TableNotFoundError):
            st.lookup(["old"], np.zeros((1, 1), np.int64), sentinel((1, 1, R)))
        # A populate of the bad name is refused, not written over it.
        with pytest.raises(engramstore.EngramError):
            st.populate("bad", make_rows(4, R, seed=1))
        assert bytes(mc_client.get(rec)).startswith(b"V")
    for k in (rec, f"{namespace}/.names/0", f"{namespace}/.manifest/old"):
        mc_client.remove(k, True)


# ---- reads in flight at once (read_calls) ------------------------------------

@pytest.mark.parametrize("read_calls", [1, 3])
def test_read_calls_exact(mc_client, layer_id, monkeypatch, read_calls):
    # A lookup's rows split over calls in flight at once, in waves through
    # the staging buffer: every row exact, every call bounded, and the keys
    # of the calls in flight together within MAX_KEYS.
    monkeypatch.setattr(engramstore._mooncake, "MIN_CALL_ROWS", 8)
    monkeypatch.setattr(engramstore._mooncake, "MAX_KEYS", 4)
    f = Faulty(mc_client)
    seen = []

    def get_into_ranges(bufs, keys, dsts, srcs, sizes):
        seen.append((threading.get_ident(), sum(len(d) for d in dsts[0]), len(keys[0])))
        return mc_client.get_into_ranges(bufs, keys, dsts, srcs, sizes)
    f.get_into_ranges = get_into_ranges
    t = engramstore.EngramStore({layer_id: cfg()}, f, max_ranges=40, read_calls=read_calls)
    bufs = heads(layer_id)
    t.populate(layer_id, bufs)
    try:
        assert t.stats()["mooncake"]["read_calls"] == read_calls
        for rnd in range(3):
            ids = rand_ids(rnd, 4, 50, dead=True)
            out = sentinel((4, 50, 3, R))
            seen.clear()
            t.lookup_into(layer_id, ids, out)
            np.testing.assert_array_equal(out, expect(bufs, ids))
            n = sum(len(np.unique(ids[..., h][ids[..., h] >= 0])) for h in range(3))
            assert sum(r for _, r, _ in seen) == n  # each distinct row read once
            assert all(r <= 40 for _, r, _ in seen)
            assert all(k <= max(1, 4 // read_calls) for _, _, k in seen)
            if read_calls > 1:  # split into at least read_calls calls, on more than one thread
                assert len(seen) >= read_calls and len({tid for tid, _, _ in seen}) > 1
            else:
                assert len(seen) == -(-n // 40) and len({tid for tid, _, _ in seen}) == 1
        # Small reads are not split: one call.
        seen.clear()
        out = sentinel((1, 2, 3, R))
        t.lookup_into(layer_id, np.zeros((1, 2, 3), np.int64), out)
        assert len(seen) == 1
    finally:
        t.remove_from_store(layer_id, force=True)
        t.close()


class _ModelClock:
    """The clock the adaptation of read_calls reads (_mooncake's
    time.perf_counter), run by a model of the reads' costs instead of the
    machine: each read is one wave of calls at once (asserted below), and
    it takes the longest of its calls' costs where calls overlap
    ("waiting": a round trip each) or their sum where a transport runs them
    one at a time ("serialised").  What the adaptation measures is then the
    model, exactly, whatever the scheduler does with the calls' threads."""

    def __init__(self, overlap: bool) -> None:
        self.overlap = overlap
        self.now = 0.0
        self.costs: list[float] = []
        self.lock = threading.Lock()

    def call(self, cost: float) -> None:
        with self.lock:
            self.costs.append(cost)

    def perf_counter(self) -> float:
        # Read at a read's start (no calls yet) and at its end.
        with self.lock:
            if self.costs:
                self.now += max(self.costs) if self.overlap else sum(self.costs)
                self.costs.clear()
            return self.now


@pytest.mark.parametrize("model", ["waiting", "serialised"])
def test_read_calls_adapt(mc_client, layer_id, monkeypatch, model):
    # read_calls=None (the default) settles on what the reads measure: calls
    # that mostly wait (a round trip) overlap, so 4 at once read fastest;
    # calls that a transport runs one at a time, each with a fixed cost,
    # only add that cost, so one call is fastest.  Rows stay exact.  The
    # times measured are the model's (_ModelClock), not the machine's: on a
    # busy machine, calls' threads that start late would make any choice
    # look fastest.
    monkeypatch.setattr(engramstore._mooncake, "MIN_CALL_ROWS", 8)
    clock = _ModelClock(overlap=model == "waiting")
    monkeypatch.setattr(engramstore._mooncake, "time", types.SimpleNamespace(
        perf_counter=clock.perf_counter, monotonic=time.monotonic, sleep=time.sleep))
    f = Faulty(mc_client)
    calls = []

    def get_into_ranges(bufs, keys, dsts, srcs, sizes):
        n = sum(len(d) for d in dsts[0])
        calls.append(n)
        # A round trip of 0.5 ms a row; or 50 ms a call plus 0.1 ms a row
        # (2 calls one after the other cost 1.8x one).
        clock.call(0.0005 * n if model == "waiting" else 0.05 + 0.0001 * n)
        return mc_client.get_into_ranges(bufs, keys, dsts, srcs, sizes)
    f.get_into_ranges = get_into_ranges
    t = engramstore.EngramStore({layer_id: cfg()}, f)
    bufs = heads(layer_id)
    t.populate(layer_id, bufs)
    try:
        st = t.stats()["mooncake"]
        assert st["read_calls_adaptive"] and st["read_calls"] == 4
        per_lookup = []
        for rnd in range(48):
            ids = rand_ids(100 + rnd, 4, 25)
            out = sentinel((4, 25, 3, R))
            calls.clear()
            t.lookup_into(layer_id, ids, out)
            np.testing.assert_array_equal(out, expect(bufs, ids))
            assert len(calls) in (1, 2, 4)  # one wave of calls: what the clock models
            per_lookup.append(len(calls))
        st = t.stats()["mooncake"]
        want = 4 if model == "waiting" else 1
        assert st["read_calls"] == want, st
        # The last 32 lookups: the chosen number but for its explorations
        # (every 16th read tries a neighbour).
        assert sum(n == want for n in per_lookup[-32:]) == 30, per_lookup
        assert set(st["read_time_per_row"]) == {1, 2, 4}
    finally:
        t.remove_from_store(layer_id, force=True)
        t.close()


def test_read_calls_one_fails(mc_client, layer_id, monkeypatch):
    # One of the calls in flight fails for good: the lookup fails naming its
    # key, after every other call ended; the output holds exact rows or
    # none, and the next lookup is exact.
    monkeypatch.setattr(engramstore._mooncake, "MIN_CALL_ROWS", 8)
    f = Faulty(mc_client)
    ended = []

    def get_into_ranges(bufs, keys, dsts, srcs, sizes):
        res = mc_client.get_into_ranges(bufs, keys, dsts, srcs, sizes)
        if fail and keys[0][-1].endswith(":h2"):  # the call with head 2's rows
            res[0][-1] = [-600] * len(dsts[0][-1])
            ended.append("failed")
        else:
            time.sleep(0.2)  # still in flight when the failure is known
            ended.append("ok")
        return res
    f.get_into_ranges = get_into_ranges
    t = engramstore.EngramStore({layer_id: cfg()}, f, read_calls=3)
    bufs = heads(layer_id)
    fail = False  # populate reads rows back through it too
    t.populate(layer_id, bufs)
    try:
        fail = True
        ids = rand_ids(5, 4, 60)
        out = sentinel((4, 60, 3, R))
        with pytest.raises(engramstore.EngramError) as ei:
            t.lookup_into(layer_id, ids, out)
        assert isinstance(ei.value.__cause__, engramstore.MooncakeError)
        assert f"engram:l{layer_id}:h2" in str(ei.value)
        assert "ok" in ended and ended[-1] == "ok"  # the others ended before the error
        assert served_or_untouched(out, bufs, ids)
        fail = False
        out = sentinel((4, 60, 3, R))
        t.lookup_into(layer_id, ids, out)
        np.testing.assert_array_equal(out, expect(bufs, ids))
    finally:
        t.remove_from_store(layer_id, force=True)
        t.close()


def test_read_calls_refused(mc_client):
    for bad in (0, -1, True, 2.0, "auto"):
        with pytest.raises(ValueError, match="read_calls"):
            engramstore.EngramStore({1: cfg()}, mc_client, read_calls=bad)
        with pytest.raises(ValueError, match="read_calls"):
            engramstore.EngramStore(namespace="nsx", store_client=mc_client, read_calls=bad)
    with pytest.raises(TypeError, match="read_calls"):
        engramstore.EngramStore({1: cfg()}, None, read_calls=2)


def test_cache_keep_all_refused(mc_client):
    # Not a truth value: a flag that is not a bool is refused, not read as
    # true or false.
    for bad in (1, 0, "yes", None):
        with pytest.raises(TypeError, match=r"^cache_keep_all: expected a bool, got "):
            engramstore.EngramStore({1: cfg()}, mc_client, cache_keep_all=bad)
