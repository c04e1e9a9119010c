"""The table API: EngramStore(tables=..., namespace=..., local_dir=...)."""
from __future__ import annotations

import errno
import os
import re
import time

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, expected, make_rows, sentinel

NAMES = ["a", "b", "a"]


def test_constructor_makes_a_table_store(store, local_dir):
    assert isinstance(store, engramstore.EngramStore)
    assert isinstance(store, engramstore.TableStore)
    assert store.path == os.path.join(local_dir, "model-x")
    assert os.path.isdir(store.path)
    assert store.closed is False
    assert "model-x" in repr(store)


def test_populate_then_lookup_matches_numpy(ab):
    st, tabs = ab
    ids = np.array([[0, 1, 2], [16, 18, 16], [3, 0, 4], [5, 17, 6]], np.int64)
    out = sentinel((4, 3, 264))
    assert st.lookup(NAMES, ids, out) is None
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_lookup_without_out_returns_a_new_array(ab, dtype):
    """lookup() needed an out; omitted (or None) it makes the array a given
    out would have to be, zero where an id is -1, and returns it."""
    st, tabs = ab
    ids = np.array([[0, 1, 2], [16, 18, -1], [3, 0, 4], [5, 17, 6]], dtype)
    for out in (st.lookup(NAMES, ids), st.lookup(NAMES, ids, None),
                st.lookup(NAMES, ids, offsets=[0, 0, 0]),
                st.lookup(tables=NAMES, ids=ids, zero_dead=True)):
        assert isinstance(out, np.ndarray)
        assert out.shape == (4, 3, 264) and out.dtype == np.uint8
        assert out.flags.c_contiguous and out.flags.writeable
        want = expected(tabs, NAMES, ids)
        want[1, 2] = 0
        np.testing.assert_array_equal(out, want)
    assert st.lookup(NAMES, ids[:0]).shape == (0, 3, 264)
    assert st.lookup([], np.zeros((2, 0), np.int64)).shape == (2, 0, 0)
    # Given an out, it returns None, as before.
    assert st.lookup(NAMES, ids, np.zeros((4, 3, 264), np.uint8)) is None


def test_lookup_without_out_raises_for_bad_ids_and_returns_nothing(ab):
    st, _ = ab
    with pytest.raises(engramstore.BadIdError, match=r"^ids\[1\]\[1\] = 19"):
        st.lookup(NAMES, np.array([[0, 1, 2], [0, 19, 0]], np.int64))
    with pytest.raises(ValueError, match="3 columns but 2 tables"):
        st.lookup(["a", "b"], np.zeros((1, 3), np.int64))
    with pytest.raises(TypeError, match="^ids: expected int32 or int64"):
        st.lookup(NAMES, np.zeros((1, 3), np.float64))


def test_lookup_async_without_out_waits_for_a_new_array(ab):
    st, tabs = ab
    ids = np.array([[0, 1, 2], [16, 18, 4]], np.int64)
    pending = st.lookup_async(NAMES, ids)
    out = pending.wait()
    assert out.shape == (2, 3, 264) and out.dtype == np.uint8
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))
    assert st.lookup_async(NAMES, ids, np.zeros((2, 3, 264), np.uint8)).wait() is None
    bad = st.lookup_async(NAMES, np.array([[0, 19, 0]], np.int64))
    with pytest.raises(engramstore.BadIdError, match=r"^ids\[0\]\[1\] = 19"):
        bad.wait()
    with pytest.raises(engramstore.StateError):
        bad.wait()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_lookup_id_dtypes(ab, dtype):
    st, tabs = ab
    rng = np.random.default_rng(3)
    ids = np.stack([rng.integers(0, 17, 50), rng.integers(0, 19, 50), rng.integers(0, 17, 50)],
                   axis=1).astype(dtype)
    out = sentinel((50, 3, 264))
    st.lookup(NAMES, ids, out)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))


def test_lookup_tuple_of_names_and_keywords(ab):
    st, tabs = ab
    ids = np.array([[1, 2]], np.int64)
    out = sentinel((1, 2, 264))
    st.lookup(tables=("b", "a"), ids=ids, out=out, offsets=None, stream=None)
    np.testing.assert_array_equal(out, expected(tabs, ["b", "a"], ids))


