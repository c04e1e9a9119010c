"""Namespaces in a Redis Cluster from Python: EngramStore(namespace=...,
redis="host:port,...") on clusters started by the fixtures (three masters
on 127.0.0.1, one of them with a password and ACL users).  Exact rows for
every lookup form, create-only populate, list/spec/verify/remove seen from
another store, the row cache, threads, the layer API over such a store,
AUTH, and the bad arguments."""
from __future__ import annotations

import errno
import itertools

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, expected, make_rows, run_in_threads, sentinel
from rdserver import RedisCluster, require_redis

R = 264
_ns = itertools.count(1)


def _redis_supported() -> None:
    """Skips where the extension was built without hiredis (unless
    ENGRAM_REQUIRE_REDIS=1)."""
    import os
    try:
        engramstore.EngramStore(namespace="probe", redis="127.0.0.1:1")
    except engramstore.EngramError as e:
        if e.errno == errno.ENOTSUP:
            if os.environ.get("ENGRAM_REQUIRE_REDIS") == "1":
                pytest.fail(str(e))
            pytest.skip(str(e))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    require_redis()
    _redis_supported()
    c = RedisCluster(str(tmp_path_factory.mktemp("redis")), masters=3).start()
    yield c
    c.stop()


@pytest.fixture
def ns():
    return f"py{next(_ns)}"


def open_store(cluster, ns, **kw):
    return engramstore.EngramStore(namespace=ns, redis=cluster.nodes, **kw)


def test_populate_and_lookup(cluster, ns):
    a, b = make_rows(1000, R, seed=1), make_rows(333, R, seed=2)
    with open_store(cluster, ns, redis_chunk_bytes=4096) as w:
        w.populate("a", a)
        w.populate("b", b)
        spec = w.get_table_spec("a")
        assert spec["kind"] == "redis" and spec["num_rows"] == 1000 and spec["row_bytes"] == R
        assert spec["stored"] is True
        assert w.path == f"redis://{cluster.nodes}/{ns}"
    # Another store (no cache) sees them and reads them exactly.
    with open_store(cluster, ns, cache_bytes=1) as st:
        assert st.list_tables() == ["a", "b"]
        rng = np.random.default_rng(3)
        ids = np.stack([rng.integers(-1, 1000, 500), rng.integers(0, 333, 500)], 1)
        out = sentinel((500, 2, R))
        st.lookup(["a", "b"], ids, out)
        np.testing.assert_array_equal(out, expected({"a": a, "b": b}, ["a", "b"], ids))
        # int32 ids with offsets.
        ids32 = (ids + np.array([10, 20])).astype(np.int32)
        ids32[ids == -1] = -1
        out2 = sentinel((500, 2, R))
        st.lookup(["a", "b"], ids32, out2, offsets=np.array([10, 20], np.int64))
        np.testing.assert_array_equal(out2, out)
        stats = st.stats()
        assert stats["redis"]["gets"] > 0 and stats["redis"]["nodes"] == 3
        assert stats["redis"]["batches"] >= 3
        st.verify("a")


def test_pull(cluster, ns, local_dir):
    """A cluster's table pulled into a local namespace: the same rows, kept
    when pulled again, refused over another table, and its bad arguments."""
    rows = make_rows(1000, R, seed=21)
    with open_store(cluster, ns, redis_chunk_bytes=8 * R) as remote, \
            engramstore.EngramStore(namespace=ns, local_dir=local_dir) as local:
        remote.populate("t", rows)
        assert local.pull(remote, "t") is True
        assert local.get_table_spec("t")["kind"] == "file"
        ids = np.array([[0], [999], [-1], [500]], np.int64)
        out = sentinel((4, 1, R))
        local.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out, expected({"t": rows}, ["t"], ids))
        local.verify("t")
        assert local.pull(remote, name="t") is False
        remote.populate("u", make_rows(10, R, seed=22))
        local.populate("u", make_rows(10, R, seed=23))
        with pytest.raises(engramstore.LayoutMismatchError, match="other rows"):
            local.pull(remote, "u")
        with pytest.raises(engramstore.TableNotFoundError):
            local.pull(remote, "nosuch")
        with pytest.raises(TypeError, match="source"):
            local.pull("redis://x", "t")
        with pytest.raises(engramstore.EngramError, match="not a remote namespace") as e:
            local.pull(local, "t")
        assert e.value.errno == errno.EINVAL
        with pytest.raises(engramstore.EngramError, match="not a directory namespace"):
            remote.pull(remote, "t")
        with pytest.raises(TypeError):
            local.pull(remote)  # type: ignore[call-arg]
    closed = open_store(cluster, ns)
    closed.close()
    with engramstore.EngramStore(namespace=ns, local_dir=local_dir) as local:
        with pytest.raises(engramstore.StoreClosedError):
            local.pull(closed, "t")


