"""The short paths of a lookup call: the layer API's lookup_into made in C
(the layer's table names from the layer store's dict, then the lookup,
every other call form through the Python method), the memo of the name
lists of the last lookups, and the benchmark hook Store._bench_lookup."""
from __future__ import annotations

import gc
import inspect
import weakref

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, make_rows, sentinel

R = 264
SIZES = {1: [17, 19], 14: [5, 7, 3]}


def layer_rows(layer_id, sizes=SIZES, seed=0):
    return [make_rows(n, R, seed=seed + 100 * layer_id + h)
            for h, n in enumerate(sizes[layer_id])]


def ids_for(sizes, B, L, seed):
    rng = np.random.default_rng(seed)
    return np.stack([rng.integers(0, n, (B, L)) for n in sizes], axis=-1).astype(np.int64)


def expected(bufs, row_ids):
    return np.stack([bufs[h][row_ids[..., h]] for h in range(row_ids.shape[-1])], axis=-2)


@pytest.fixture
def configs(config):
    return {l: config(s, R) for l, s in SIZES.items()}


@pytest.fixture
def client(local_dir):
    st = engramstore.LocalStore(local_dir, "pycall")
    yield st
    st.close()


@pytest.fixture
def populated(configs, client):
    t = engramstore.EngramStore(configs, store=client)
    bufs = {l: layer_rows(l) for l in SIZES}
    for l in SIZES:
        t.populate(l, bufs[l])
    yield t, bufs
    t.close()


def test_every_call_form_gives_the_rows(populated):
    t, bufs = populated
    row_ids = ids_for(SIZES[14], 2, 3, seed=7)
    want = expected(bufs[14], row_ids)
    calls = [lambda o: t.lookup_into(14, row_ids, o),
             lambda o: t.lookup_into(14, row_ids, output=o),
             lambda o: t.lookup_into(layer_id=14, row_ids=row_ids, output=o),
             lambda o: engramstore.LayerStore.lookup_into(t, 14, row_ids, o),
             lambda o: t.lookup_into(np.int64(14), row_ids, o)]
    for call in calls:
        out = sentinel((2, 3, 3, R))
        assert call(out) is None
        np.testing.assert_array_equal(out, want)


def test_bad_call_forms_raise_as_the_method_does(populated):
    t, _ = populated
    row_ids = np.zeros((1, 1, 2), np.int64)
    out = sentinel((1, 1, 2, R))
    with pytest.raises(TypeError, match=r"lookup_into\(\) missing 1 required positional "
                                        r"argument: 'row_ids'"):
        t.lookup_into(1)
    with pytest.raises(TypeError, match=r"lookup_into\(\) got an unexpected keyword argument "
                                        r"'out'"):
        t.lookup_into(1, row_ids, out=out)
    with pytest.raises(TypeError, match=r"lookup_into\(\) takes from 3 to 4 positional arguments "
                                        r"but 5 were given"):
        t.lookup_into(1, row_ids, out, None)
    with pytest.raises(ValueError, match=r"^layer_id: 2 is not a layer of this store "
                                         r"\(layers: \[1, 14\]\)$"):
        t.lookup_into(2, row_ids, out)
    with pytest.raises(ValueError, match=r"^layer_id: \{\} is not a layer of this store"):
        t.lookup_into({}, row_ids, out)
    with pytest.raises(TypeError, match=r"^layer_id: expected an int layer id, got list \[1\]"):
        t.lookup_into([1], row_ids, out)
    # The checks of the arrays are the lookup's own, in both paths.
    with pytest.raises(TypeError, match="^row_ids: expected int64, got int32"):
        t.lookup_into(1, row_ids.astype(np.int32), out)
    with pytest.raises(engramstore.BadIdError, match=r"^row_ids\[0\]\[0\]\[1\] = 19"):
        t.lookup_into(1, np.array([[[16, 19]]], np.int64), out)
    assert (out == SENTINEL).all()