def test_head_major_output_view(ab):
    st, tabs = ab
    ids = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11], [12, 13, 14]], np.int64)
    out_km = sentinel((3, 5, 264))
    st.lookup(NAMES, ids, out_km.transpose(1, 0, 2))
    np.testing.assert_array_equal(out_km.transpose(1, 0, 2), expected(tabs, NAMES, ids))


def test_strided_views_of_ids_and_out(ab):
    st, tabs = ab
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 17, (6, 3)).astype(np.int64)
    # reversed views, a Fortran-ordered ids array, every other token of a
    # bigger buffer, and output rows spaced wider than row_bytes
    out = sentinel((6, 3, 264))
    st.lookup(NAMES, ids[::-1], out[::-1])
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))
    out = sentinel((6, 3, 264))
    st.lookup(NAMES, np.asfortranarray(ids), out)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))
    big = sentinel((12, 3, 300))
    idsbig = np.zeros((12, 3), np.int64)
    idsbig[::2] = ids
    st.lookup(NAMES, idsbig[::2], big[::2, :, 10:274])
    np.testing.assert_array_equal(big[::2, :, 10:274], expected(tabs, NAMES, ids))
    assert (big[1::2] == SENTINEL).all()
    assert (big[::2, :, :10] == SENTINEL).all() and (big[::2, :, 274:] == SENTINEL).all()


def test_dead_ids_keep_output_rows(ab):
    st, tabs = ab
    ids = np.array([[0, -1, 2], [-1, 18, -1]], np.int64)
    out = sentinel((2, 3, 264))
    st.lookup(NAMES, ids, out)
    assert (out[0, 1] == SENTINEL).all() and (out[1, 0] == SENTINEL).all()
    assert (out[1, 2] == SENTINEL).all()
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_zero_dead_zero_fills(ab, dtype):
    st, tabs = ab
    ids = np.array([[0, -1, 2], [-1, 18, -1]], dtype)
    out = sentinel((2, 3, 264))
    st.lookup(NAMES, ids, out, zero_dead=True)
    assert (out[0, 1] == 0).all() and (out[1, 0] == 0).all() and (out[1, 2] == 0).all()
    np.testing.assert_array_equal(out[0, 0], tabs["a"][0])
    np.testing.assert_array_equal(out[1, 1], tabs["b"][18])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_offsets(ab, dtype):
    st, tabs = ab
    offsets = np.array([100, 0, 1000], np.int64)
    ids = np.array([[100, 0, 1016], [116, 18, 1000], [-1, 5, -1]], dtype)
    out = sentinel((3, 3, 264))
    st.lookup(NAMES, ids, out, offsets)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids, offsets))
    assert (out[2, 0] == SENTINEL).all() and (out[2, 2] == SENTINEL).all()
    # a strided offsets view is fine too
    wide = np.zeros(6, np.int64)
    wide[::2] = offsets
    out2 = sentinel((3, 3, 264))
    st.lookup(NAMES, ids, out2, offsets=wide[::2])
    np.testing.assert_array_equal(out2, out)


def test_offset_that_makes_an_id_negative_is_bad(ab):
    st, _ = ab
    ids = np.array([[99, 0, 0]], np.int64)
    out = sentinel((1, 3, 264))
    with pytest.raises(engramstore.BadIdError, match=r"ids\[0\]\[0\] = 99") as ei:
        st.lookup(NAMES, ids, out, offsets=np.array([100, 0, 0], np.int64))
    assert ei.value.errno == engramstore.EBADID
    assert (ei.value.position, ei.value.id) == ((0, 0), 99)  # the id as passed
    assert (out == SENTINEL).all()


def test_bad_id_message_and_output_untouched(ab):
    st, _ = ab
    ids = np.array([[0, 1, 2], [3, 4, 5], [6, 19, 7]], np.int64)
    out = sentinel((3, 3, 264))
    with pytest.raises(engramstore.BadIdError) as ei:
        st.lookup(NAMES, ids, out)
    assert str(ei.value) == "ids[2][1] = 19 is outside table 'b' (0 <= id < 19)"
    assert (ei.value.position, ei.value.id) == ((2, 1), 19)
    assert isinstance(ei.value, IndexError)
    assert ei.value.errno == engramstore.EBADID
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("bad,pos", [(-2, (0, 0)), (17, (1, 2)), (2**40, (1, 0)),
                                     (-(2**40), (0, 1))])
