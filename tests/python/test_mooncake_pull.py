"""Pulling a Mooncake Store's table into a local namespace
(TableStore.pull(MooncakeTableStore or client, name), on the loopback
Mooncake Store the `mooncake` fixture starts): the pulled rows are the
source's and lookups read them; a table there with the same rows is kept,
another is refused; a damaged data object, a pull that raises mid-way (its
progress callback, a failed read) and a table replaced mid-pull leave
nothing visible; bad arguments; ranks pulling at once copy it once."""
from __future__ import annotations

import errno
import itertools
import os
import threading

import numpy as np
import pytest

import engramstore
from esutil import expected, make_rows, sentinel

R = 264
N = 5003  # five chunks of 1000 rows and a short one (chunks of PULL_CHUNK below)
PULL_CHUNK = 1000 * R + 17  # rounded down to whole rows by the pull
_ids = itertools.count(1)


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch):
    """Chunks of 1000 rows, four in flight: a pull of N rows reads six
    chunks, its staging slots taken again, its chunks' CRCs combined."""
    monkeypatch.setattr(engramstore._mooncake, "PULL_CHUNK_BYTES", PULL_CHUNK)


@pytest.fixture
def remote(mc_client):
    """A MooncakeTableStore on a namespace of its own, its tables removed
    at the end."""
    ns = f"pull{next(_ids)}"
    st = engramstore.EngramStore(namespace=ns, store_client=mc_client)
    yield st
    for n in st.list_tables():
        st.remove(n, force=True)
    st.close()


@pytest.fixture
def local(local_dir):
    with engramstore.EngramStore(namespace="pulled", local_dir=local_dir) as st:
        yield st


def visible(st, local_dir, name):
    """What of table `name` a reader could see, or a writer left: the
    table, and any entry of the namespace directory but leases."""
    ents = [e for e in os.listdir(os.path.join(local_dir, "pulled"))
            if not e.startswith(".lease")]
    return (name in st.list_tables()), ents


def all_rows(st, name, n):
    out = sentinel((n, 1, R))
    st.lookup([name], np.arange(n, dtype=np.int64)[:, None], out)
    return out[:, 0]


def test_pull_copies_the_rows(remote, local, mc_client):
    rows = make_rows(N, R, seed=1)
    remote.populate("t", rows)
    seen = []
    assert local.pull(remote, "t", progress=lambda d, t: seen.append((d, t))) is True
    spec = local.get_table_spec("t")
    assert spec["kind"] == "file" and (spec["num_rows"], spec["row_bytes"]) == (N, R)
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)
    local.verify("t")
    # Progress after every chunk, up to the table's bytes.
    assert [d for d, _ in seen] == [min((i + 1) * 1000, N) * R for i in range(6)]
    assert {t for _, t in seen} == {N * R}
    # Lookups from the pulled table: any ids, -1 keeps its row.
    ids = np.array([[0], [N - 1], [-1], [2500], [1000]], np.int64)
    out = sentinel((5, 1, R))
    local.lookup(["t"], ids, out)
    np.testing.assert_array_equal(out, expected({"t": rows}, ["t"], ids))
    # Pulled again (either form of the source): kept, not copied.
    assert local.pull(remote, "t") is False
    assert local.pull(mc_client, "t", namespace=remote.namespace) is False
    # Another process's store of the namespace reads it.
    with engramstore.EngramStore(namespace="pulled", local_dir=local.path.rsplit("/", 1)[0]) as o:
        np.testing.assert_array_equal(all_rows(o, "t", N), rows)


def test_pull_from_a_client_and_namespace(remote, local, mc_client):
    rows = make_rows(300, R, seed=2)
    remote.populate("u", rows)
    assert local.pull(mc_client, "u", namespace=remote.namespace) is True
    np.testing.assert_array_equal(all_rows(local, "u", 300), rows)


def test_pull_bad_arguments(remote, local, local_dir, mc_client):
    remote.populate("t", make_rows(10, R, seed=3))
    with pytest.raises(engramstore.TableNotFoundError, match="'nosuch' is not in the Mooncake"):
        local.pull(remote, "nosuch")
    with pytest.raises(TypeError, match="source: expected a store opened on a Redis Cluster, "
                                        "a MooncakeTableStore"):
        local.pull(object(), "t")
    with pytest.raises(TypeError, match="source"):
        local.pull("mooncake://x", "t")
    with pytest.raises(TypeError, match="namespace: required"):
        local.pull(mc_client, "t")
    with pytest.raises(TypeError, match="give namespace= only with a client"):
        local.pull(remote, "t", namespace="other")
    with pytest.raises(engramstore.SpecError, match="namespace: invalid name"):
        local.pull(mc_client, "t", namespace="bad/ns")
    with pytest.raises(engramstore.SpecError, match="name: invalid name"):
        local.pull(remote, ".hidden")
    with pytest.raises(TypeError, match="progress: expected a callable"):
        local.pull(remote, "t", progress=3)
    with pytest.raises(TypeError, match="only to pull from a Mooncake Store"):
        local.pull(local, "t", progress=print)
    # Into a store without a directory: the library's refusal.
    with engramstore.EngramStore(local_dir=None) as mem:
        with pytest.raises(engramstore.EngramError, match="not a directory namespace") as e:
            mem.pull(remote, "t")
        assert e.value.errno == errno.EINVAL
    with pytest.raises(engramstore.EngramError, match="not a directory namespace"):
        remote.pull(remote, "t")
    closed = engramstore.EngramStore(namespace=remote.namespace, store_client=mc_client)
    closed.close()
    with pytest.raises(engramstore.StoreClosedError):
        local.pull(closed, "t")
    assert visible(local, local_dir, "t") == (False, [])


