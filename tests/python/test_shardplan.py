"""Shard plans (engramstore.shard_plan): hand-computed ranges for 2 layers x
24 heads on TP 4 x DP 2, refusals, balanced plans from read counts, and a
rank looking up global ids through its plan's tables and offsets."""
from __future__ import annotations

import json

import numpy as np
import pytest

import engramstore
from esutil import make_rows

# 24 prime-sized heads per layer (small stand-ins for DeepSeek's buckets).
SIZES = [101, 103, 107, 109, 113, 127, 131, 137, 139, 149, 151, 157,
         163, 167, 173, 179, 181, 191, 193, 197, 199, 211, 223, 227]
STARTS = [sum(SIZES[:h]) for h in range(25)]


def test_head_wise_tp4_dp2_per_rank():
    p = engramstore.shard_plan(SIZES, tp=4, dp=2, layers=(1, 14))
    assert p["schema"] == 1 and p["mode"] == "per_rank" and p["plan"] == "head_wise"
    assert [s["heads"] for s in p["shards"]] == [[3 * i, 3 * i + 1, 3 * i + 2] for i in range(8)]
    assert len(p["ranks"]) == 8
    r = next(r for r in p["ranks"] if (r["tp_rank"], r["dp_rank"]) == (1, 1))
    assert r["shard"] == 3  # TP-major: 1 * 2 + 1
    l14 = r["layers"]["14"]
    assert l14["tables"] == ["engram:l14:h9", "engram:l14:h10", "engram:l14:h11"]
    assert l14["offsets"] == [STARTS[9], STARTS[10], STARTS[11]]
    assert (l14["row_start"], l14["row_end"]) == (STARTS[9], STARTS[12])
    json.dumps(p)  # JSON-ready as it is
    assert "imbalance" not in p


def test_head_wise_per_tp_shares_between_dp_peers():
    p = engramstore.shard_plan(SIZES, tp=4, dp=2, per_tp=True)
    assert [s["heads"][0] for s in p["shards"]] == [0, 6, 12, 18]
    peers = [r for r in p["ranks"] if r["tp_rank"] == 2]
    assert [r["shard"] for r in peers] == [2, 2]
    assert peers[0]["layers"] == peers[1]["layers"]


def test_refusals():
    with pytest.raises(engramstore.SpecError, match="needs 32 shards"):
        engramstore.shard_plan(SIZES, tp=4, dp=8)
    with pytest.raises(engramstore.SpecError, match="leaves shard 6 without a head"):
        engramstore.shard_plan(SIZES, tp=7)
    with pytest.raises(TypeError, match="needs reads"):
        engramstore.shard_plan(SIZES, tp=7, balanced=True)
    with pytest.raises(ValueError, match="24 counts"):
        engramstore.shard_plan(SIZES, tp=2, reads=[1, 2, 3])
    with pytest.raises(ValueError, match="same number of heads"):
        engramstore.shard_plan({1: SIZES, 2: SIZES[:5]}, tp=1)
    with pytest.raises(ValueError, match="0 rows"):
        engramstore.shard_plan([5, 0], tp=1)
    with pytest.raises(engramstore.EngramError):
        engramstore.shard_plan(SIZES, tp=0)


def test_balanced_from_stats():
    # Two hot heads (0 and 23) in both layers, as stats()["tables"] gives.
    tables = {f"engram:l{L}:h{h}": {"rows": (5000 if h in (0, 23) else 100)}
              for L in (1, 14) for h in range(24)}
    tables["other"] = {"rows": 10**9}  # not a layer table: ignored
    head = engramstore.shard_plan(SIZES, tp=4, reads=tables)
    bal = engramstore.shard_plan(SIZES, tp=4, reads=tables, balanced=True)
    assert [s["reads"] for s in head["shards"]] == [11000, 1200, 1200, 11000]
    assert max(s["reads"] for s in bal["shards"]) == 10000  # a hot head alone (x2 layers)
    assert bal["shards"][0]["heads"] == [0]
    assert bal["imbalance"]["balanced"] < head["imbalance"]["head_wise"]
    assert bal["imbalance"]["head_wise"] == head["imbalance"]["head_wise"]
    # 7 shards: refused head-wise, balanced every shard has a head.
    p = engramstore.shard_plan(SIZES, tp=7, reads=[1] * 24, balanced=True)
    assert all(s["heads"] for s in p["shards"]) and p["imbalance"]["head_wise"] is None