def test_bad_ids_of_every_kind(ab, bad, pos):
    st, _ = ab
    ids = np.zeros((2, 3), np.int64)
    ids[pos] = bad
    out = sentinel((2, 3, 264))
    with pytest.raises(engramstore.BadIdError,
                       match=re.escape(f"ids[{pos[0]}][{pos[1]}] = {bad} is outside")) as ei:
        st.lookup(NAMES, ids, out)
    assert (ei.value.position, ei.value.id) == (pos, bad)
    assert (out == SENTINEL).all()


def test_bad_id_in_a_large_batch_leaves_everything_untouched(ab):
    st, _ = ab
    T = 20000  # above the parallel threshold
    rng = np.random.default_rng(5)
    ids = rng.integers(0, 17, (T, 3)).astype(np.int32)
    ids[T - 1, 2] = 17
    out = sentinel((T, 3, 264))
    with pytest.raises(engramstore.BadIdError, match=rf"ids\[{T - 1}\]\[2\] = 17") as ei:
        st.lookup(NAMES, ids, out)
    assert (ei.value.position, ei.value.id) == ((T - 1, 2), 17)
    assert (out == SENTINEL).all()


def test_large_batch_matches_numpy(ab):
    st, tabs = ab
    T = 9000
    rng = np.random.default_rng(6)
    ids = np.stack([rng.integers(-1, 17, T), rng.integers(-1, 19, T),
                    rng.integers(-1, 17, T)], axis=1).astype(np.int64)
    out = sentinel((T, 3, 264))
    st.lookup(NAMES, ids, out)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))


def test_many_columns_with_offsets(ab):
    # more columns than the extension keeps on its stack, an odd count
    st, tabs = ab
    K = 67
    names = ["a" if k % 3 else "b" for k in range(K)]
    offsets = (np.arange(K, dtype=np.int64) * 37) - 5
    rng = np.random.default_rng(8)
    ids = rng.integers(0, 17, (5, K)).astype(np.int64) + offsets
    ids[2, 9] = -1
    out = sentinel((5, K, 264))
    st.lookup(names, ids, out, offsets)
    np.testing.assert_array_equal(out, expected(tabs, names, ids, offsets))


def test_empty_batch_is_a_noop(ab):
    st, _ = ab
    before = st.stats()["rows"]
    assert st.lookup(NAMES, np.zeros((0, 3), np.int64), np.zeros((0, 3, 264), np.uint8)) is None
    assert st.lookup(NAMES, np.zeros((0, 3), np.int32), np.zeros((0, 3, 264), np.uint8),
                     np.zeros(3, np.int64)) is None
    assert st.stats()["rows"] == before


def test_no_columns_is_a_noop(ab):
    # K = 0: no tables, no rows, whatever the number of tokens.  numpy gives
    # an out of shape (T, 0, 0) the strides (0, 0, 1), which are not rows
    # that overlap.
    st, _ = ab
    before = st.stats()["rows"]
    for T in (0, 1, 2, 5):
        out = np.zeros((T, 0, 0), np.uint8)
        assert st.lookup([], np.zeros((T, 0), np.int64), out) is None
        assert st.lookup((), np.zeros((T, 0), np.int32), out, np.zeros(0, np.int64)) is None
        assert st.lookup([], np.broadcast_to(np.int64(0), (T, 0)), out) is None
    assert st.stats()["rows"] == before


def test_single_token_and_single_column(ab):
    st, tabs = ab
    ids = np.array([[18]], np.int64)
    out = sentinel((1, 1, 264))
    st.lookup(["b"], ids, out)
    np.testing.assert_array_equal(out[0, 0], tabs["b"][18])
    # a [1, K] view of a column of a bigger array
    col = np.array([[0], [5], [9]], np.int64).T
    out = sentinel((1, 3, 264))
    st.lookup(NAMES, col, out)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, col))


def test_populate_is_create_only(ab, rows_a):
    st, tabs = ab
    other = make_rows(17, 264, seed=99)
    with pytest.raises(engramstore.TableExistsError) as ei:
        st.populate("a", other)
    assert ei.value.errno == errno.EEXIST
    assert "'a'" in str(ei.value)
    out = sentinel((17, 1, 264))
    st.lookup(["a"], np.arange(17).reshape(-1, 1), out)
    np.testing.assert_array_equal(out[:, 0], rows_a)