def test_pull_keeps_the_same_table_and_refuses_another(remote, local, local_dir):
    rows, other = make_rows(N, R, seed=4), make_rows(N, R, seed=5)
    remote.populate("same", rows)
    remote.populate("diff", rows)
    remote.populate("shape", rows)
    local.populate("same", rows)
    local.populate("diff", other)
    local.populate("shape", other[:100])
    assert local.pull(remote, "same") is False
    with pytest.raises(engramstore.LayoutMismatchError,
                       match="holds other rows .*the same shape, other bytes"):
        local.pull(remote, "diff")
    with pytest.raises(engramstore.LayoutMismatchError, match="holds other rows .*100 rows"):
        local.pull(remote, "shape")
    # Both kept as they were.
    np.testing.assert_array_equal(all_rows(local, "diff", N), other)
    np.testing.assert_array_equal(all_rows(local, "same", N), rows)


def test_pull_of_damaged_rows_publishes_nothing(remote, local, local_dir, mc_client):
    rows = make_rows(N, R, seed=6)
    remote.populate("t", rows)
    key = remote.get_table_spec("t")["key"]
    bad = rows.copy()
    bad[4321, 7] ^= 1  # one bit, in the fifth chunk
    assert mc_client.remove(key, True) == 0
    assert mc_client.put(key, bad.tobytes()) == 0
    with pytest.raises(engramstore.CorruptTableError, match="do not match its manifest's "
                                                            "CRC-32") as e:
        local.pull(remote, "t")
    assert e.value.errno == engramstore.ECHECKSUM
    assert visible(local, local_dir, "t") == (False, [])
    # The rows made good again: pulled.
    assert mc_client.remove(key, True) == 0
    assert mc_client.put(key, rows.tobytes()) == 0
    assert local.pull(remote, "t") is True
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)


class Stop(Exception):
    pass


def test_pull_that_raises_midway_publishes_nothing(remote, local, local_dir, monkeypatch):
    rows = make_rows(N, R, seed=7)
    remote.populate("t", rows)

    def progress(done, total):
        if done >= 2000 * R:
            raise Stop(f"stopped at {done}")
    with pytest.raises(Stop, match=f"stopped at {2000 * R}"):
        local.pull(remote, "t", progress=progress)
    assert visible(local, local_dir, "t") == (False, [])

    # A read that fails: its error, nothing published.
    real = engramstore._mooncake._Client._read_chunk
    calls = []

    def failing(self, keys, *a, **kw):
        calls.append(keys[0])
        if len(calls) == 3:
            raise engramstore._mooncake.MooncakeError(keys[0], "reading failed (injected)", -800)
        return real(self, keys, *a, **kw)
    monkeypatch.setattr(engramstore._mooncake._Client, "_read_chunk", failing)
    with pytest.raises(engramstore._mooncake.MooncakeError, match="injected"):
        local.pull(remote, "t")
    assert visible(local, local_dir, "t") == (False, [])
    monkeypatch.undo()
    monkeypatch.setattr(engramstore._mooncake, "PULL_CHUNK_BYTES", PULL_CHUNK)
    assert local.pull(remote, "t") is True
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)


def test_pull_of_a_table_replaced_midway_publishes_nothing(remote, local, local_dir):
    rows = make_rows(N, R, seed=8)
    remote.populate("t", rows)

    def progress(done, total):
        if done == 1000 * R:
            remote.remove("t", force=True)
            remote.populate("t", make_rows(N, R, seed=9))
    with pytest.raises(engramstore.EngramError, match="while it was pulled") as e:
        local.pull(remote, "t", progress=progress)
    assert e.value.errno == errno.EAGAIN
    assert visible(local, local_dir, "t") == (False, [])
    assert local.pull(remote, "t") is True  # the new table, as pulled again
    np.testing.assert_array_equal(all_rows(local, "t", N), make_rows(N, R, seed=9))


