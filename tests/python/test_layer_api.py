"""The layer API (Mooncake-compatible): EngramStore({layer_id: cfg}, store=...)."""
from __future__ import annotations

import errno
import gc
import sys
import weakref

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, make_rows, sentinel

SIZES = {1: [17, 19], 14: [5, 7, 3]}
R = 264


def layer_rows(layer_id):
    return [make_rows(n, R, seed=100 * layer_id + h) for h, n in enumerate(SIZES[layer_id])]


def expected_layer(bufs, row_ids, out=None):
    B, L, H = row_ids.shape
    res = sentinel((B, L, H, R)) if out is None else out.copy()
    for h in range(H):
        ids = row_ids[:, :, h]
        live = ids != -1
        res[:, :, h][live] = np.take(bufs[h], ids[live], axis=0)
    return res


def random_ids(layer_id, B, L, seed, dead=False):
    rng = np.random.default_rng(seed)
    cols = [rng.integers(-1 if dead else 0, n, (B, L)) for n in SIZES[layer_id]]
    return np.stack(cols, axis=-1).astype(np.int64)


@pytest.fixture
def configs(config):
    return {l: config(s, R) for l, s in SIZES.items()}


@pytest.fixture
def local_store(local_dir):
    st = engramstore.LocalStore(local_dir, "model-x")
    yield st
    st.close()


@pytest.fixture
def populated(configs, local_store):
    t = engramstore.EngramStore(configs, store=local_store)
    bufs = {l: layer_rows(l) for l in SIZES}
    for l in SIZES:
        t.populate(l, bufs[l])
    yield t, bufs
    t.close()


def test_config_defaults_and_fields():
    cfg = engramstore.EngramStoreConfig()
    assert cfg.row_bytes == 0
    assert list(cfg.table_vocab_sizes) == []
    cfg.table_vocab_sizes = [17, 19]
    cfg.row_bytes = 264
    assert "264" in repr(cfg) and "[17, 19]" in repr(cfg)
    cfg2 = engramstore.EngramStoreConfig([3], 8)
    assert cfg2.table_vocab_sizes == [3] and cfg2.row_bytes == 8
    with pytest.raises(AttributeError):
        cfg.other = 1


def test_getters(configs):
    t = engramstore.EngramStore(configs, store=None)
    assert isinstance(t, engramstore.EngramStore)
    assert isinstance(t, engramstore.LayerStore)
    assert t.get_layer_ids() == [1, 14]
    assert t.get_table_vocab_sizes(1) == [17, 19]
    assert t.get_table_vocab_sizes(14) == [5, 7, 3]
    assert t.get_store_keys(1) == ["engram:l1:h0", "engram:l1:h1"]
    assert t.get_store_keys(14) == ["engram:l14:h0", "engram:l14:h1", "engram:l14:h2"]
    assert t.get_num_heads(1) == 2 and t.get_num_heads(14) == 3
    assert t.get_row_bytes(1) == 264 == t.get_row_bytes(14)
    assert t.store is None
    for getter in (t.get_table_vocab_sizes, t.get_store_keys, t.get_num_heads,
                   t.get_row_bytes):
        with pytest.raises(ValueError, match="^layer_id: 2 is not a layer"):
            getter(2)
    t.close()


def test_layers_keyword_and_positional_store(configs, local_store):
    t = engramstore.EngramStore(configs, local_store)
    assert t.store is local_store
    t2 = engramstore.EngramStore(layers=configs)
    assert t2.store is None
    t.close()
    t2.close()


def test_config_validation(config):
    ok = config([3], 8)
    unset = engramstore.EngramStoreConfig()
    unset.table_vocab_sizes = [3]
    with pytest.raises(ValueError, match=r"row_bytes: must be set"):
        engramstore.EngramStore({1: unset}, store=None)
    cases = [
        ({}, ValueError, "at least one layer"),
        ({-1: ok}, ValueError, "layer id -1"),
        ({True: ok}, ValueError, "layer id True"),
        ({"1": ok}, ValueError, "layer id '1'"),
        ({1: config([], 8)}, ValueError, "table_vocab_sizes"),
        ({1: config([3, 0], 8)}, ValueError, r"table_vocab_sizes\[1\]"),
        ({1: config([3, -4], 8)}, ValueError, r"table_vocab_sizes\[1\]"),
        ({1: config([3], -8)}, ValueError, "row_bytes"),
        ({1: {"table_vocab_sizes": [3], "row_bytes": 8}}, TypeError, "EngramStoreConfig"),
    ]
    for layers, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            engramstore.EngramStore(layers, store=None)
    with pytest.raises(TypeError, match="^layers:"):
        engramstore.LayerStore([(1, ok)], store=None)
    with pytest.raises(TypeError, match="^store:"):
        engramstore.EngramStore({1: ok}, store="/dev/shm")
    with pytest.raises(TypeError, match="^store:"):
        engramstore.EngramStore({1: ok}, store=engramstore.TableStore(local_dir=None))
    big = config([2], (1 << 24) + 1)
    with pytest.raises(engramstore.SpecError):
        engramstore.EngramStore({1: big}, store=None)