def test_populate_checks_the_declared_shape_and_writes_nothing(store, rows_b):
    with pytest.raises(ValueError, match=r"^rows: expected shape \(17, 264\) for table 'a'"):
        store.populate("a", rows_b)
    assert store.list_tables() == []
    assert store.get_table_spec("a")["stored"] is False
    assert os.listdir(store.path) == []


def test_populate_leaves_only_the_published_file(store, rows_a, rows_b):
    store.populate("a", rows_a)
    store.populate("b", rows_b)
    assert sorted(os.listdir(store.path)) == ["a", "b"]
    assert store.list_tables() == ["a", "b"]


def test_populate_undeclared_name_takes_the_shape(store):
    rows = make_rows(5, 32, seed=3)
    store.populate("c", rows)
    spec = store.get_table_spec("c")
    assert (spec["num_rows"], spec["row_bytes"], spec["row_pitch"]) == (5, 32, 32)
    out = sentinel((5, 1, 32))
    store.lookup(["c"], np.arange(5)[::-1].reshape(-1, 1).copy(), out)
    np.testing.assert_array_equal(out[:, 0], rows[::-1])


def test_populate_from_strided_rows(store, rows_a):
    wide = sentinel((17, 300))
    wide[:, 7:271] = rows_a
    store.populate("a", wide[:, 7:271])
    assert store.get_table_spec("a")["row_pitch"] == 264
    out = sentinel((17, 1, 264))
    store.lookup(["a"], np.arange(17).reshape(-1, 1), out)
    np.testing.assert_array_equal(out[:, 0], rows_a)


def test_declared_row_pitch(local_dir, rows_a):
    with engramstore.EngramStore(tables={"p": {"num_rows": 17, "row_bytes": 264,
                                               "row_pitch": 272}},
                                 namespace="pitch", local_dir=local_dir) as st:
        assert st.get_table_spec("p") == {"num_rows": 17, "row_bytes": 264, "row_pitch": 272,
                                          "stored": False}
        st.populate("p", rows_a)
        spec = st.get_table_spec("p")
        assert spec["row_pitch"] == 272 and spec["data_size"] == 17 * 272
        out = sentinel((17, 1, 264))
        st.lookup(["p"], np.arange(17).reshape(-1, 1), out)
        np.testing.assert_array_equal(out[:, 0], rows_a)


def test_tuple_specs(local_dir, rows_a):
    with engramstore.EngramStore(tables={"a": (17, 264), "p": (3, 8, 16)}, namespace="t",
                                 local_dir=local_dir) as st:
        assert st.get_table_spec("a")["num_rows"] == 17
        assert st.get_table_spec("p")["row_pitch"] == 16
        st.populate("a", rows_a)
        assert st.list_tables() == ["a"]


@pytest.mark.parametrize("spec,exc,msg", [
    ({"num_rows": 17}, ValueError, r"tables\['a'\]: missing \['row_bytes'\]"),
    ({"num_rows": 17, "row_bytes": 8, "rows": 1}, ValueError, r"unknown keys \['rows'\]"),
    ([17, 264], TypeError, r"tables\['a'\]: expected a dict"),
    ({"num_rows": 0, "row_bytes": 8}, engramstore.SpecError, "not a spec"),
    ({"num_rows": 4, "row_bytes": 0}, engramstore.SpecError, "not a spec"),
    ({"num_rows": 4, "row_bytes": 8, "row_pitch": 4}, engramstore.SpecError, "not a spec"),
    ({"num_rows": 4, "row_bytes": (1 << 24) + 1}, engramstore.SpecError, "not a spec"),
    ({"num_rows": 4, "row_bytes": 8.0}, TypeError, "row_bytes: expected an int"),
])
def test_bad_specs(local_dir, spec, exc, msg):
    with pytest.raises(exc, match=msg):
        engramstore.EngramStore(tables={"a": spec}, namespace="bad", local_dir=local_dir)