def test_origin(cluster, ns, local_dir):
    """A pulled table records where it came from; check_origin() compares
    it with the cluster as it is now; its bad arguments."""
    rows = make_rows(100, R, seed=41)
    with open_store(cluster, ns, redis_chunk_bytes=8 * R) as remote, \
            engramstore.EngramStore(namespace=ns, local_dir=local_dir) as local:
        remote.populate("t", rows)
        assert local.pull(remote, "t") is True
        theirs = remote.get_table_spec("t")["origin"]
        ours = local.get_table_spec("t")["origin"]
        assert ours == theirs
        assert ours is not None
        assert ours["store"] == "redis" and ours["namespace"] == ns
        assert ours["epoch"] > 0 and ours["where"]
        assert local.check_origin(remote, "t") == "current"
        remote.remove("t")
        assert local.check_origin(remote, name="t") == "gone"
        remote.populate("t", rows)
        assert local.check_origin(remote, "t") == "republished"
        remote.remove("t")
        remote.populate("t", make_rows(100, R, seed=42))
        assert local.check_origin(remote, "t") == "changed"
        assert local.get_table_spec("t")["origin"] == ours
        local.populate("plain", make_rows(5, R, seed=43))
        assert local.get_table_spec("plain")["origin"] is None
        with pytest.raises(engramstore.EngramError, match="records no origin") as e:
            local.check_origin(remote, "plain")
        assert e.value.errno == errno.EINVAL
        with pytest.raises(engramstore.EngramError, match="not a remote namespace"):
            local.check_origin(local, "t")
        with pytest.raises(engramstore.TableNotFoundError):
            local.check_origin(remote, "nosuch")
        with pytest.raises(engramstore.SpecError):
            local.check_origin(remote, "../t")
        with pytest.raises(TypeError, match="source"):
            local.check_origin("redis://x", "t")
        with pytest.raises(TypeError):
            local.check_origin(remote)  # type: ignore[call-arg]
        with open_store(cluster, ns + "x") as other:
            with pytest.raises(engramstore.EngramError, match="came from namespace"):
                local.check_origin(other, "t")
        remote.remove("t")


def test_redis_local_dir(cluster, ns, local_dir):
    """The nearest tier: with redis_local_dir, a table pulled there is
    served from its copy; one without a copy from the cluster."""
    a, b = make_rows(200, R, seed=31), make_rows(50, R, seed=32)
    with open_store(cluster, ns) as remote, \
            engramstore.EngramStore(namespace=ns, local_dir=local_dir) as local:
        remote.populate("a", a)
        remote.populate("b", b)
        assert local.pull(remote, "a") is True
    with open_store(cluster, ns, redis_local_dir=local_dir) as st:
        ids = np.array([[0, 1], [199, 49], [-1, 0]], np.int64)
        out = sentinel((3, 2, R))
        st.lookup(["a", "b"], ids, out)
        np.testing.assert_array_equal(out, expected({"a": a, "b": b}, ["a", "b"], ids))
        assert st.stats()["redis"]["local_tables"] == 1
        assert st.get_table_spec("a")["kind"] == "redis"
    with pytest.raises(TypeError, match="redis_local_dir: .*only with redis="):
        engramstore.EngramStore(namespace=ns, local_dir=local_dir, redis_local_dir=local_dir)


def test_bad_ids_leave_the_output(cluster, ns):
    with open_store(cluster, ns) as st:
        st.populate("t", make_rows(10, R, seed=4))
        out = sentinel((3, 1, R))
        with pytest.raises(engramstore.BadIdError, match="10"):
            st.lookup(["t"], np.array([[0], [10], [1]], np.int64), out)
        assert (out == SENTINEL).all()
        with pytest.raises(engramstore.TableNotFoundError):
            st.lookup(["nope"], np.array([[0]], np.int64), out[:1])


def test_create_only(cluster, ns):
    rows = make_rows(50, R, seed=5)
    with open_store(cluster, ns) as st:
        st.populate("t", rows)
        with pytest.raises(engramstore.TableExistsError, match="already exists"):
            st.populate("t", rows)
    with open_store(cluster, ns) as other:
        with pytest.raises(engramstore.TableExistsError):
            other.populate("t", make_rows(50, R, seed=6))


def test_remove_seen_by_another_store(cluster, ns):
    rows = make_rows(64, R, seed=7)
    with open_store(cluster, ns, cache_bytes=1) as a, open_store(cluster, ns) as b:
        a.populate("t", rows)
        out = sentinel((4, 1, R))
        ids = np.array([[0], [63], [7], [7]], np.int64)
        a.lookup(["t"], ids, out)
        b.remove("t")
        assert b.list_tables() == []
        with pytest.raises(engramstore.TableNotFoundError):
            b.get_table_spec("t")
        out[:] = SENTINEL
        with pytest.raises(engramstore.EngramError, match="table 't'") as ei:
            a.lookup(["t"], ids, out)
        assert ei.value.errno == errno.ENODATA
        assert (out == SENTINEL).all()
        # Pushed again (a new epoch): read again through a fresh open.
        b.populate("t", make_rows(64, R, seed=8))
    with open_store(cluster, ns) as c:
        out = sentinel((1, 1, R))
        c.lookup(["t"], np.array([[5]], np.int64), out)
        np.testing.assert_array_equal(out[0, 0], make_rows(64, R, seed=8)[5])
        c.remove("t")