def test_store_none_populate_and_remove_raise(configs):
    t = engramstore.EngramStore(configs, store=None)
    with pytest.raises(engramstore.StateError, match="populate") as ei:
        t.populate(1, layer_rows(1))
    assert ei.value.errno == engramstore.ESTATE
    with pytest.raises(engramstore.StateError, match="remove_from_store"):
        t.remove_from_store(1)
    t.close()


def test_bind_local_and_lookup(configs, tmp_path):
    t = engramstore.EngramStore(configs, store=None)
    bufs = layer_rows(1)
    path = tmp_path / "layer1.bin"
    np.concatenate(bufs).tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(36, R))
    t.bind_local(1, [mm[:17], mm[17:]])
    row_ids = random_ids(1, 4, 8, seed=1, dead=True)
    out = sentinel((4, 8, 2, R))
    assert t.lookup_into(1, row_ids, out) is None
    np.testing.assert_array_equal(out, expected_layer(bufs, row_ids))
    # row_ids are int64 only, as in Mooncake's contract: int32 is refused,
    # the output untouched.
    out2 = sentinel((4, 8, 2, R))
    with pytest.raises(TypeError, match="^row_ids: expected int64, got int32"):
        t.lookup_into(1, row_ids.astype(np.int32), out2)
    assert (out2 == SENTINEL).all()
    t.close()


def test_bound_buffers_are_retained_until_close(configs, tmp_path):
    t = engramstore.EngramStore(configs, store=None)
    bufs = layer_rows(1)
    path = tmp_path / "layer1.bin"
    np.concatenate(bufs).tofile(path)
    mm = np.memmap(path, dtype=np.uint8, mode="r", shape=(36, R))
    views = [mm[:17], mm[17:]]
    refs = [weakref.ref(v) for v in views] + [weakref.ref(mm)]
    t.bind_local(1, views)
    del mm, views
    gc.collect()
    assert all(r() is not None for r in refs)
    row_ids = random_ids(1, 3, 33, seed=2)
    out = sentinel((3, 33, 2, R))
    t.lookup_into(1, row_ids, out)
    np.testing.assert_array_equal(out, expected_layer(bufs, row_ids))
    t.close()
    gc.collect()
    assert all(r() is None for r in refs)
    with pytest.raises(engramstore.StoreClosedError):
        t.lookup_into(1, row_ids, out)


def test_bind_local_refcounts_restored_at_close(configs):
    bufs = layer_rows(1)
    before = [sys.getrefcount(b) for b in bufs]
    with engramstore.EngramStore(configs, store=None) as t:
        t.bind_local(1, bufs)
        assert [sys.getrefcount(b) for b in bufs] > before
    assert [sys.getrefcount(b) for b in bufs] == before


def test_bind_twice_raises(configs):
    t = engramstore.EngramStore(configs, store=None)
    bufs = layer_rows(1)
    t.bind_local(1, bufs)
    with pytest.raises(engramstore.TableExistsError, match="layer 1") as ei:
        t.bind_local(1, layer_rows(1))
    assert ei.value.errno == errno.EEXIST
    t.bind_local(14, layer_rows(14))  # another layer is fine
    t.close()