@pytest.mark.parametrize("kw,msg", [
    ({"cache_bytes": -1}, r"^cache_bytes: expected an int in \[0, 18446744073709551615\] "
                          r"\(0 = 256 MiB\), got -1$"),
    ({"cache_bytes": 2**64}, r"^cache_bytes: expected an int in \[0, 18446744073709551615\]"),
    ({"cache_bytes": -2**70}, r"^cache_bytes: expected an int in"),
    ({"queue_depth": -1}, r"^queue_depth: expected an int in \[0, 4096\] \(0 = 64\), got -1$"),
    ({"queue_depth": 4097}, r"^queue_depth: expected an int in \[0, 4096\]"),
    ({"queue_depth": 2**32 + 1}, r"^queue_depth: expected an int in \[0, 4096\]"),
])
def test_options_out_of_range_are_refused(local_dir, kw, msg):
    # Handed to unsigned C fields, these used to wrap into other values.
    for file_cache in (False, True):
        with pytest.raises(ValueError, match=msg):
            engramstore.EngramStore(namespace="n", local_dir=local_dir, file_cache=file_cache,
                                    **kw)
    assert os.listdir(local_dir) == []


def test_options_at_their_limits(local_dir):
    with pytest.raises(TypeError, match="^cache_bytes: expected an int, got float"):
        engramstore.EngramStore(namespace="n", local_dir=local_dir, cache_bytes=1.5)
    with engramstore.EngramStore(namespace="n", local_dir=local_dir, file_cache=True,
                                 cache_bytes=2**64 - 1, queue_depth=4096) as st:
        cache = st.stats()["cache"]
        assert cache["queue_depth"] == 4096 and cache["budget_bytes"] == 2**64 - 1
    with engramstore.EngramStore(local_dir=None) as mem:
        with pytest.raises(ValueError, match=r"^cache_bytes: expected an int in \[0, "):
            mem.add_source("s", (4, 8), lambda rows, out: None, cache_bytes=-1)
        assert mem.list_tables() == []


def test_bad_constructor_arguments(local_dir):
    with pytest.raises(TypeError, match="^namespace: required"):
        engramstore.EngramStore(tables={"a": (1, 1)}, local_dir=local_dir)
    with pytest.raises(TypeError, match="^tables:"):
        engramstore.EngramStore(tables=[("a", 1, 1)], namespace="n", local_dir=local_dir)
    with pytest.raises(TypeError, match="^namespace: expected a str"):
        engramstore.EngramStore(namespace=5, local_dir=local_dir)
    with pytest.raises(ValueError, match="^threads:"):
        engramstore.EngramStore(namespace="n", local_dir=local_dir, threads=-1)
    with pytest.raises(TypeError):
        engramstore.EngramStore(namespace="n", local_dir=local_dir, bogus=True)
    with pytest.raises(engramstore.SpecError) as ei:
        engramstore.EngramStore(namespace="../up", local_dir=local_dir)
    assert ei.value.errno == engramstore.ESPEC
    assert os.listdir(local_dir) == []


def test_create_false_needs_an_existing_namespace(local_dir):
    with pytest.raises(engramstore.TableNotFoundError) as ei:
        engramstore.EngramStore(namespace="absent", local_dir=local_dir, create=False)
    assert ei.value.errno == errno.ENOENT
    engramstore.EngramStore(namespace="absent", local_dir=local_dir).close()
    engramstore.EngramStore(namespace="absent", local_dir=local_dir, create=False).close()


def test_get_table_spec(ab):
    st, _ = ab
    t0 = time.time_ns()
    st.populate("c", make_rows(3, 264, seed=4))
    spec = st.get_table_spec("c")
    assert spec["num_rows"] == 3 and spec["row_bytes"] == 264 and spec["row_pitch"] == 264
    assert spec["stored"] is True and spec["kind"] == "file"
    assert spec["data_size"] == 3 * 264
    assert isinstance(spec["checksum"], int)
    assert t0 - 60_000_000_000 <= spec["created_ns"] <= time.time_ns()
    assert st.get_table_spec("a")["checksum"] != st.get_table_spec("b")["checksum"]
    with pytest.raises(engramstore.TableNotFoundError, match="'zz'") as ei:
        st.get_table_spec("zz")
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(TypeError, match="^name:"):
        st.get_table_spec(1)


def test_list_tables_sorted_and_stored_only(store, rows_a, rows_b):
    assert store.list_tables() == []  # declared is not stored
    store.populate("b", rows_b)
    store.populate("Z", make_rows(2, 8, seed=1))
    store.populate("a", rows_a)
    assert store.list_tables() == sorted(["a", "b", "Z"])