def test_row_cache(cluster, ns):
    rows = make_rows(500, R, seed=9)
    with open_store(cluster, ns, cache_bytes=4 << 20) as st:
        st.populate("t", rows)
        ids = np.arange(0, 500, 3, dtype=np.int64)[:, None]
        out = sentinel((len(ids), 1, R))
        st.lookup(["t"], ids, out)
        gets = st.stats()["redis"]["gets"]
        st.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out[:, 0], rows[ids[:, 0]])
        s = st.stats()
        assert s["cache"]["hits"] == len(ids)
        assert s["redis"]["gets"] == gets  # the second lookup read nothing


def test_threads(cluster, ns):
    rows = make_rows(2000, R, seed=10)
    with open_store(cluster, ns, cache_bytes=1) as st:
        st.populate("t", rows)

        def work(i):
            rng = np.random.default_rng(i)
            for _ in range(20):
                ids = rng.integers(0, 2000, (256, 1))
                out = sentinel((256, 1, R))
                st.lookup(["t"], ids, out)
                np.testing.assert_array_equal(out[:, 0], rows[ids[:, 0]])

        assert run_in_threads(work, 4) == []


def test_layer_api_over_redis(cluster, ns, config):
    heads = [make_rows(n, R, seed=20 + h) for h, n in enumerate([30, 40])]
    tables = open_store(cluster, ns)
    layers = engramstore.EngramStore({1: config([30, 40], R)}, store=tables)
    layers.populate(1, heads)
    row_ids = np.array([[[0, 39], [29, -1]]], np.int64)
    out = sentinel((1, 2, 2, R))
    layers.lookup_into(1, row_ids, out)
    np.testing.assert_array_equal(out[0, 0, 0], heads[0][0])
    np.testing.assert_array_equal(out[0, 0, 1], heads[1][39])
    np.testing.assert_array_equal(out[0, 1, 0], heads[0][29])
    assert (out[0, 1, 1] == SENTINEL).all()
    assert sorted(tables.list_tables()) == ["engram:l1:h0", "engram:l1:h1"]
    layers.close()
    tables.close()


def test_bad_arguments(cluster, ns, local_dir):
    with pytest.raises(TypeError, match="local_dir"):
        engramstore.EngramStore(namespace=ns, redis=cluster.nodes, local_dir=local_dir)
    with pytest.raises(TypeError, match="namespace"):
        engramstore.EngramStore(redis=cluster.nodes)
    with pytest.raises(TypeError):
        engramstore.EngramStore(namespace=ns, redis=6379)
    with pytest.raises(TypeError, match="only with redis="):
        engramstore.EngramStore(namespace=ns, local_dir=local_dir, redis_user="u")
    with pytest.raises(ValueError, match="redis_chunk_bytes"):
        open_store(cluster, ns, redis_chunk_bytes=-1)
    with pytest.raises(engramstore.EngramError, match="not host:port") as ei:
        engramstore.EngramStore(namespace=ns, redis="localhost")
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(engramstore.SpecError):
        engramstore.EngramStore(namespace="bad/ns", redis=cluster.nodes)
    with pytest.raises(engramstore.EngramError) as ei:
        engramstore.EngramStore(namespace=ns, redis="127.0.0.1:1")
    assert ei.value.errno == errno.ECONNREFUSED


def test_auth(tmp_path_factory):
    require_redis()
    _redis_supported()
    c = RedisCluster(str(tmp_path_factory.mktemp("redis-auth")), masters=3, password="pw-py",
                     extra=["--user", "ro", "on", ">pw-ro", "~*", "+@read", "+@connection",
                            "+cluster|slots"]).start()
    try:
        with pytest.raises(engramstore.EngramError, match="NOAUTH") as ei:
            engramstore.EngramStore(namespace="au", redis=c.nodes)
        assert ei.value.errno == errno.EACCES
        with pytest.raises(engramstore.EngramError, match="refused AUTH") as ei:
            engramstore.EngramStore(namespace="au", redis=c.nodes, redis_password="wrong")
        assert ei.value.errno == errno.EACCES
        rows = make_rows(20, R, seed=30)
        with engramstore.EngramStore(namespace="au", redis=c.nodes,
                                     redis_password="pw-py") as st:
            st.populate("t", rows)
        with engramstore.EngramStore(namespace="au", redis=c.nodes, redis_user="ro",
                                     redis_password="pw-ro") as ro:
            out = sentinel((2, 1, R))
            ro.lookup(["t"], np.array([[19], [0]], np.int64), out)
            np.testing.assert_array_equal(out[:, 0], rows[[19, 0]])
            with pytest.raises(engramstore.EngramError, match="NOPERM") as ei:
                ro.populate("u", rows)
            assert ei.value.errno == errno.EACCES
    finally:
        c.stop()