def test_bind_local_rejects_bad_buffers_and_binds_nothing(configs):
    t = engramstore.EngramStore(configs, store=None)
    good = layer_rows(1)
    wide = np.zeros((19, 300), np.uint8)
    cases = [
        (good[0], TypeError, "^embedding_buffers: expected a list"),
        ([good[0]], ValueError, "layer 1 has 2 heads, got 1"),
        ([good[0], good[1][:5]], ValueError, r"^embedding_buffers\[1\]: expected shape \(19, 264\)"),
        ([good[0], good[1].astype(np.int8)], TypeError, r"^embedding_buffers\[1\]: expected uint8"),
        ([good[0], wide[:, :264]], ValueError, r"^embedding_buffers\[1\]: must be C-contiguous"),
        ([good[0], good[1].tolist()], TypeError, r"^embedding_buffers\[1\]: expected an array"),
        ([good[0], good[1].reshape(-1)], ValueError, r"^embedding_buffers\[1\]"),
    ]
    for bufs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            t.bind_local(1, bufs)
    with pytest.raises(ValueError, match="^layer_id: 3"):
        t.bind_local(3, good)
    with pytest.raises(engramstore.TableNotFoundError):
        t.lookup_into(1, np.zeros((1, 1, 2), np.int64), sentinel((1, 1, 2, R)))
    t.bind_local(1, good)  # nothing half-bound before
    t.close()


def test_lookup_of_an_unbound_layer_raises(configs):
    t = engramstore.EngramStore(configs, store=None)
    t.bind_local(1, layer_rows(1))
    out = sentinel((1, 1, 3, R))
    with pytest.raises(engramstore.TableNotFoundError, match="engram:l14:h0") as ei:
        t.lookup_into(14, np.zeros((1, 1, 3), np.int64), out)
    assert ei.value.errno == errno.ENOENT
    assert (out == SENTINEL).all()
    with pytest.raises(ValueError, match="^layer_id: 7"):
        t.lookup_into(7, np.zeros((1, 1, 3), np.int64), out)
    t.close()


def test_bind_local_with_a_store_client_raises(configs, local_store):
    t = engramstore.EngramStore(configs, store=local_store)
    with pytest.raises(engramstore.StateError, match="bind_local") as ei:
        t.bind_local(1, layer_rows(1))
    assert ei.value.errno == engramstore.ESTATE
    assert local_store.list_tables() == []


def test_populate_and_lookup_through_a_store_client(populated):
    t, bufs = populated
    for l in SIZES:
        row_ids = random_ids(l, 5, 7, seed=l, dead=True)
        out = sentinel((5, 7, len(SIZES[l]), R))
        t.lookup_into(l, row_ids, out)
        np.testing.assert_array_equal(out, expected_layer(bufs[l], row_ids))


def test_layer_tables_are_readable_with_the_table_api(populated, local_dir):
    t, bufs = populated
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as st:
        names = st.list_tables()
        assert names == sorted(f"engram:l{l}:h{h}" for l in SIZES for h in range(len(SIZES[l])))
        for l in SIZES:
            for h, n in enumerate(SIZES[l]):
                spec = st.get_table_spec(f"engram:l{l}:h{h}")
                assert (spec["num_rows"], spec["row_bytes"]) == (n, R)
                out = sentinel((n, 1, R))
                st.lookup([f"engram:l{l}:h{h}"], np.arange(n).reshape(-1, 1), out)
                np.testing.assert_array_equal(out[:, 0], bufs[l][h])


def test_table_api_tables_are_readable_with_the_layer_api(local_dir, config):
    rows = [make_rows(6, 16, seed=1), make_rows(9, 16, seed=2)]
    with engramstore.EngramStore(namespace="ns", local_dir=local_dir) as st:
        st.populate("engram:l3:h0", rows[0])
        st.populate("engram:l3:h1", rows[1])
    with engramstore.LocalStore(local_dir, "ns") as client:
        t = engramstore.EngramStore({3: config([6, 9], 16)}, store=client)
        out = np.zeros((1, 2, 2, 16), np.uint8)
        t.lookup_into(3, np.array([[[5, 8], [0, 1]]], np.int64), out)
        np.testing.assert_array_equal(out[0, 0, 0], rows[0][5])
        np.testing.assert_array_equal(out[0, 0, 1], rows[1][8])
        np.testing.assert_array_equal(out[0, 1, 1], rows[1][1])


def test_layer_store_reopens_a_populated_namespace(populated, local_dir, configs):
    _, bufs = populated
    with engramstore.LocalStore(local_dir, "model-x") as client:
        t = engramstore.EngramStore(configs, store=client)
        row_ids = random_ids(14, 2, 3, seed=9)
        out = sentinel((2, 3, 3, R))
        t.lookup_into(14, row_ids, out)
        np.testing.assert_array_equal(out, expected_layer(bufs[14], row_ids))
        with pytest.raises(engramstore.TableExistsError):
            t.populate(14, bufs[14])


