"""Several processes on one namespace: shared pages, persistence across
processes, create-only populate across processes, and fork safety."""
from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest

import engramstore
import esutil
from esutil import make_rows, sentinel

METHODS = ["fork", "spawn"]
N, R = 2048, 512  # 1 MiB: 256 pages
PAGE = os.sysconf("SC_PAGE_SIZE")


def run_in(method, fn, *args, timeout=60):
    ctx = mp.get_context(method)
    with ctx.Pool(1) as pool:
        return pool.apply_async(fn, args).get(timeout)


@pytest.mark.parametrize("method", METHODS)
def test_processes_share_the_table_pages(local_dir, method):
    rows = make_rows(N, R, seed=21)
    with engramstore.EngramStore(tables={"emb": (N, R)}, namespace="shared",
                                 local_dir=local_dir) as st:
        st.populate("emb", rows)
        # the parent maps the table and touches every page
        out = sentinel((N, 1, R))
        st.lookup(["emb"], np.arange(N).reshape(-1, 1), out)
        np.testing.assert_array_equal(out[:, 0], rows)
        path = esutil.table_path(st, "emb")
        mine = esutil.smaps_entries(path)
        assert mine and max(e["Rss"] for e in mine) >= N * R

        res = run_in(method, esutil.child_lookup_all_and_smaps, local_dir, "shared", "emb", N,
                     R, 21)
        assert res["ok"] is True
        assert res["pid"] != os.getpid()
        # the child's own mapping of the file: resident and shared with us
        touched = [e for e in res["smaps"] if e.get("Rss", 0) >= N * R]
        assert touched, res["smaps"]
        for e in touched:
            shared = e.get("Shared_Clean", 0) + e.get("Shared_Dirty", 0)
            assert shared >= N * R, e
            assert e["Pss"] <= e["Rss"] // 2 + PAGE * 4, e
            assert e.get("Private_Clean", 0) + e.get("Private_Dirty", 0) <= PAGE * 4, e


@pytest.mark.parametrize("method", METHODS)
def test_child_populates_parent_reads(local_dir, method):
    # a store opened before the child wrote sees the table too
    early = engramstore.EngramStore(namespace="persist", local_dir=local_dir)
    try:
        assert run_in(method, esutil.child_populate, local_dir, "persist", "t", 300, 96, 5) == "ok"
        rows = make_rows(300, 96, seed=5)
        ids = np.arange(300)[::-1].reshape(-1, 1).copy()
        out = sentinel((300, 1, 96))
        early.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out[:, 0], rows[::-1])
    finally:
        early.close()
    with engramstore.EngramStore(tables={"t": {"num_rows": 300, "row_bytes": 96}},
                                 namespace="persist", local_dir=local_dir) as st:
        assert st.list_tables() == ["t"]
        out = sentinel((300, 1, 96))
        st.lookup(["t"], ids, out)
        np.testing.assert_array_equal(out[:, 0], rows[::-1])
        with pytest.raises(engramstore.TableExistsError):
            st.populate("t", rows)
    with pytest.raises(engramstore.LayoutMismatchError):
        engramstore.EngramStore(tables={"t": (301, 96)}, namespace="persist",
                                local_dir=local_dir)


def test_populate_is_create_only_across_processes(local_dir):
    ctx = mp.get_context("fork")
    with ctx.Pool(4) as pool:
        results = pool.starmap(esutil.child_populate,
                               [(local_dir, "once", "t", 4096, 256, seed) for seed in range(8)])
    assert results.count("ok") == 1, results
    assert set(results) == {"ok", "TableExistsError"}
    winner = results.index("ok")
    with engramstore.EngramStore(namespace="once", local_dir=local_dir) as st:
        assert st.list_tables() == ["t"]
        assert sorted(os.listdir(st.path)) == ["t"]  # no temporary files left behind
        st.verify("t")
        out = sentinel((4096, 1, 256))
        st.lookup(["t"], np.arange(4096).reshape(-1, 1), out)
        np.testing.assert_array_equal(out[:, 0], make_rows(4096, 256, seed=winner))


