"""Pulling a Mooncake Store's table into a local namespace
(TableStore.pull(MooncakeTableStore or client, name), on the loopback
Mooncake Store the `mooncake` fixture starts): the pulled rows are the
source's and lookups read them, whatever the table's chunking; progress
counts the bytes read up to the table's; a table there with the same rows
is kept, another is refused; a damaged, missing or truncated chunk object,
a pull that raises mid-way (its progress callback, a failed read) and a
table replaced or removed mid-pull leave nothing visible; bad arguments;
ranks pulling at once copy it once; the origin recorded and check_origin()
per chunk; XXH3-64 (the manifests' checksums) against known values.

Every test with a local namespace runs twice: on a disk (the rows are
written to the table file) and on a tmpfs (the transfer lands in the
table file itself, each block hashed there)."""
from __future__ import annotations

import errno
import itertools
import os
import threading

import numpy as np
import pytest

import engramstore
from esutil import expected, make_rows, sentinel, shm_root

R = 264
N = 5003  # five chunks of 1000 rows and a short one (chunks of CHUNK below)
CHUNK = 1000 * R + 17  # the remote stores' chunk_bytes: rounded down to whole rows
# A table of several read batches (src/publish.c reads a table in batches
# of whole chunks of about 32 MiB): chunks of 12 MiB, five of them (the
# last shorter), about 58 MiB.
BIG_CHUNK = 12 << 20
BIG_CHUNK_ROWS = BIG_CHUNK // R
BIG_N = 4 * BIG_CHUNK_ROWS + 30000
# Chunks of more than half a batch: a batch per chunk.
HALF_BATCH_CHUNK = (16 << 20) + 1000
_ids = itertools.count(1)


def _store(mc_client, chunk_bytes=CHUNK, prefix="pull"):
    return engramstore.EngramStore(namespace=f"{prefix}{next(_ids)}", store_client=mc_client,
                                   chunk_bytes=chunk_bytes)


def _drop(st):
    for n in st.list_tables():
        st.remove(n, force=True)
    st.close()


@pytest.fixture
def remote(mc_client):
    """A MooncakeTableStore on a namespace of its own, chunks of 1000 rows
    of R bytes, its tables removed at the end."""
    st = _store(mc_client)
    yield st
    _drop(st)


@pytest.fixture
def make_remote(mc_client):
    """make_remote(chunk_bytes): a MooncakeTableStore on a namespace of its
    own with chunks of chunk_bytes, its tables removed at the end."""
    made = []

    def make(chunk_bytes):
        made.append(_store(mc_client, chunk_bytes))
        return made[-1]
    yield make
    for st in made:
        _drop(st)


@pytest.fixture(scope="module")
def big(mc_client):
    """(store, rows): table "big" of BIG_N rows of R bytes published in
    chunks of BIG_CHUNK, read in several batches; shared, read only."""
    st = _store(mc_client, BIG_CHUNK, "pullbig")
    rows = make_rows(BIG_N, R, seed=40)
    st.populate("big", rows)
    yield st, rows
    _drop(st)


@pytest.fixture(params=["disk", "tmpfs"])
def local_dir(request, tmp_path):
    """The local root: a directory of tmp_path (a disk here; rows go in
    by write(2)), or one of /dev/shm (a tmpfs: rows read in place)."""
    if request.param == "disk":
        d = tmp_path / "root"
        d.mkdir()
        yield str(d)
    else:
        with shm_root() as d:
            yield d


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


def check_progress(seen, total, chunk_rows):
    """progress(done, total) after each batch read: the table's bytes as
    total every time, done growing by whole chunks' bytes, the last call
    at the table's bytes."""
    assert seen, "progress was never called"
    assert {t for _, t in seen} == {total}, seen
    done = [d for d, _ in seen]
    assert all(a < b for a, b in zip([0] + done, done)), seen  # > 0, strictly increasing
    assert done[-1] == total, seen
    assert all(d % (chunk_rows * R) == 0 for d in done[:-1]), seen  # whole chunks


def damage(mc_client, key, data):
    """Puts `data` in place of chunk object `key` (forced removal first:
    a Mooncake put to a key that exists writes nothing)."""
    assert mc_client.remove(key, True) == 0
    assert mc_client.put(key, bytes(data)) == 0