def test_layer_spec_mismatch_with_the_store(populated, local_dir, config):
    with engramstore.LocalStore(local_dir, "model-x") as client:
        with pytest.raises(engramstore.LayoutMismatchError, match="engram:l1:h1"):
            engramstore.EngramStore({1: config([17, 20], R)}, store=client)
        with pytest.raises(engramstore.LayoutMismatchError):
            engramstore.EngramStore({1: config([17, 19], 128)}, store=client)


def test_populate_checks_every_head_first(configs, local_store):
    t = engramstore.EngramStore(configs, store=local_store)
    bufs = layer_rows(14)
    with pytest.raises(ValueError, match=r"^embedding_buffers\[2\]: expected shape \(3, 264\)"):
        t.populate(14, [bufs[0], bufs[1], bufs[2][:2]])
    with pytest.raises(ValueError, match="3 heads, got 2"):
        t.populate(14, bufs[:2])
    with pytest.raises(TypeError, match="^embedding_buffers: expected a list"):
        t.populate(14, np.stack([bufs[0], bufs[0]]))
    nc = np.zeros((7, 2 * R), np.uint8)[:, ::2]
    with pytest.raises(ValueError, match=r"^embedding_buffers\[1\]"):
        t.populate(14, [bufs[0], nc, bufs[2]])
    assert local_store.list_tables() == []
    t.populate(14, bufs)
    assert local_store.list_tables() == ["engram:l14:h0", "engram:l14:h1", "engram:l14:h2"]
    with pytest.raises(engramstore.TableExistsError) as ei:
        t.populate(14, bufs)
    assert ei.value.errno == errno.EEXIST


def test_remove_from_store(populated, local_store):
    t, bufs = populated
    assert t.remove_from_store(1) == 2
    assert local_store.list_tables() == ["engram:l14:h0", "engram:l14:h1", "engram:l14:h2"]
    with pytest.raises(engramstore.TableNotFoundError):
        t.lookup_into(1, np.zeros((1, 1, 2), np.int64), sentinel((1, 1, 2, R)))
    with pytest.raises(engramstore.TableNotFoundError, match="engram:l1:h0") as ei:
        t.remove_from_store(1)
    assert ei.value.errno == errno.ENOENT
    assert t.remove_from_store(1, force=True) == 0
    # a layer with one head missing: nothing removed without force
    local_store.remove("engram:l14:h1")
    with pytest.raises(engramstore.TableNotFoundError, match="engram:l14:h1"):
        t.remove_from_store(14)
    assert local_store.list_tables() == ["engram:l14:h0", "engram:l14:h2"]
    assert t.remove_from_store(14, force=True) == 2
    assert local_store.list_tables() == []
    # populate again after removal
    t.populate(1, bufs[1])
    out = sentinel((1, 1, 2, R))
    t.lookup_into(1, np.array([[[16, 18]]], np.int64), out)
    np.testing.assert_array_equal(out[0, 0, 1], bufs[1][1][18])


def test_close_leaves_the_store_client_open(populated, local_store):
    t, _ = populated
    with t:
        pass
    with pytest.raises(engramstore.StoreClosedError):
        t.lookup_into(1, np.zeros((1, 1, 2), np.int64), sentinel((1, 1, 2, R)))
    assert local_store.closed is False
    assert len(local_store.list_tables()) == 5


def test_closed_store_client(configs, local_dir):
    client = engramstore.LocalStore(local_dir, "c")
    t = engramstore.EngramStore(configs, store=client)
    t.populate(1, layer_rows(1))
    client.close()
    with pytest.raises(engramstore.StoreClosedError):
        t.lookup_into(1, np.zeros((1, 1, 2), np.int64), sentinel((1, 1, 2, R)))


def test_bad_row_id_in_layer_lookup(populated):
    t, _ = populated
    row_ids = np.zeros((2, 3, 2), np.int64)
    row_ids[1, 2, 1] = 19
    out = sentinel((2, 3, 2, R))
    with pytest.raises(engramstore.BadIdError) as ei:
        t.lookup_into(1, row_ids, out)
    assert str(ei.value) == ("row_ids[1][2][1] = 19 is outside table 'engram:l1:h1' "
                             "(0 <= id < 19)")
    assert (ei.value.position, ei.value.id) == ((1, 2, 1), 19)
    assert ei.value.errno == engramstore.EBADID
    assert (out == SENTINEL).all()
    row_ids[1, 2, 1] = -5
    with pytest.raises(engramstore.BadIdError, match=r"^row_ids\[1\]\[2\]\[1\] = -5 ") as ei:
        t.lookup_into(1, row_ids, out)
    assert (ei.value.position, ei.value.id) == ((1, 2, 1), -5)
    assert (out == SENTINEL).all()