def test_remove(ab):
    st, tabs = ab
    ids = np.array([[3]], np.int64)
    st.lookup(["a"], ids, sentinel((1, 1, 264)))  # opened and cached
    assert st.remove("a") is None
    assert st.list_tables() == ["b"]
    with pytest.raises(engramstore.TableNotFoundError, match=r"tables\[0\]"):
        st.lookup(["a"], ids, sentinel((1, 1, 264)))
    with pytest.raises(engramstore.TableNotFoundError) as ei:
        st.remove("a")
    assert ei.value.errno == errno.ENOENT
    # the name is free again at once
    new = make_rows(17, 264, seed=123)
    st.populate("a", new)
    out = sentinel((1, 1, 264))
    st.lookup(["a"], ids, out)
    np.testing.assert_array_equal(out[0, 0], new[3])
    st.lookup(["b"], ids, out)  # the other table is unaffected
    np.testing.assert_array_equal(out[0, 0], tabs["b"][3])


def test_other_store_keeps_its_mapping_after_remove(ab, local_dir):
    st, tabs = ab
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as other:
        out = sentinel((17, 1, 264))
        other.lookup(["a"], np.arange(17).reshape(-1, 1), out)
        st.remove("a")
        out[:] = 0
        other.lookup(["a"], np.arange(17).reshape(-1, 1), out)
        np.testing.assert_array_equal(out[:, 0], tabs["a"])


def test_stats(ab):
    st, _ = ab
    s0 = st.stats()
    for key in ("threads", "lookups", "failed", "rows", "dead_rows", "bytes", "parallel",
                "time_ns", "tables_open", "mapped_bytes", "tables"):
        assert key in s0
    ids = np.array([[0, 1, -1], [2, -1, 3]], np.int64)
    st.lookup(NAMES, ids, sentinel((2, 3, 264)))
    with pytest.raises(engramstore.BadIdError):
        st.lookup(NAMES, np.array([[0, 19, 0]], np.int64), sentinel((1, 3, 264)))
    s = st.stats()
    assert s["lookups"] - s0["lookups"] == 1
    assert s["failed"] - s0["failed"] == 1
    assert s["rows"] - s0["rows"] == 4
    assert s["dead_rows"] - s0["dead_rows"] == 2
    assert s["bytes"] - s0["bytes"] == 4 * 264
    assert s["tables_open"] == 2
    assert s["mapped_bytes"] == (17 + 19) * 264
    assert set(s["tables"]) == {"a", "b"}
    assert s["tables"]["a"]["lookups"] == 2 and s["tables"]["a"]["rows"] == 3
    assert s["tables"]["b"]["rows"] == 1 and s["tables"]["b"]["bytes"] == 264


def test_timing_option_counts_time(local_dir, rows_a):
    with engramstore.EngramStore(tables={"a": (17, 264)}, namespace="t", local_dir=local_dir,
                                 timing=True) as st:
        st.populate("a", rows_a)
        st.lookup(["a"], np.arange(17).reshape(-1, 1), sentinel((17, 1, 264)))
        assert st.stats()["time_ns"] > 0


@pytest.mark.parametrize("opts", [
    {"prefault": True}, {"random": True}, {"verify": True}, {"threads": 1}, {"threads": 3},
    {"group": True}, {"huge_pages": True}, {"mlock": True},
    {"prefault": True, "random": True, "verify": True, "timing": True}])
def test_open_options_serve_the_same_rows(local_dir, opts):
    rows = make_rows(5000, 64, seed=11)
    with engramstore.EngramStore(namespace="opt", local_dir=local_dir) as st:
        st.populate("t", rows)
    try:
        st = engramstore.EngramStore(tables={"t": (5000, 64)}, namespace="opt",
                                     local_dir=local_dir, **opts)
    except engramstore.EngramError as e:  # e.g. mlock over RLIMIT_MEMLOCK
        pytest.skip(f"{opts} not available here: {e}")
    with st:
        ids = np.random.default_rng(2).integers(-1, 5000, (6000, 1))
        out = sentinel((6000, 1, 64))
        st.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out, expected({"t": rows}, ["t"], ids))
        if "threads" in opts:
            assert st.stats()["threads"] == opts["threads"]