def test_forked_child_can_use_the_inherited_store(local_dir):
    rows = make_rows(20000, 64, seed=8)
    with engramstore.EngramStore(namespace="inh", local_dir=local_dir) as st:
        st.populate("t", rows)
        ids = np.random.default_rng(1).integers(0, 20000, 20000)
        out = sentinel((20000, 1, 64))
        st.lookup(["t"], ids.reshape(-1, 1), out)  # parent's gather threads are started
        # ... and have taken part in a lookup: on a loaded machine the pool
        # declines jobs for a while after a worker started late, so look
        # up again until one is split.
        for _ in range(1000):
            if st.stats()["parallel"] >= 1 or st.stats()["threads"] == 1:
                break
            st.lookup(["t"], ids.reshape(-1, 1), out)
        assert st.stats()["parallel"] >= 1 or st.stats()["threads"] == 1
        # a large lookup in the child, whose copy of the store has no gather
        # threads: it must complete (alone), not hang
        ctx = mp.get_context("fork")
        child = ctx.Process(target=_lookup_or_exit, args=(st, "t", ids, rows))
        child.start()
        child.join(30)
        hung = child.is_alive()
        if hung:
            child.kill()
            child.join()
        assert not hung, "the child's lookup hung"
        assert child.exitcode == 0


def test_forked_children_read_through_the_row_cache(local_dir):
    # Rows read on demand (file_cache) go through io_uring rings: a forked
    # child (a multiprocessing fork Pool worker) used to share the parent's
    # rings and crash, or break the parent's next lookup.  Children now make
    # rings of their own while the parent keeps reading with its own.
    rows = make_rows(5000, 264, seed=9)
    with engramstore.EngramStore(namespace="fc", local_dir=local_dir) as w:
        w.populate("t", rows)
    with engramstore.EngramStore(namespace="fc", local_dir=local_dir, file_cache=True,
                                 cache_bytes=1 << 20) as st:
        rng = np.random.default_rng(3)
        ids = rng.integers(0, 5000, (4000, 1))
        out = sentinel((4000, 1, 264))
        st.lookup(["t"], ids, out)  # the parent's rings are set up
        np.testing.assert_array_equal(out[:, 0], rows[ids[:, 0]])
        ctx = mp.get_context("fork")
        children = [ctx.Process(target=_lookup_or_exit, args=(st, "t", ids[::-1, 0].copy(), rows))
                    for _ in range(3)]
        for c in children:
            c.start()
        for _ in range(20):  # the parent reads meanwhile
            out = sentinel((4000, 1, 264))
            st.lookup(["t"], ids, out)
            np.testing.assert_array_equal(out[:, 0], rows[ids[:, 0]])
        for c in children:
            c.join(60)
            hung = c.is_alive()
            if hung:
                c.kill()
                c.join()
            assert not hung, "a child's lookup hung"
            assert c.exitcode == 0, c.exitcode
        assert st.stats()["cache"]["read_errors"] == 0


def _lookup_or_exit(store, name, ids, rows):
    # runs in a forked child (not pickled): exit status 0 = right rows
    os._exit(0 if esutil.child_lookup_with(store, name, ids, rows) else 3)


_KILLED_WRITER = """
import sys
import numpy as np
import engramstore
st = engramstore.EngramStore(namespace="killed", local_dir=sys.argv[1])
st.populate("big", np.zeros((2 * 1024 * 1024, 256), np.uint8))  # 512 MiB
print("finished")
"""


def test_writer_killed_mid_populate_leaves_nothing(local_dir):
    """A process SIGKILLed while it populates: no table is published, its
    temporary file is removed by the next open, and the name is free."""
    import signal
    import subprocess
    import sys
    import time

    ns_dir = os.path.join(local_dir, "killed")
    child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, local_dir],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        temps = []
        while not temps and time.monotonic() < deadline and child.poll() is None:
            if os.path.isdir(ns_dir):
                temps = [e for e in os.listdir(ns_dir) if e.startswith(".tmp.big.")]
            time.sleep(0.001)
        assert temps, "the writer never started its temporary file"
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL, child.communicate()
    assert "big" not in os.listdir(ns_dir)
    with engramstore.EngramStore(namespace="killed", local_dir=local_dir) as st:
        assert [e for e in os.listdir(ns_dir) if e.startswith(".tmp.")] == []
        assert st.list_tables() == []
        with pytest.raises(engramstore.TableNotFoundError):
            st.get_table_spec("big")
        rows = make_rows(4, 256, seed=3)
        st.populate("big", rows)
        out = sentinel((4, 1, 256))
        st.lookup(["big"], np.arange(4, dtype=np.int64).reshape(4, 1), out)
        np.testing.assert_array_equal(out[:, 0], rows)