def test_pull_by_every_rank_copies_once(remote, local_dir, mc_client):
    """Four stores of the namespace (ranks) pull at once, without a
    leader: one copies, the others wait for it and keep its table."""
    rows = make_rows(N, R, seed=10)
    remote.populate("t", rows)
    got, errs = [None] * 4, []
    go = threading.Barrier(4)

    def rank(i):
        try:
            with engramstore.EngramStore(namespace="pulled", local_dir=local_dir) as st:
                go.wait()
                got[i] = st.pull(remote, "t")
                np.testing.assert_array_equal(all_rows(st, "t", N), rows)
        except BaseException as e:  # noqa: BLE001 - reported below
            errs.append(e)
    ts = [threading.Thread(target=rank, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
    assert sorted(got) == [False, False, False, True]


def test_pulled_table_records_its_origin(remote, local, mc_client):
    """The copy records its Mooncake origin; check_origin() says current,
    gone, republished (same rows) and changed; its bad arguments."""
    rows = make_rows(N, R, seed=31)
    remote.populate("t", rows)
    assert local.pull(remote, "t") is True
    o = local.get_table_spec("t")["origin"]
    key = remote.get_table_spec("t")["key"]
    assert o == {"store": "mooncake", "namespace": remote.namespace,
                 "epoch": engramstore._mooncake.publication_id(key), "where": ""}
    assert local.check_origin(remote, "t") == "current"
    assert local.check_origin(mc_client, "t", namespace=remote.namespace) == "current"
    remote.remove("t", force=True)
    assert local.check_origin(remote, "t") == "gone"
    remote.populate("t", rows)
    assert local.check_origin(remote, "t") == "republished"
    remote.remove("t", force=True)
    other = rows.copy()
    other[N // 2, 7] ^= 1
    remote.populate("t", other)
    assert local.check_origin(remote, "t") == "changed"
    remote.remove("t", force=True)
    remote.populate("t", make_rows(N - 1, R, seed=31))
    assert local.check_origin(remote, "t") == "changed"
    assert local.get_table_spec("t")["origin"] == o
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)
    # Bad arguments and tables that did not come from here.
    local.populate("plain", make_rows(3, R, seed=32))
    with pytest.raises(engramstore.EngramError, match="records no origin") as e:
        local.check_origin(remote, "plain")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(engramstore.EngramError, match="came from namespace") as e:
        local.check_origin(mc_client, "t", namespace=remote.namespace + "x")
    assert e.value.errno == errno.EINVAL
    with pytest.raises(TypeError, match="namespace"):
        local.check_origin(mc_client, "t")
    with pytest.raises(TypeError, match="namespace"):
        local.check_origin(remote, "t", namespace="x")
    with pytest.raises(TypeError, match="source"):
        local.check_origin(object(), "t")
    with pytest.raises(engramstore.TableNotFoundError):
        local.check_origin(remote, "nosuch")
    with pytest.raises(engramstore.SpecError):
        local.check_origin(remote, "../t")


def test_pull_rows_refuses_a_bad_origin(local, local_dir):
    """_pull_rows()'s origin (what a Mooncake pull records) is checked
    before any row is read, and a refused one leaves nothing."""
    called = []

    def fill(append):
        called.append(1)
        append(np.zeros((2, R), np.uint8))

    cases = [
        (["ns", 1, ""], TypeError),                    # a list, not a tuple
        (("ns", 1), TypeError),                        # two fields
        ((b"ns", 1, ""), TypeError),                   # bytes
        (("ns", "1", ""), TypeError),                  # an epoch that is no int
        (("ns", -1, ""), OverflowError),
        (("ns", 1 << 64, ""), OverflowError),
        (("n" * 200, 1, ""), ValueError),
        (("ns", 1, "w" * 200), ValueError),
        (("ns", 0, ""), engramstore.SpecError),        # epoch 0
        ((".ns", 1, ""), engramstore.SpecError),       # not a name
        (("ns", 1, "a b"), engramstore.SpecError),     # a space in the address
    ]
    for origin, exc in cases:
        with pytest.raises(exc):
            local._pull_rows("o", 2, R, fill, lambda v: True, "test", origin)
        assert visible(local, local_dir, "o") == (False, []), origin
    assert called == []
    assert local._pull_rows("o", 2, R, fill, lambda v: True, "test", ("ns", 1, "h:1")) is True
    assert local.get_table_spec("o")["origin"] == {"store": "mooncake", "namespace": "ns",
                                                   "epoch": 1, "where": "h:1"}


def test_the_pull_crc_is_zlibs():
    """The pull's CRC-32 (blocks folded with PCLMULQDQ where the CPU has
    it, the rest by zlib) and its combination of chunks' CRCs are zlib's,
    whatever the length, start and alignment.  Needs no Mooncake."""
    import zlib
    mc = engramstore._mooncake
    rng = np.random.default_rng(12)
    buf = rng.integers(0, 256, (1 << 20) + 300, dtype=np.uint8)
    for n in list(range(0, 200)) + [1 << 20, (1 << 20) + 7, 264017]:
        for start in (0, 1, 0xDEADBEEF, 0xFFFFFFFF):
            for off in (0, 5):
                b = buf[off:off + n]
                assert mc.crc32(b, start) == zlib.crc32(b, start), (n, start, off)
    for a, b in ((0, 0), (0, 17), (17, 0), (1000, 264017), (3, 1 << 20)):
        x, y = buf[:a], buf[a:a + b]
        assert mc.crc32_combine(zlib.crc32(x), zlib.crc32(y), b) == zlib.crc32(buf[:a + b])