def test_a_rank_looks_up_global_ids_through_its_plan(local_dir):
    cfg = engramstore.EngramStoreConfig(SIZES, 264)
    p = engramstore.shard_plan({1: cfg}, tp=4, dp=2)
    rank = p["ranks"][5]["layers"]["1"]          # tp 2, dp 1: shard 5, heads 15-17
    heads = [int(t.rsplit("h", 1)[1]) for t in rank["tables"]]
    with engramstore.EngramStore(namespace="plan", local_dir=local_dir) as st:
        rows = {h: make_rows(SIZES[h], 264, seed=h) for h in heads}
        for t, h in zip(rank["tables"], heads):
            st.populate(t, rows[h])
        # Global ids in the rank's range, one column per head.
        ids = np.array([[rank["offsets"][k] + (7 * k) % SIZES[h] for k, h in enumerate(heads)],
                        [rank["offsets"][k] + SIZES[h] - 1 for k, h in enumerate(heads)]], np.int64)
        assert ((ids >= rank["row_start"]) & (ids < rank["row_end"])).all()
        out = np.empty((2, 3, 264), np.uint8)
        st.lookup(rank["tables"], ids, out, offsets=np.array(rank["offsets"], np.int64))
        for k, h in enumerate(heads):
            assert (out[:, k] == rows[h][ids[:, k] - rank["offsets"][k]]).all()


def test_row_wise_plan_and_route():
    """More ranks than heads: each layer's rows cut evenly, heads split,
    and every id routed to the rank whose range holds it; each rank's
    table of its range, looked up with offset row_start, gives the rows
    of the whole layer."""
    lay = engramstore.NgramLayout(layer_ids=[1, 14], vocab_size=100, max_ngram=3, heads=2,
                                  compressed_vocab=50, pad_id=0)
    sizes = {1: lay.primes[0].tolist(), 14: lay.primes[1].tolist()}
    plan = engramstore.shard_plan(sizes, tp=4, dp=2, by_rows=True)
    assert plan["plan"] == "row_wise" and len(plan["shards"]) == 8 and len(plan["ranks"]) == 8
    for lid, v in sizes.items():
        bounds = [(s["layers"][str(lid)]["row_start"], s["layers"][str(lid)]["row_end"])
                  for s in plan["shards"]]
        assert bounds[0][0] == 0 and bounds[-1][1] == sum(v)
        assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
        assert max(e - s for s, e in bounds) - min(e - s for s, e in bounds) <= 1
    # Routing against a search of the bounds, DEAD to -1.
    rng = np.random.default_rng(3)
    ids = rng.integers(0, lay.num_rows[1], 500)
    ids[::37] = -1
    got = engramstore.shard_route(plan, 14, ids)
    starts = np.array([s["layers"]["14"]["row_start"] for s in plan["shards"]])
    want = np.where(ids < 0, -1, np.searchsorted(starts, ids, side="right") - 1)
    assert got.dtype == np.int32 and (got == want).all()
    # End to end: rank r's table holds its rows; routed lookups give the layer's rows.
    R = 8
    whole = rng.integers(0, 256, (lay.num_rows[1], R), np.uint8)
    st = engramstore.TableStore(local_dir=None)
    for rk in plan["ranks"]:
        L = rk["layers"]["14"]
        st.bind(f"r{rk['shard']}", whole[L["row_start"]:L["row_end"]])
    gids = engramstore.NgramHasher(lay).hash(np.array([3, 9, 49, -1, 7]), layer=14).reshape(-1)
    owner = engramstore.shard_route(plan, 14, gids)
    out = np.zeros((len(gids), 1, R), np.uint8)
    for s in range(8):
        sel = owner == s
        if sel.any():
            o = np.zeros((int(sel.sum()), 1, R), np.uint8)
            st.lookup([f"r{s}"], gids[sel].reshape(-1, 1), o,
                      offsets=np.array([plan["shards"][s]["layers"]["14"]["row_start"]]))
            out[sel] = o
    assert (out[:, 0] == whole[gids]).all()
    st.close()
    # Bad inputs.
    out = np.full(3, 7, np.int32)
    with pytest.raises(engramstore.BadIdError, match=r"ids\[1\] = " + str(lay.num_rows[1])):
        engramstore.shard_route(plan, 14, np.array([0, lay.num_rows[1], 2]), out=out)
    assert (out == 7).all()
    with pytest.raises(ValueError, match="no row-wise plan of layer 2"):
        engramstore.shard_route(plan, 2, np.array([0]))
    with pytest.raises(TypeError, match="no reads or balanced"):
        engramstore.shard_plan(sizes, tp=2, by_rows=True, reads=[1] * 4)
    with pytest.raises(engramstore.SpecError, match="only 11 rows"):
        engramstore.shard_plan([5, 6], tp=12, by_rows=True)