def test_pull_copies_the_rows(remote, local, mc_client):
    rows = make_rows(N, R, seed=1)
    remote.populate("t", rows)
    spec = remote.get_table_spec("t")
    assert (spec["chunk_rows"], len(spec["chunk_keys"])) == (1000, 6)
    seen = []
    assert local.pull(remote, "t", progress=lambda d, t: seen.append((d, t))) is True
    spec = local.get_table_spec("t")
    assert spec["kind"] == "file" and (spec["num_rows"], spec["row_bytes"]) == (N, R)
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)
    local.verify("t")
    # Progress after every batch read, up to the table's bytes.
    check_progress(seen, N * R, 1000)
    # Lookups from the pulled table: any ids, -1 keeps its row.
    ids = np.array([[0], [N - 1], [-1], [2500], [1000], [999]], np.int64)
    out = sentinel((6, 1, R))
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
    assert len(remote.get_table_spec("u")["chunk_keys"]) == 1  # one short chunk
    assert local.pull(mc_client, "u", namespace=remote.namespace) is True
    np.testing.assert_array_equal(all_rows(local, "u", 300), rows)


def test_pull_of_a_table_in_many_chunks(make_remote, local, mc_client):
    """Chunks of 7 rows (chunk_bytes not a multiple of the rows), a row
    count that is not a multiple of them: the chunk objects are the rows
    in order, and the pull copies them exactly; chunks of one row too."""
    st = make_remote(7 * R + 5)
    rows = make_rows(N, R, seed=11)
    st.populate("t", rows)
    spec = st.get_table_spec("t")
    nchunks = -(-N // 7)  # 714 of 7 rows, one of 5
    assert (spec["num_rows"], spec["chunk_rows"], len(spec["chunk_keys"])) == (N, 7, nchunks)
    assert spec["chunk_keys"] == [f"{st.namespace}/.chunk/t/{spec['epoch']:016x}/{i}"
                                  for i in range(nchunks)]
    for i in (0, 1, nchunks // 2, nchunks - 2, nchunks - 1):
        assert bytes(mc_client.get(spec["chunk_keys"][i])) == rows[7 * i:7 * (i + 1)].tobytes()
    seen = []
    assert local.pull(st, "t", progress=lambda d, t: seen.append((d, t))) is True
    check_progress(seen, N * R, 7)
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)
    local.verify("t")
    ids = np.array([[6], [7], [8], [N - 6], [N - 5], [N - 1]], np.int64)
    out = sentinel((6, 1, R))
    local.lookup(["t"], ids, out)
    np.testing.assert_array_equal(out, expected({"t": rows}, ["t"], ids))
    assert local.get_table_spec("t")["origin"]["epoch"] == spec["epoch"]
    # A row per chunk.
    one = make_remote(R)
    few = make_rows(10, R, seed=12)
    one.populate("one", few)
    assert (one.get_table_spec("one")["chunk_rows"], len(one.get_table_spec("one")["chunk_keys"])) \
        == (1, 10)
    assert local.pull(one, "one") is True
    np.testing.assert_array_equal(all_rows(local, "one", 10), few)


def test_pull_progress_over_several_batches(big, local):
    """A table of five 12 MiB chunks is read in several batches: progress
    after each, done growing by whole chunks to the table's bytes."""
    st, rows = big
    spec = st.get_table_spec("big")
    assert (spec["chunk_rows"], len(spec["chunk_keys"])) == (BIG_CHUNK_ROWS, 5)
    seen = []
    assert local.pull(st, "big", progress=lambda d, t: seen.append((d, t))) is True
    assert len(seen) >= 2, seen  # more than one batch of about 32 MiB
    check_progress(seen, BIG_N * R, BIG_CHUNK_ROWS)
    np.testing.assert_array_equal(all_rows(local, "big", BIG_N), rows)


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
    # The pull's own chunking and calls are gone: the manifest's chunks are read.
    for kw in ({"chunk_bytes": 1 << 20}, {"calls": 4}):
        with pytest.raises(TypeError, match=next(iter(kw))):
            engramstore._mooncake.pull(local, remote, "t", **kw)
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
    """A chunk object with other bytes of its length fails its chunk's
    XXH3-64; a chunk object missing, or of another length, is data lost:
    nothing is published either way, and the rows made good are pulled."""
    rows = make_rows(N, R, seed=6)
    remote.populate("t", rows)
    spec = remote.get_table_spec("t")
    key = spec["chunk_keys"][4]  # rows 4000-4999
    good = rows[4000:5000]
    bad = good.copy()
    bad[321, 7] ^= 1  # one bit, row 4321
    damage(mc_client, key, bad)
    with pytest.raises(engramstore.CorruptTableError,
                       match=f"chunk 4 \\(epoch {spec['epoch']:016x}\\) has checksum "
                             "[0-9a-f]{16}, the manifest says [0-9a-f]{16}") as e:
        local.pull(remote, "t")
    assert e.value.errno == engramstore.ECHECKSUM
    assert visible(local, local_dir, "t") == (False, [])
    # The chunk gone.
    assert mc_client.remove(key, True) == 0
    with pytest.raises(engramstore.EngramError, match="its data is not whole: a chunk is missing "
                                                      f"or has the wrong length .*{key}: not in "
                                                      "the Mooncake store") as e:
        local.pull(remote, "t")
    assert e.value.errno == errno.ENODATA
    assert visible(local, local_dir, "t") == (False, [])
    # The chunk a row short (its rows, but for the last).
    assert mc_client.put(key, good[:999].tobytes()) == 0
    with pytest.raises(engramstore.EngramError, match=f"{key}: {999 * R} bytes, where the read "
                                                      f"needs exactly {1000 * R}") as e:
        local.pull(remote, "t")
    assert e.value.errno == errno.ENODATA
    assert visible(local, local_dir, "t") == (False, [])
    # The last (short) chunk damaged.
    last = spec["chunk_keys"][5]
    tail = rows[5000:].copy()
    tail[2, R - 1] ^= 0x80
    damage(mc_client, last, tail)
    damage(mc_client, key, good)
    with pytest.raises(engramstore.CorruptTableError, match="chunk 5 ") as e:
        local.pull(remote, "t")
    assert e.value.errno == engramstore.ECHECKSUM
    assert visible(local, local_dir, "t") == (False, [])
    # The rows made good again: pulled.
    damage(mc_client, last, rows[5000:])
    assert local.pull(remote, "t") is True
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)