def test_lookup_into_introspects_as_the_method(populated):
    t, _ = populated
    assert t.lookup_into.__name__ == "lookup_into"
    assert t.lookup_into.__qualname__ == "LayerStore.lookup_into"
    assert str(inspect.signature(t.lookup_into)) == (
        "(layer_id: 'int', row_ids: 'ArrayArg', output: 'ArrayArg | None' = None) -> 'Any'")


def test_a_lookup_into_taken_before_close_raises_after(populated, client):
    t, bufs = populated
    f = t.lookup_into
    row_ids = ids_for(SIZES[1], 1, 2, seed=3)
    out = sentinel((1, 2, 2, R))
    f(1, row_ids, out)
    np.testing.assert_array_equal(out, expected(bufs[1], row_ids))
    t.close()
    out = sentinel((1, 2, 2, R))
    with pytest.raises(engramstore.StoreClosedError, match="^the store is closed$"):
        f(1, row_ids, out)
    with pytest.raises(engramstore.StoreClosedError, match="^the store is closed$"):
        t.lookup_into(1, row_ids, out)
    assert (out == SENTINEL).all()
    assert client.closed is False  # the client is the caller's


def test_store_none_layers_alternate_and_close(configs):
    t = engramstore.EngramStore(configs, store=None)
    bufs = {l: layer_rows(l, seed=5) for l in SIZES}
    for l in SIZES:
        t.bind_local(l, bufs[l])
    for i in range(6):
        l = (1, 14)[i % 2]
        row_ids = ids_for(SIZES[l], 3, 2, seed=i)
        out = sentinel(row_ids.shape + (R,))
        t.lookup_into(l, row_ids, out)
        np.testing.assert_array_equal(out, expected(bufs[l], row_ids))
    f = t.lookup_into
    t.close()
    with pytest.raises(engramstore.StoreClosedError):
        f(1, ids_for(SIZES[1], 1, 1, seed=0), sentinel((1, 1, 2, R)))


def test_more_layers_than_the_memo_holds(config, local_dir):
    # 40 layers looked up in turn, twice: every call names another list of
    # tables than the last 16; then a layer removed and populated again with
    # other rows is read afresh.
    sizes = {l: [3 + l % 7, 2 + l % 5] for l in range(40)}
    with engramstore.LocalStore(local_dir, "many") as client:
        t = engramstore.EngramStore({l: config(s, R) for l, s in sizes.items()}, store=client)
        bufs = {l: layer_rows(l, sizes) for l in sizes}
        for l in sizes:
            t.populate(l, bufs[l])
        for rep in range(2):
            for l in sizes:
                row_ids = ids_for(sizes[l], 2, 1, seed=rep * 100 + l)
                out = sentinel((2, 1, 2, R))
                t.lookup_into(l, row_ids, out)
                np.testing.assert_array_equal(out, expected(bufs[l], row_ids))
        t.remove_from_store(5)
        new = layer_rows(5, sizes, seed=77)
        t.populate(5, new)
        for l in (4, 5, 6, 5):
            row_ids = ids_for(sizes[l], 2, 1, seed=l)
            out = sentinel((2, 1, 2, R))
            t.lookup_into(l, row_ids, out)
            np.testing.assert_array_equal(out, expected(new if l == 5 else bufs[l], row_ids))
        t.close()


def test_store_lookup_alternating_name_lists(local_dir):
    # 20 name lists used in turn (more than the memo's 16), each a list
    # object kept by the caller; a table removed and stored again with
    # other rows is read afresh through the list that named it.
    with engramstore.EngramStore(namespace="lists", local_dir=local_dir) as st:
        rows = {f"t{i}": make_rows(4 + i, R, seed=i) for i in range(21)}
        for name, r in rows.items():
            st.populate(name, r)
        lists = [[f"t{i}", f"t{i + 1}"] for i in range(20)]
        for rep in range(3):
            for i, names in enumerate(lists):
                ids = np.array([[rep % 4, (rep + 1) % 5]], np.int64)
                out = sentinel((1, 2, R))
                st.lookup(names, ids, out)
                for k, name in enumerate(names):
                    np.testing.assert_array_equal(out[0, k], rows[name][ids[0, k]])
        st.remove("t3")
        with pytest.raises(engramstore.TableNotFoundError):
            st.lookup(lists[3], np.zeros((1, 2), np.int64), sentinel((1, 2, R)))
        rows["t3"] = make_rows(7, R, seed=99)
        st.populate("t3", rows["t3"])
        for names in (lists[2], lists[3]):
            out = sentinel((1, 2, R))
            st.lookup(names, np.array([[2, 1]], np.int64), out)
            for k, name in enumerate(names):
                np.testing.assert_array_equal(out[0, k], rows[name][[2, 1][k]])