def test_close_and_with(local_dir, rows_a):
    with engramstore.EngramStore(tables={"a": (17, 264)}, namespace="w",
                                 local_dir=local_dir) as st:
        assert isinstance(st, engramstore.TableStore)
        st.populate("a", rows_a)
    assert st.closed is True
    assert "(closed)" in repr(st)
    ids, out = np.zeros((1, 1), np.int64), sentinel((1, 1, 264))
    calls = [lambda: st.lookup(["a"], ids, out), lambda: st.populate("x", rows_a),
             lambda: st.get_table_spec("a"), st.list_tables, lambda: st.remove("a"),
             lambda: st.verify("a"), st.stats, lambda: st.define("y", 1, 1)]
    for call in calls:
        with pytest.raises(engramstore.StoreClosedError, match="closed") as ei:
            call()
        assert isinstance(ei.value, engramstore.StateError)
        assert ei.value.errno == engramstore.ESTATE
    assert (out == SENTINEL).all()
    st.close()  # twice is fine
    with pytest.raises(engramstore.StoreClosedError):
        with st:
            pass
    # the table outlives the store object
    with engramstore.EngramStore(namespace="w", local_dir=local_dir) as again:
        assert again.list_tables() == ["a"]


def test_with_closes_on_exception(local_dir):
    with pytest.raises(RuntimeError, match="boom"):
        with engramstore.EngramStore(namespace="w", local_dir=local_dir) as st:
            raise RuntimeError("boom")
    assert st.closed


def test_reopen_persists(ab, local_dir):
    st, tabs = ab
    specs = {n: st.get_table_spec(n) for n in ("a", "b")}
    st.close()
    with engramstore.EngramStore(tables={"a": {"num_rows": 17, "row_bytes": 264},
                                         "b": {"num_rows": 19, "row_bytes": 264}},
                                 namespace="model-x", local_dir=local_dir) as st2:
        assert st2.list_tables() == ["a", "b"]
        assert {n: st2.get_table_spec(n) for n in ("a", "b")} == specs
        ids = np.array([[16, 18, 0], [1, 2, 3]], np.int64)
        out = sentinel((2, 3, 264))
        st2.lookup(NAMES, ids, out)
        np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))
        with pytest.raises(engramstore.TableExistsError):
            st2.populate("a", tabs["a"])
    # without declaring anything
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as st3:
        out = sentinel((2, 3, 264))
        st3.lookup(NAMES, ids, out)
        np.testing.assert_array_equal(out, expected(tabs, NAMES, ids))


@pytest.mark.parametrize("spec", [{"num_rows": 18, "row_bytes": 264},
                                  {"num_rows": 17, "row_bytes": 256},
                                  {"num_rows": 17, "row_bytes": 264, "row_pitch": 272}])
def test_reopen_with_a_different_spec_is_a_mismatch(ab, local_dir, spec):
    st, _ = ab
    with pytest.raises(engramstore.LayoutMismatchError, match="'a'") as ei:
        engramstore.EngramStore(tables={"a": spec}, namespace="model-x", local_dir=local_dir)
    assert isinstance(ei.value, ValueError)
    assert ei.value.errno == engramstore.EMISMATCH


def test_declared_spec_checked_when_table_appears_later(local_dir, rows_a):
    # declared in one store, populated with another shape by a second store
    with engramstore.EngramStore(tables={"a": (17, 256)}, namespace="late",
                                 local_dir=local_dir) as st:
        with engramstore.EngramStore(namespace="late", local_dir=local_dir) as other:
            other.populate("a", rows_a)
        out = sentinel((1, 1, 256))
        with pytest.raises(engramstore.LayoutMismatchError):
            st.lookup(["a"], np.zeros((1, 1), np.int64), out)
        assert (out == SENTINEL).all()


def test_define_twice_must_agree(store):
    store.define("a", 17, 264)
    with pytest.raises(engramstore.LayoutMismatchError):
        store.define("a", 18, 264)


def test_tables_with_different_row_bytes_cannot_share_a_lookup(ab):
    st, _ = ab
    st.populate("small", make_rows(4, 8, seed=1))
    out = sentinel((1, 2, 264))
    with pytest.raises(engramstore.LayoutError, match="row_bytes") as ei:
        st.lookup(["a", "small"], np.zeros((1, 2), np.int64), out)
    assert ei.value.errno == engramstore.ELAYOUT
    assert (out == SENTINEL).all()