class Stop(Exception):
    pass


def test_pull_that_raises_midway_publishes_nothing(big, local, local_dir, monkeypatch):
    st, rows = big
    calls = []

    def progress(done, total):
        calls.append(done)
        if len(calls) == 2:
            raise Stop(f"stopped at call {len(calls)}")
    with pytest.raises(Stop, match="stopped at call 2"):
        local.pull(st, "big", progress=progress)
    assert len(calls) == 2
    assert visible(local, local_dir, "big") == (False, [])

    # A read that fails (the second batch's): its error, nothing published.
    real = engramstore._mckv.MooncakeKV.get_ranges
    reads = []

    def failing(self, name, epoch, layout, ranges, out):
        reads.append([r[0] for r in ranges])
        if len(reads) == 2:
            raise engramstore._mooncake.MooncakeError(
                self.piece_key(name, epoch, ranges[0][0]), "reading failed (injected)", -800)
        return real(self, name, epoch, layout, ranges, out)
    monkeypatch.setattr(engramstore._mckv.MooncakeKV, "get_ranges", failing)
    with pytest.raises(engramstore.EngramError, match="reading failed \\(injected\\)") as e:
        local.pull(st, "big")
    assert e.value.errno == errno.EIO
    assert len(reads) == 2 and reads[0][0] == 0 and reads[1][0] > 0  # midway
    assert visible(local, local_dir, "big") == (False, [])
    monkeypatch.undo()
    assert local.pull(st, "big") is True
    np.testing.assert_array_equal(all_rows(local, "big", BIG_N), rows)