def test_lookup_into_argument_checks(populated):
    t, _ = populated
    ok_ids = np.zeros((2, 3, 2), np.int64)
    out = sentinel((2, 3, 2, R))
    ro = out.copy()
    ro.flags.writeable = False
    cases = [
        (ok_ids.tolist(), out, TypeError, "^row_ids: expected an array"),
        (ok_ids.astype(np.float64), out, TypeError, "^row_ids: expected int64"),
        (ok_ids.astype(np.int16), out, TypeError, "^row_ids: expected int64"),
        (ok_ids.astype(np.int32), out, TypeError, "^row_ids: expected int64, got int32"),
        (ok_ids[0], out[0], ValueError, r"^row_ids: expected a 3-D array"),
        (np.zeros((2, 3, 3), np.int64), out, ValueError, "^row_ids: shape"),
        (np.zeros((2, 4, 2), np.int64)[:, ::2], out, ValueError, "^row_ids: must be C-contiguous"),
        (np.zeros((2, 3, 2), np.int64, order="F"), out, ValueError,
         "^row_ids: must be C-contiguous"),
        (ok_ids, out.tolist(), TypeError, "^output: expected an array"),
        (ok_ids, out.view(np.int8), TypeError, "^output: expected uint8"),
        (ok_ids, out[:, :2], ValueError, r"^output: expected shape \(2, 3, 2, 264\)"),
        (ok_ids, out[..., :200], ValueError, r"^output: expected shape"),
        (ok_ids, ro, ValueError, "^output: the array is read-only"),
        (ok_ids, np.zeros((2, 4, 2, R), np.uint8)[:, :3], ValueError,
         "^output: its leading dimensions cannot be flattened"),
    ]
    for ids, o, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            t.lookup_into(1, ids, o)
    assert (out == SENTINEL).all()


def test_lookup_into_without_output_returns_a_new_array(populated):
    """lookup_into needed an output; omitted it makes the uint8 [B, L, H,
    row_bytes] array (zero where an id is -1) and returns it."""
    t, bufs = populated
    row_ids = random_ids(1, 3, 4, seed=11, dead=True)
    for got in (t.lookup_into(1, row_ids), t.lookup_into(1, row_ids, None),
                t.lookup_into(layer_id=1, row_ids=row_ids)):
        assert isinstance(got, np.ndarray)
        assert got.shape == (3, 4, 2, R) and got.dtype == np.uint8
        np.testing.assert_array_equal(got, expected_layer(bufs[1], row_ids,
                                                          np.zeros((3, 4, 2, R), np.uint8)))
    assert t.lookup_into(1, row_ids, sentinel((3, 4, 2, R))) is None
    with pytest.raises(engramstore.BadIdError, match=r"^row_ids\[0\]\[0\]\[1\] = 19"):
        t.lookup_into(1, np.array([[[16, 19]]], np.int64))
    with pytest.raises(ValueError, match="is not a layer of this store"):
        t.lookup_into(7, row_ids)


def test_a_wrong_head_count_is_named_in_heads(populated):
    """The error said "3 columns but 2 tables are named" of row_ids, which
    name no tables; it says how many heads the layer has."""
    t, _ = populated
    out = sentinel((1, 2, 2, R))
    for call in (lambda ids: t.lookup_into(14, ids, out),          # the C fast path
                 lambda ids: t.lookup_into(14, ids, output=out),   # the Python method
                 lambda ids: t.lookup_into(14, ids)):
        with pytest.raises(ValueError, match=r"^row_ids: shape \(1, 2, 2\) gives ids for 2 "
                                             r"heads, but layer 14 has 3 heads$"):
            call(np.zeros((1, 2, 2), np.int64))
    with pytest.raises(ValueError, match=r"gives ids for 1 head, but layer 1 has 2 heads$"):
        t.lookup_into(1, np.zeros((1, 2, 1), np.int64), sentinel((1, 2, 1, R)))
    assert (out == SENTINEL).all()