def test_row_wise_bad_inputs():
    plan = engramstore.shard_plan([5, 6], tp=4, by_rows=True)
    ro = np.zeros(1, np.int32)
    ro.flags.writeable = False
    for ids, out, exc, text in [
        (np.array([1]), np.zeros(1, np.int64), TypeError, "out: expected a contiguous 1-D int32 array of 1, got int64"),
        (np.array([1, 2]), np.zeros(1, np.int32), TypeError, "out: expected a contiguous 1-D int32 array of 2"),
        (np.array([1]), ro, ValueError, "out: the array is read-only"),
        (np.array([1]), [0], TypeError, "out: expected an array, got a Python list"),
        (np.array([1.0]), np.zeros(1, np.int32), TypeError, "ids: expected a contiguous 1-D int64 array, got float64"),
        (np.array([1], np.int32), np.zeros(1, np.int32), TypeError, "ids: .* int64 array, got int32"),
        (np.array([1], np.uint64), np.zeros(1, np.int32), TypeError, "ids: .* int64 array, got uint64"),
        (np.array([-2]), np.full(1, 7, np.int32), engramstore.BadIdError, r"ids\[0\] = -2 is outside the plan's rows \(0 <= id < 11\)"),
        (np.array([11]), np.full(1, 7, np.int32), engramstore.BadIdError, r"ids\[0\] = 11 is outside"),
        (np.array([2**63 - 1]), np.full(1, 7, np.int32), engramstore.BadIdError, r"ids\[0\] = 9223372036854775807"),
        (np.array([-2**63]), np.full(1, 7, np.int32), engramstore.BadIdError, r"ids\[0\] = -9223372036854775808"),
    ]:
        with pytest.raises(exc, match=text):
            engramstore.shard_route(plan, 0, ids, out=out)
        if isinstance(out, np.ndarray) and out.flags.writeable and out.dtype == np.int32:
            assert (out == 7).all() or not out.any()
    # Nothing to route.
    assert engramstore.shard_route(plan, 0, np.zeros(0, np.int64)).shape == (0,)
    assert engramstore.shard_route(plan, 0, []).shape == (0,)
    # Plans that are not a row-wise plan's.
    for bad, exc, text in [
        ({"row_shards": {"0": [[0, 5, 0, 0], [6, 11, 1, 1]]}}, ValueError,
         r"shards\[1\] does not follow the shard before it"),
        ({"row_shards": {"0": [[1, 5, 0, 0]]}}, ValueError, r"shards\[0\] does not follow"),
        ({"row_shards": {"0": [[0, 0, 0, 0]]}}, ValueError, r"shards\[0\] does not follow"),
        ({"row_shards": {"0": []}}, ValueError, "shards: expected at least one shard"),
        ({"row_shards": {"0": [[-1, 5, 0, 0]]}}, ValueError, r"shards\[0\] does not follow"),
        ({"row_shards": {}}, ValueError, "no row-wise plan of layer 0"),
        ({}, ValueError, "no row-wise plan of layer 0"),
    ]:
        with pytest.raises(exc, match=text):
            engramstore.shard_route(bad, 0, np.array([1]))
    # Head rows and topologies the row-wise plan refuses.
    for head_rows, kw, exc, text in [
        ([5, -6], {}, ValueError, "head_rows: layer 0 has a head of -6 rows"),
        ([5, 0], {}, ValueError, "head_rows: layer 0 has a head of 0 rows"),
        ([], {}, ValueError, "head_rows: a layer of 0 heads"),
        ({}, {}, ValueError, "head_rows: no layer"),
        ({1: [5, 6], 2: [5]}, {}, ValueError, "every layer needs the same number of heads"),
        ([2**62, 2**62, 2**62], {}, engramstore.SpecError, "add up past 2\\^63"),
        ([5, 6], {"tp": 0}, engramstore.EngramError, "TP 0 x DP 1"),
        ([5, 6], {"dp": 0}, engramstore.EngramError, "TP 2 x DP 0"),
        ([5, 6], {"tp": 2.0}, TypeError, "float"),
        ([5, 6], {"balanced": True}, TypeError, "no reads or balanced"),
    ]:
        with pytest.raises(exc, match=text):
            engramstore.shard_plan(head_rows, **{"tp": 2, "by_rows": True, **kw})


def test_route_without_out_takes_int_ids_only():
    """Without out, ids are made int64 only when that keeps them: floats are
    refused, not truncated (1.7 was routed as row 1), and a uint64 past
    int64 is refused, not wrapped (2**64 - 1 was -1, DEAD: shard -1)."""
    plan = engramstore.shard_plan([5, 6], tp=4, by_rows=True)
    for ids, exc, text in [(np.array([1.7, 9.2]), TypeError, "ids: expected int64 row ids, got float64"),
                           ([1.7], TypeError, "ids: expected int64 row ids, got float64"),
                           (np.array([True]), TypeError, "got bool"),
                           (np.array([3, 2**64 - 1], np.uint64), ValueError,
                            r"ids\[1\] = 18446744073709551615 does not fit int64")]:
        with pytest.raises(exc, match=text):
            engramstore.shard_route(plan, 0, ids)
    want = engramstore.shard_route(plan, 0, np.array([0, 3, 10, -1]))
    assert want.tolist() == [0, 1, 3, -1]
    for ids in ([0, 3, 10, -1], np.array([0, 3, 10, -1], np.int32), np.array([0, 3, 10, 20, -1])[[0, 1, 2, 4]]):
        assert engramstore.shard_route(plan, 0, ids).tolist() == want.tolist()
    assert engramstore.shard_route(plan, 0, np.array([0, 3, 10], np.uint64)).tolist() == [0, 1, 3]