def test_pull_of_a_table_replaced_midway_publishes_nothing(make_remote, local, local_dir):
    """Replaced, then removed, after the first of two batches read: the
    second finds its chunk gone, and the pull says why."""
    st = make_remote(HALF_BATCH_CHUNK)
    n = HALF_BATCH_CHUNK // R + 5  # two chunks, two batches
    rows, new = make_rows(n, R, seed=8), make_rows(n, R, seed=9)
    st.populate("t", rows)
    assert len(st.get_table_spec("t")["chunk_keys"]) == 2
    seen = []

    def replace(done, total):
        seen.append(done)
        if len(seen) == 1:
            st.remove("t", force=True)
            st.populate("t", new)
    with pytest.raises(engramstore.EngramError, match="the table was replaced in the Mooncake "
                                                      "namespace .* while it was pulled") as e:
        local.pull(st, "t", progress=replace)
    assert e.value.errno == errno.EAGAIN
    assert len(seen) == 1 and seen[0] < n * R
    assert visible(local, local_dir, "t") == (False, [])

    seen.clear()

    def remove(done, total):
        seen.append(done)
        if len(seen) == 1:
            st.remove("t", force=True)
    with pytest.raises(engramstore.EngramError, match="the table was removed in the Mooncake "
                                                      "namespace .* while it was pulled") as e:
        local.pull(st, "t", progress=remove)
    assert e.value.errno == errno.EAGAIN
    assert visible(local, local_dir, "t") == (False, [])
    st.populate("t", new)
    assert local.pull(st, "t") is True  # the new table, as pulled again
    np.testing.assert_array_equal(all_rows(local, "t", n), new)
    assert local.get_table_spec("t")["origin"]["epoch"] == st.get_table_spec("t")["epoch"]


def test_pull_of_a_table_replaced_once_read_publishes_nothing(remote, local, local_dir,
                                                             monkeypatch):
    """Replaced, or removed, once every row was read (right after the read
    of its last chunk, before the pull publishes): the rows read are no
    longer the table's, and the pull says so rather than publish them."""
    rows, new = make_rows(N, R, seed=13), make_rows(N, R, seed=14)
    remote.populate("t", rows)
    real = engramstore._mckv.MooncakeKV.get_ranges
    then = []  # what to do once the last chunk was read (once)

    def reads(self, name, epoch, layout, ranges, out):
        real(self, name, epoch, layout, ranges, out)
        if then and any(r[0] == 5 for r in ranges):
            then.pop()()
    monkeypatch.setattr(engramstore._mckv.MooncakeKV, "get_ranges", reads)

    def replace():
        remote.remove("t", force=True)
        remote.populate("t", new)
    for change, why in ((replace, "replaced"), (lambda: remote.remove("t", force=True),
                                                "removed")):
        then.append(change)
        with pytest.raises(engramstore.EngramError, match=f"the table was {why} in the "
                                                          "Mooncake namespace .* while it "
                                                          "was pulled") as e:
            local.pull(remote, "t")
        assert not then  # it did run
        assert e.value.errno == errno.EAGAIN
        assert visible(local, local_dir, "t") == (False, [])
    monkeypatch.undo()
    remote.populate("t", new)
    assert local.pull(remote, "t") is True
    np.testing.assert_array_equal(all_rows(local, "t", N), new)