def test_lookup_into_output_views(populated):
    t, bufs = populated
    row_ids = random_ids(1, 3, 4, seed=5)
    # rows spaced wider than row_bytes, and two heads of a three-head buffer:
    # the leading dims still collapse into one token stride
    big = sentinel((3, 4, 2, 300))
    t.lookup_into(1, row_ids, big[..., 10:274])
    np.testing.assert_array_equal(big[..., 10:274], expected_layer(bufs[1], row_ids))
    assert (big[..., :10] == SENTINEL).all() and (big[..., 274:] == SENTINEL).all()
    heads = sentinel((3, 4, 3, R))
    t.lookup_into(1, row_ids, heads[:, :, :2])
    np.testing.assert_array_equal(heads[:, :, :2], expected_layer(bufs[1], row_ids))
    assert (heads[:, :, 2] == SENTINEL).all()
    # empty batch
    t.lookup_into(1, np.zeros((0, 4, 2), np.int64), np.zeros((0, 4, 2, R), np.uint8))


def test_layer_stats(populated):
    t, _ = populated
    t.lookup_into(1, np.zeros((2, 2, 2), np.int64), sentinel((2, 2, 2, R)))
    s = t.stats()
    assert s["rows"] >= 8
    assert s["tables"]["engram:l1:h0"]["rows"] == 4


def test_layer_zero_and_single_head(config):
    rows = make_rows(4, 8, seed=3)
    with engramstore.EngramStore({0: config([4], 8)}, store=None) as t:
        assert t.get_layer_ids() == [0]
        assert t.get_store_keys(0) == ["engram:l0:h0"]
        t.bind_local(0, [rows])
        out = np.zeros((2, 1, 1, 8), np.uint8)
        t.lookup_into(0, np.array([[[3]], [[1]]], np.int64), out)
        np.testing.assert_array_equal(out[:, 0, 0], rows[[3, 1]])


def test_operations_after_close(configs, local_dir):
    t = engramstore.EngramStore(configs, store=None)
    t.close()
    with pytest.raises(engramstore.StoreClosedError):
        t.bind_local(1, layer_rows(1))
    with pytest.raises(engramstore.StoreClosedError):
        t.lookup_into(1, np.zeros((1, 1, 2), np.int64), sentinel((1, 1, 2, R)))
    t.close()  # twice is fine
    assert t.get_layer_ids() == [1, 14]  # metadata stays
    client = engramstore.LocalStore(local_dir, "gone")
    t2 = engramstore.EngramStore(configs, store=client)
    client.close()
    with pytest.raises(engramstore.StoreClosedError):
        t2.populate(1, layer_rows(1))
    with pytest.raises(engramstore.StoreClosedError):
        t2.remove_from_store(1)


# ---- code written for Mooncake's older EngramStore -------------------------------
# mooncake.store.EngramStore of Mooncake's 0.3 wheels: EngramStore(layer_id,
# config, store), config.embedding_dim, a float32 lookup(row_ids) returning
# a new array.  Each of its call shapes gets a TypeError (AttributeError for
# the attribute) that names the call to make instead.

OLDER = "is Mooncake's older EngramStore"


def test_older_constructor_points_to_the_layer_map(config):
    cfg = config([17, 19], R)
    for args, kwargs in [((61, cfg, None), {}), ((61, cfg), {"store": None}),
                         ((), {"layer_id": 61, "config": cfg, "store": None}), ((61, cfg), {})]:
        with pytest.raises(TypeError) as e:
            engramstore.EngramStore(*args, **kwargs)
        msg = str(e.value)
        assert msg.startswith(f"EngramStore(layer_id, config, store) {OLDER}"), msg
        assert "EngramStore({layer_id: config, ...}, store)" in msg
        assert "row_bytes = embedding_dim * 4" in msg and "lookup_into(layer_id" in msg
        assert "docs/python.md" in msg


def test_embedding_dim_points_to_row_bytes(config):
    cfg = config([17, 19], R)
    with pytest.raises(AttributeError, match=r"^EngramStoreConfig has no embedding_dim: "
                                             r"that is Mooncake's older EngramStore.*"
                                             r"set row_bytes \(embedding_dim \* 4"):
        cfg.embedding_dim = 66
    with pytest.raises(AttributeError, match="^EngramStoreConfig has no embedding_dim"):
        cfg.embedding_dim
    assert not hasattr(cfg, "embedding_dim")
    # Other attributes are as before: set, read, and unknown ones refused.
    cfg.row_bytes = 8
    assert cfg.row_bytes == 8
    with pytest.raises(AttributeError, match="has no attribute 'rows'"):
        cfg.rows = 3
    with pytest.raises(AttributeError, match="has no attribute 'rows'"):
        cfg.rows