@pytest.mark.parametrize("by_rows", [False, True])
def test_topology_outside_uint32(by_rows):
    """tp and dp are counts the C API takes as uint32: a negative or larger
    one is refused naming it (it was taken modulo 2**32: tp=-1 asked for
    2**32 - 1 shards, a bare MemoryError, and tp=2**32 + 2 planned 2
    shards, then failed on its 2**32 + 2 ranks with an IndexError)."""
    for kw, exc, text in [({"tp": -1}, ValueError, r"tp: expected an int in \[0, 4294967295\], got -1"),
                          ({"tp": 2**32 + 2}, ValueError, "tp: expected an int in .* got 4294967298"),
                          ({"tp": 2, "dp": -1}, ValueError, "dp: expected an int in .* got -1"),
                          ({"tp": 2, "dp": 2**32}, ValueError, "dp: expected an int in"),
                          ({"tp": 2.0}, TypeError, "tp: expected an int, got float"),
                          ({"tp": "2"}, TypeError, "tp: expected an int, got str")]:
        with pytest.raises(exc, match=text):
            engramstore.shard_plan([5, 6, 7, 8], by_rows=by_rows, **kw)
    plan = engramstore.shard_plan([5, 6, 7, 8], tp=np.int64(2), dp=np.int32(1), by_rows=by_rows)
    assert len(plan["shards"]) == 2 and len(plan["ranks"]) == 2


@pytest.mark.parametrize("by_rows", [False, True])
def test_head_rows_are_ints(by_rows):
    """Head sizes are row counts: a float or a string is refused naming it
    (int() made a head of 5.5 rows one of 5, and the string "56" two heads
    of 5 and 6 rows), and so is a head past 2**63 - 1 (a bare OverflowError
    of the row-wise plan's C call)."""
    for head_rows, exc, text in [([5.5, 6], TypeError, r"head_rows: head 0 has 5.5 rows, not an int"),
                                 ("56", TypeError, "head_rows: expected a list of row counts, got str"),
                                 (56, TypeError, "head_rows: expected a list of row counts, got int"),
                                 ([5, None], TypeError, "head_rows: head 1 has None rows"),
                                 ({1: [5, 6.0]}, TypeError, r"head_rows\[1\]: head 1 has 6.0 rows"),
                                 ({1: "56"}, TypeError, r"head_rows\[1\]: expected a list"),
                                 ([2**64, 1], ValueError, "a head of 18446744073709551616 rows, past 2\\*\\*63 - 1")]:
        with pytest.raises(exc, match=text):
            engramstore.shard_plan(head_rows, tp=2, by_rows=by_rows)
    want = engramstore.shard_plan([5, 6], tp=2, by_rows=by_rows)
    assert engramstore.shard_plan(np.array([5, 6]), tp=2, by_rows=by_rows) == want
    assert engramstore.shard_plan([np.int64(5), 6], tp=2, by_rows=by_rows) == want


def test_route_names_the_shape_it_refuses():
    """An int64 array of the wrong shape, or with strides, was refused as
    "got int64", naming nothing wrong: the shape is named, and strides."""
    plan = engramstore.shard_plan([5, 6], tp=4, by_rows=True)
    for ids, out, text in [
        (np.array([[1, 2]]), np.zeros(2, np.int32), r"ids: expected a contiguous 1-D int64 array, got int64 of shape \(1, 2\)$"),
        (np.arange(6)[::2], np.zeros(3, np.int32), r"ids: .* got int64 of shape \(3,\) \(not contiguous\)$"),
        (np.arange(3), np.zeros((3, 1), np.int32), r"out: expected a contiguous 1-D int32 array of 3, got int32 of shape \(3, 1\)$"),
        (np.arange(3), np.zeros(6, np.int32)[::2], r"out: .* got int32 of shape \(3,\) \(not contiguous\)$"),
        (np.arange(3), np.zeros(2, np.int32), r"out: .* array of 3, got int32 of shape \(2,\)$"),
    ]:
        with pytest.raises(TypeError, match=text):
            engramstore.shard_route(plan, 0, ids, out=out)
    with pytest.raises(TypeError, match=r"ids: .* got int64 of shape \(1, 2\)$"):
        engramstore.shard_route(plan, 0, np.array([[1, 2]]))