def test_pull_of_a_table_republished_before_its_read_publishes_nothing(remote, local, local_dir):
    """Published again between the pull's first read of the manifest and
    the read of its rows, with the same bytes in another shape, or the
    same rows: what the pull first read is gone, and it says so (EAGAIN)
    rather than copy or mistake the new publication for it."""
    rows = make_rows(N - 3, R, seed=15)  # N - 3 rows: a shape of R // 2 holds them too
    remote.populate("t", rows)
    real = remote._p.manifest
    for again in (rows.reshape(-1, R // 2), rows):
        once = []

        def manifest(name, again=again):
            m = real(name)
            if not once:
                once.append(1)
                remote.remove("t", force=True)
                remote.populate("t", again)
            return m
        remote._p.manifest = manifest
        try:
            with pytest.raises(engramstore.EngramError, match="was replaced") as e:
                local.pull(remote, "t")
        finally:
            remote._p.manifest = real
        assert e.value.errno == errno.EAGAIN
        assert visible(local, local_dir, "t") == (False, [])
    assert local.pull(remote, "t") is True
    np.testing.assert_array_equal(all_rows(local, "t", N - 3), rows)


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
    """The copy records its Mooncake origin (the publication's epoch);
    check_origin() says current, gone, republished (the same rows, in the
    same chunks or others) and changed (a bit of any chunk, another
    shape); its bad arguments."""
    rows = make_rows(N, R, seed=31)
    remote.populate("t", rows)
    assert local.pull(remote, "t") is True
    o = local.get_table_spec("t")["origin"]
    epoch = remote.get_table_spec("t")["epoch"]
    assert 0 < epoch < 1 << 64
    assert o == {"store": "mooncake", "namespace": remote.namespace, "epoch": epoch, "where": ""}
    assert local.check_origin(remote, "t") == "current"
    assert local.check_origin(mc_client, "t", namespace=remote.namespace) == "current"
    remote.remove("t", force=True)
    assert local.check_origin(remote, "t") == "gone"
    remote.populate("t", rows)
    assert remote.get_table_spec("t")["epoch"] != epoch
    assert local.check_origin(remote, "t") == "republished"
    assert local.check_origin(mc_client, "t", namespace=remote.namespace) == "republished"
    # The same rows in chunks of another size (another store of the namespace).
    remote.remove("t", force=True)
    resliced = engramstore.EngramStore(namespace=remote.namespace, store_client=mc_client,
                                       chunk_bytes=333 * R)
    try:
        resliced.populate("t", rows)
        assert remote.get_table_spec("t")["chunk_rows"] == 333
        assert local.check_origin(remote, "t") == "republished"
    finally:
        resliced.close()
    # One bit changed in the first, a middle, or the last (short) chunk.
    for row in (0, N // 2, N - 1):
        remote.remove("t", force=True)
        other = rows.copy()
        other[row, 7] ^= 1
        remote.populate("t", other)
        assert local.check_origin(remote, "t") == "changed", row
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


def test_pull_rows_reading_another_shape_is_refused(remote, local, local_dir):
    """A read into a pull's append() (the protocol's read_into, which then
    writes to the pull's table itself) of a table of another shape than
    the pull's is refused before a byte is read: more rows would run past
    the table file, wider rows past the read's buffers."""
    rows = make_rows(N, R, seed=11)
    remote.populate("t", rows)
    m = remote._p.manifest("t")

    def fill(append):
        remote._p.p.read_into("t", append, N, R, m["checksum"])
    for n, r in ((10, R), (N + 1, R), (N, 2 * R), (N, R // 2)):
        with pytest.raises(ValueError, match="rows: the pull's append"):
            local._pull_rows("t", n, r, fill, lambda v: True, "test")
        assert visible(local, local_dir, "t") == (False, []), (n, r)
    assert local._pull_rows("t", N, R, fill, lambda v: True, "test", checksum=m["checksum"])
    np.testing.assert_array_equal(all_rows(local, "t", N), rows)


def test_pull_whose_fill_returns_while_its_read_runs_publishes_nothing(big, local, local_dir):
    """A fill() that leaves a read into its append() running on another
    thread and returns: the read is stopped at its next block and waited
    for (the table is aborted once fill() returns, its file unmapped),
    the pull fails, nothing is published; the append() kept after raises."""
    st, rows = big
    m = st._p.manifest("big")
    started, errors, kept = threading.Event(), [], []

    def read(append):
        try:
            st._p.p.read_into("big", append, BIG_N, R, m["checksum"],
                            lambda done, total: started.set())
        except Exception as e:  # the read's own failure, checked below
            errors.append(e)
        finally:
            started.set()

    def fill(append):
        kept.append(append)
        t = threading.Thread(target=read, args=(append,))
        kept.append(t)
        t.start()
        started.wait()
    with pytest.raises(engramstore.StateError, match="fill\\(\\) returned while"):
        local._pull_rows("big", BIG_N, R, fill, lambda v: True, "test", checksum=m["checksum"])
    append, t = kept
    t.join()
    assert visible(local, local_dir, "big") == (False, [])
    # The read stopped (ECANCELED), or had ended just before fill() looked.
    assert errors == [] or getattr(errors[0], "errno", None) == errno.ECANCELED, errors
    with pytest.raises(engramstore.StateError, match="fill\\(\\) has returned"):
        append(rows[:2])


def _xorshift_bytes(n):
    """LLVM's xxhash unit test buffer (llvm/unittests/Support/xxhashTest.cpp):
    xorshift64 from 1, the low byte of each step."""
    m, x, out = (1 << 64) - 1, 1, bytearray()
    for _ in range(n):
        x ^= (x << 13) & m
        x ^= x >> 7
        x ^= (x << 17) & m
        out.append(x & 0xFF)
    return bytes(out)


# XXH3_64bits (seed 0) of the first n bytes of _xorshift_bytes(2243), as
# LLVM's unit test has them: every length class of XXH3 (0, 1-3, 4-8, 9-16,
# 17-128, 129-240, longer, whole and partial stripes and blocks).
XXH3_KNOWN = {
    0: 0x2d06800538d394c2, 1: 0xd0d496e05c553485, 2: 0x84d625edb7055eac,
    3: 0x6ea2d59aca5c3778, 4: 0xbf65290914e80242, 5: 0xc01fd099ad4fc8e4,
    6: 0x9e3ea8187399caa5, 7: 0x9da8b60540644f5a, 8: 0xabc1413da6cd0209,
    9: 0x8bc89400bfed51f6, 16: 0x7e46916754d7c9b8, 17: 0xed4be912ba5f836d,
    32: 0xf59b59b58c304fd1, 33: 0x9013fb74ca603e0c, 64: 0xfa5271fcce0db1c3,
    65: 0x79c42431727f1012, 96: 0x591ee0ddf9c9ccd1, 97: 0x8ffc6a3111fe19da,
    128: 0x06a146ee9a2da378, 129: 0xbc7138129bf065da, 403: 0xcefeb3ffa532ad8c,
    512: 0xcdfa6b6268e3650f, 513: 0x4bb5d42742f9765f, 2048: 0x330ce110cbb79eae,
    2049: 0x3ba6afa0249fef9a, 2240: 0xd61d4d2a94e926a8, 2243: 0x0979f786a24edde7,
}


def test_xxh3_64_known_values():
    """_engram._xxh3_64 (the manifests' checksums) is XXH3-64 with seed 0:
    known values of every length class, whatever the buffer's type and
    alignment; one bit of difference changes it.  Needs no Mooncake."""
    x = engramstore._engram._xxh3_64
    buf = _xorshift_bytes(2243)
    for n, want in XXH3_KNOWN.items():
        b = buf[:n]
        assert x(b) == want, n
        assert x(bytearray(b)) == want, n
        assert x(memoryview(b)) == want, n
        assert x(np.frombuffer(b, np.uint8)) == want, n
        # At an odd address, and as 2-D rows.
        odd = np.empty(n + 1, np.uint8)[1:]
        odd[:] = np.frombuffer(b, np.uint8)
        assert x(odd) == want, n
        if n and n % 3 == 0:
            assert x(np.frombuffer(b, np.uint8).reshape(3, -1)) == want, n
    assert x(b"a") == 0xe6c632b61e964e1f
    # Any bit flipped, at every length class: another value.
    for n in (1, 3, 8, 16, 128, 240, 241, 1024, 2243):
        base = x(buf[:n])
        for bit in (0, 8 * n - 1, 4 * n + 3):
            b = bytearray(buf[:n])
            b[bit // 8] ^= 1 << (bit % 8)
            assert x(b) != base, (n, bit)
    assert len({x(buf[:n]) for n in range(300)}) == 300
    with pytest.raises(ValueError, match="contiguous"):
        x(np.zeros((4, 8), np.uint8)[:, ::2])
    for bad in ("abc", 3, None):
        with pytest.raises(TypeError):
            x(bad)


def test_xxh3_64_is_the_manifests_checksum(remote):
    """A populated table's checksum (get_table_spec()["checksum"]) and its
    chunks' are _engram._xxh3_64 of its rows, for tables of every length
    class, in one chunk or several."""
    x = engramstore._engram._xxh3_64
    buf = np.frombuffer(_xorshift_bytes(2243), np.uint8)
    for r in (1, 2, 3, 5, 9, 17, 128, 129, 240, 241, 2243):
        name = f"x{r}"
        remote.populate(name, buf[:r].reshape(1, r))
        spec = remote.get_table_spec(name)
        assert spec["checksum"] == x(buf[:r]), r
        if r in XXH3_KNOWN:
            assert spec["checksum"] == XXH3_KNOWN[r], r
    rows = make_rows(N, R, seed=21)
    remote.populate("t", rows)
    spec = remote.get_table_spec("t")
    assert spec["checksum"] == x(rows) == x(rows.tobytes())
    m = remote._p.manifest("t")
    assert len(m["chunk_sums"]) == len(spec["chunk_keys"]) == 6
    for i, s in enumerate(m["chunk_sums"]):
        assert s == x(rows[1000 * i:1000 * (i + 1)]), i
    other = rows.copy()
    other[N - 1, R - 1] ^= 1
    assert x(other) != spec["checksum"]