class OlderConfig:
    """An imitation of Mooncake's older EngramStoreConfig."""
    __module__ = "mooncake.store"

    def __init__(self):
        self.embedding_dim = 66
        self.table_vocab_sizes = [17, 19]


OlderConfig.__name__ = "EngramStoreConfig"


def older_configs():
    """The imitation, and the real one where Mooncake's wheel has it."""
    cfgs = [pytest.param(OlderConfig(), id="imitation")]
    try:
        from mooncake.store import EngramStoreConfig as Real
    except ImportError:
        return cfgs
    if hasattr(Real(), "embedding_dim"):
        real = Real()
        real.embedding_dim, real.table_vocab_sizes = 66, [17, 19]
        cfgs.append(pytest.param(real, id="mooncake-wheel"))
    return cfgs


@pytest.mark.parametrize("older", older_configs())
def test_an_older_config_in_the_layer_map_points_to_ours(older):
    with pytest.raises(TypeError) as e:
        engramstore.EngramStore({1: older}, store=None)
    msg = str(e.value)
    assert msg.startswith("layers[1]: a mooncake.store.EngramStoreConfig with embedding_dim "
                          + OLDER), msg
    assert "engramstore.EngramStoreConfig(table_vocab_sizes, row_bytes)" in msg


def test_older_lookup_points_to_lookup_into(configs):
    t = engramstore.EngramStore(configs, store=None)
    t.bind_local(1, layer_rows(1))
    row_ids = random_ids(1, 2, 3, seed=4)
    with pytest.raises(TypeError) as e:
        t.lookup(row_ids)
    msg = str(e.value)
    assert msg.startswith("lookup(row_ids) returning a float32 array " + OLDER), msg
    assert "store.lookup_into(layer_id, row_ids, output)" in msg
    assert "output.view(np.float32)" in msg
    with pytest.raises(TypeError, match=r"^get_embedding_dim\(\) " + OLDER + r".*"
                                        r"get_row_bytes\(layer_id\)"):
        t.get_embedding_dim()
    # What the message says to do works: rows of 66 float32 values.
    vals = [np.arange(n * 66, dtype=np.float32).reshape(n, 66) for n in (17, 19)]
    f = engramstore.EngramStore({3: engramstore.EngramStoreConfig([17, 19], 66 * 4)},
                                store=None)
    f.bind_local(3, [v.view(np.uint8) for v in vals])
    output = np.empty((2, 3, 2, 66 * 4), np.uint8)
    f.lookup_into(3, row_ids, output)
    got = output.view(np.float32)
    assert got.shape == (2, 3, 2, 66)
    for h in range(2):
        np.testing.assert_array_equal(got[:, :, h], vals[h][row_ids[:, :, h]])
    f.close()
    t.close()


def test_older_calls_without_a_layer_id_are_refused(populated, local_store):
    t, bufs = populated
    # Older: remove_from_store(force).  True is not layer 1 here.
    with pytest.raises(TypeError) as e:
        t.remove_from_store(True)
    msg = str(e.value)
    assert msg.startswith("layer_id: expected an int layer id, got bool True.  A call "
                          "without a layer id " + OLDER), msg
    assert "remove_from_store(layer_id, force=False)" in msg
    assert set(local_store.list_tables()) >= {"engram:l1:h0", "engram:l1:h1"}
    # Older: populate(embedding_buffers).
    with pytest.raises(TypeError, match="missing 1 required positional argument: "
                                        "'embedding_buffers'"):
        t.populate(bufs[1])
    with pytest.raises(TypeError, match=r"^layer_id: expected an int layer id, got list "):
        t.populate(bufs[1], bufs[1])
    # Older: get_num_heads(), get_table_vocab_sizes(), get_store_keys().
    for name in ("get_num_heads", "get_table_vocab_sizes", "get_store_keys", "get_row_bytes"):
        with pytest.raises(TypeError, match="missing 1 required positional argument: "
                                            "'layer_id'"):
            getattr(t, name)()