def test_an_overriding_subclass_is_called(configs):
    class Counting(engramstore.LayerStore):
        calls = 0

        def lookup_into(self, layer_id, row_ids, output):
            Counting.calls += 1
            return super().lookup_into(layer_id, row_ids, output)

    with Counting(configs, store=None) as t:
        bufs = layer_rows(1)
        t.bind_local(1, bufs)
        row_ids = ids_for(SIZES[1], 1, 1, seed=1)
        out = sentinel((1, 1, 2, R))
        t.lookup_into(1, row_ids, out)
        np.testing.assert_array_equal(out, expected(bufs, row_ids))
    assert Counting.calls == 1


def test_an_unclosed_layer_store_is_collected(configs):
    t = engramstore.EngramStore(configs, store=None)
    bufs = layer_rows(1)
    t.bind_local(1, bufs)
    t.lookup_into(1, ids_for(SIZES[1], 1, 1, seed=1), sentinel((1, 1, 2, R)))
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None


def test_bench_lookup_hook(local_dir):
    with engramstore.EngramStore(tables={"a": {"num_rows": 17, "row_bytes": R}},
                                 namespace="bench", local_dir=local_dir) as st:
        rows = make_rows(17, R, seed=3)
        st.populate("a", rows)
        ids = np.array([[3], [16]], np.int64)
        out = np.zeros((2, 1, R), np.uint8)
        ns = np.frombuffer(st._bench_lookup(["a"], ids, out, 5, True), np.int64)
        assert ns.shape == (5,) and (ns >= 0).all()
        assert not out.any()  # empty: the timer alone
        ns = np.frombuffer(st._bench_lookup(["a"], ids, out, 7, False), np.int64)
        assert ns.shape == (7,) and (ns > 0).all()
        np.testing.assert_array_equal(out[:, 0], rows[[3, 16]])
        with pytest.raises(engramstore.BadIdError):
            st._bench_lookup(["a"], np.array([[17]], np.int64), out[:1], 1, False)
        with pytest.raises(TypeError, match="^ids: expected int32 or int64"):
            st._bench_lookup(["a"], ids.astype(np.float64), out, 1, False)
        with pytest.raises(ValueError, match="calls"):
            st._bench_lookup(["a"], ids, out, -1, False)
        with pytest.raises(ValueError, match="calls"):
            st._bench_lookup(["a"], ids, out, 2**70, False)
        with pytest.raises(TypeError, match="calls"):
            st._bench_lookup(["a"], ids, out, 1.0, False)


def test_bench_lookup_takes_memory_tables_only():
    # A source's read_rows runs Python code, which the hook's timed loop
    # (the GIL held) must not: refused before any call.
    with engramstore.EngramStore(local_dir=None) as st:
        rows = make_rows(9, R, seed=4)
        calls = []

        def read_rows(r, o):
            calls.append(1)
            o[:] = rows[r.astype(np.int64)]
        st.add_source("s", (9, R), read_rows)
        ids = np.array([[2]], np.int64)
        out = sentinel((1, 1, R))
        st.lookup(["s"], ids, out)  # a source table is served by lookup
        np.testing.assert_array_equal(out[0, 0], rows[2])
        n = len(calls)
        with pytest.raises(ValueError, match="^_bench_lookup: tables of memory rows only"):
            st._bench_lookup(["s"], ids, out, 3, False)
        assert len(calls) == n