def test_lookup_table_name_errors(ab):
    st, _ = ab
    ids, out = np.zeros((1, 3), np.int64), sentinel((1, 3, 264))
    with pytest.raises(engramstore.TableNotFoundError, match=r"^tables\[2\]: .*'zz'"):
        st.lookup(["a", "b", "zz"], ids, out)
    with pytest.raises(TypeError, match="^tables:"):
        st.lookup("aba", ids, out)
    with pytest.raises(TypeError, match=r"^tables\[1\]:"):
        st.lookup(["a", 1, "a"], ids, out)
    with pytest.raises(engramstore.SpecError, match=r"^tables\[0\]:"):
        st.lookup(["../a", "b", "a"], ids, out)
    with pytest.raises(ValueError, match="3 columns but 2 tables"):
        st.lookup(["a", "b"], ids, out)
    assert (out == SENTINEL).all()


def test_memory_only_store_serves_bound_arrays(rows_a, rows_b):
    with engramstore.TableStore(local_dir=None) as st:
        assert st.path == "<memory>"
        st.bind("a", rows_a)
        st.bind("b", rows_b)
        assert st.list_tables() == ["a", "b"]
        assert st.get_table_spec("a")["kind"] == "bound"
        ids = np.array([[16, 18, 0]], np.int64)
        out = sentinel((1, 3, 264))
        st.lookup(NAMES, ids, out)
        np.testing.assert_array_equal(out, expected({"a": rows_a, "b": rows_b}, NAMES, ids))
        with pytest.raises(engramstore.TableExistsError):
            st.bind("a", rows_a)
        with pytest.raises(engramstore.StateError) as ei:
            st.remove("a")
        assert ei.value.errno == engramstore.EBOUND
        with pytest.raises(engramstore.StateError):
            st.populate("c", rows_a)
    with pytest.raises(ValueError, match="^namespace:"):
        engramstore.TableStore(namespace="x", local_dir=None)


def test_version_and_module_functions():
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2]
    version = re.search(r'^version = "([^"]+)"', (root / "pyproject.toml").read_text(),
                        re.M).group(1)
    assert engramstore.__version__ == version == engramstore.library_version
    assert engramstore.DEAD_ID == -1
    assert isinstance(engramstore.default_root(), str) and engramstore.default_root()
    assert engramstore.strerror(engramstore.EBADID) == "row id outside its table"
    assert engramstore.strerror(errno.ENOENT)
    with pytest.raises(ValueError):
        engramstore.strerror(-1)
    for name in engramstore.__all__:
        assert hasattr(engramstore, name), name


def test_dir_lists_the_public_names_only():
    """dir(engramstore) listed os, the typing names and the private
    helpers the package uses itself; now __all__ (and __version__)."""
    import types
    names = dir(engramstore)
    assert names == sorted(set(engramstore.__all__) | {"__version__"})
    for name in names:
        assert not isinstance(getattr(engramstore, name), types.ModuleType), name
    for gone in ("os", "overload", "Mapping", "OLD_MOONCAKE", "_engram", "_DEFAULT"):
        assert gone not in names
    # Every exception class and error code the package exports is listed.
    for name, value in vars(engramstore).items():
        if (isinstance(value, type) and issubclass(value, Exception)
                and value.__module__.startswith("engramstore")):
            assert name in names, name
        if re.fullmatch(r"E[A-Z]+", name) and isinstance(value, int):
            assert name in names, name


def test_default_root_follows_engram_root(tmp_path, monkeypatch):
    # The package's default local_dir is the library's default root, which
    # the environment variable ENGRAM_ROOT names when it is set.
    root = tmp_path / "env-root"
    monkeypatch.setenv("ENGRAM_ROOT", str(root))
    assert engramstore.default_root() == str(root)
    rows = make_rows(3, 8, 5)
    with engramstore.EngramStore(namespace="env-ns") as st:
        st.populate("t", rows)
    assert (root / "env-ns" / "t").is_file()
    with engramstore.TableStore(namespace="env-ns") as st:
        assert st.list_tables() == ["t"]
        out = sentinel((1, 1, 8))
        st.lookup(["t"], np.array([[2]], np.int64), out)
        np.testing.assert_array_equal(out[0, 0], rows[2])
    monkeypatch.setenv("ENGRAM_ROOT", "")
    assert engramstore.default_root() in ("/dev/shm/engram", "/tmp/engram")
