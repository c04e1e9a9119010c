"""NUMA placement from Python: the store's numa_* keywords, placement() and
get_table_spec()["numa_nodes"], numa_copy() and numa_local.

Placed writes need a tmpfs namespace, so these stores live under /dev/shm
(pytest's tmp_path may be on disk, where a placed write is refused: checked
too).  The machine these were written on has one NUMA node: every page is
on node 0, and what crossing nodes costs is not measured here.
"""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

import engramstore
from esutil import make_rows, shm_root

SPEC = {"num_rows": 1000, "row_bytes": 264, "row_pitch": 272}
PAGES = (1000 * 272 + 4095) // 4096


def _numa_built() -> bool:
    """Whether the library places pages (built with libnuma): a placed store
    on one's own node opens, or says why not."""
    d = tempfile.mkdtemp(dir="/dev/shm")
    try:
        engramstore.TableStore(namespace="probe", local_dir=d, numa_node=0).close()
        return True
    except engramstore.EngramError as e:
        assert e.errno == errno.ENOTSUP and "libnuma" in str(e), e
        return False
    finally:
        shutil.rmtree(d)


NUMA = os.path.isdir("/dev/shm") and _numa_built()
needs_numa = pytest.mark.skipif(not NUMA, reason="the library was built without libnuma")


@pytest.fixture
def shm_dir():
    with shm_root("engram-py-numa-") as d:
        yield d


def _store(root, **kw):
    return engramstore.TableStore({"t": SPEC}, namespace="ns", local_dir=root, **kw)


def _check_rows(st, name, rows):
    out = np.zeros((1000, 1, 264), np.uint8)
    st.lookup([name], np.arange(1000, dtype=np.int64).reshape(1000, 1), out)
    assert np.array_equal(out[:, 0, :], rows)


@needs_numa
@pytest.mark.parametrize("kw", [{"numa_node": 0}, {"numa_interleave": True},
                                {"numa_interleave": "0"}])
def test_placed_populate_reports_node0(shm_dir, kw):
    rows = make_rows(1000, 264, seed=1)
    with _store(shm_dir, **kw) as st:
        st.populate("t", rows)
        p = st.placement("t")
        assert p == {"nodes": {0: PAGES}, "page_size": 4096, "pages": PAGES, "sampled": PAGES,
                     "absent": 0, "other_nodes": 0, "private_copy": False}
        assert st.get_table_spec("t")["numa_nodes"] == {0: PAGES}
        _check_rows(st, "t", rows)


@needs_numa
def test_private_copy_placed(shm_dir):
    rows = make_rows(1000, 264, seed=2)
    with _store(shm_dir) as st:
        st.populate("t", rows)
    with _store(shm_dir, huge_pages=True, numa_node=0) as st:
        _check_rows(st, "t", rows)
        p = st.placement("t")
        assert p["private_copy"] is True
        assert p["nodes"][0] >= PAGES and p["nodes"][0] + p["absent"] == p["pages"]


@needs_numa
def test_bad_placements_refused(shm_dir):
    with pytest.raises(engramstore.EngramError, match="node 5 is not an online NUMA node") as ei:
        _store(shm_dir, numa_node=5)
    assert ei.value.errno == errno.EINVAL
    with pytest.raises(engramstore.EngramError, match="0000:fe:1f.7: no such PCI device") as ei:
        _store(shm_dir, numa_gpu="00000000:FE:1F.7")
    assert ei.value.errno == errno.ENODEV
    with pytest.raises(engramstore.EngramError, match="is not a PCI bus id"):
        _store(shm_dir, numa_gpu="cuda:0")
    with pytest.raises(engramstore.EngramError, match="is not a node list"):
        _store(shm_dir, numa_interleave="0-")
    # The binding's own checks: types, ranges, one placement at a time.
    with pytest.raises(ValueError, match=r"numa_node: expected a node in \[0, 63\], got 64"):
        _store(shm_dir, numa_node=64)
    with pytest.raises(ValueError, match="numa_node: expected a node"):
        _store(shm_dir, numa_node=-1)
    with pytest.raises(TypeError, match="numa_node: expected an int"):
        _store(shm_dir, numa_node="0")
    with pytest.raises(TypeError, match="numa_node: expected an int"):
        _store(shm_dir, numa_node=True)
    with pytest.raises(TypeError, match="numa_gpu: expected a str"):
        _store(shm_dir, numa_gpu=0)
    with pytest.raises(TypeError, match="numa_interleave: expected True or a node list"):
        _store(shm_dir, numa_interleave=[0, 1])
    with pytest.raises(ValueError, match="give one placement"):
        _store(shm_dir, numa_node=0, numa_interleave=True)
    # A memory store has nothing to place.
    with pytest.raises(engramstore.EngramError, match="a memory store writes no table files"):
        engramstore.TableStore(local_dir=None, numa_node=0)


@needs_numa
def test_disk_namespace_refuses_placed_writes(local_dir):
    fstype = subprocess.run(["stat", "-f", "-c", "%T", local_dir], capture_output=True,
                            text=True, check=True).stdout.strip()
    if fstype == "tmpfs":
        pytest.skip("pytest's tmp_path is a tmpfs here")
    with _store(local_dir, numa_node=0) as st:
        with pytest.raises(engramstore.EngramError, match="needs a tmpfs namespace") as ei:
            st.populate("t", make_rows(1000, 264, seed=3))
        assert ei.value.errno == errno.ENOTSUP
        assert st.list_tables() == []


@needs_numa
def test_numa_copy_and_local(shm_dir):
    rows = make_rows(1000, 264, seed=4)
    other = make_rows(1000, 264, seed=5)
    with _store(shm_dir) as st:
        st.populate("t", rows)
        assert st.numa_copy("t", 0) is True
        assert st.numa_copy("t", node=0) is False  # found, not written again
        assert "t.numa0" in st.list_tables()
        assert st.get_table_spec("t.numa0")["checksum"] == st.get_table_spec("t")["checksum"]
        assert st.placement("t.numa0")["nodes"] == {0: PAGES}
        with pytest.raises(engramstore.TableNotFoundError):
            st.numa_copy("missing", 0)
        with pytest.raises(engramstore.EngramError, match="node 7 is not an online NUMA node"):
            st.numa_copy("t", 7)
        with pytest.raises(ValueError, match="node: expected a node"):
            st.numa_copy("t", -1)
        with pytest.raises(TypeError, match="node: expected an int"):
            st.numa_copy("t", "0")
        # A copy name that holds other rows.
        st.define("u", **SPEC)
        st.define("u.numa0", **SPEC)
        st.populate("u", rows)
        st.populate("u.numa0", other)
        with pytest.raises(engramstore.LayoutMismatchError, match="with other rows"):
            st.numa_copy("u", 0)
    # numa_local: "u" is served from its copy (which holds `other`, so the
    # rows say which table answered), "t" from its identical copy.
    with engramstore.TableStore(namespace="ns", local_dir=shm_dir, numa_local=True) as st:
        _check_rows(st, "u", other)
        _check_rows(st, "t", rows)
    with engramstore.TableStore(namespace="ns", local_dir=shm_dir) as st:
        _check_rows(st, "u", rows)


def test_placement_of_a_source_is_none():
    """A table whose rows are read on demand has no pages to count."""
    with engramstore.TableStore(local_dir=None) as st:
        st.add_source("s", (10, 8), lambda rows, out: out.fill(0))
        with pytest.raises(engramstore.EngramError) as ei:
            st.placement("s")
        assert ei.value.errno == errno.ENOTSUP
        assert st.get_table_spec("s")["numa_nodes"] is None


@pytest.mark.skipif(NUMA, reason="the library has libnuma")
def test_without_libnuma(shm_dir):
    with pytest.raises(engramstore.EngramError, match="libnuma") as ei:
        _store(shm_dir, numa_node=0)
    assert ei.value.errno == errno.ENOTSUP


def test_node_arguments_checked_without_libnuma(local_dir):
    """The binding's own checks of a node argument come before the library
    (so they hold in builds without libnuma too), and an int too large for
    a C long is out of range like any other, not an OverflowError."""
    for bad in (64, -1, 2**64, -2**64):
        with pytest.raises(ValueError, match=rf"^numa_node: expected a node in \[0, 63\], "
                                             rf"got {bad}$"):
            _store(local_dir, numa_node=bad)
    with engramstore.TableStore(local_dir=None) as st:
        for bad in (64, -1, 2**64):
            with pytest.raises(ValueError, match=rf"^node: expected a node in \[0, 63\], "
                                                 rf"got {bad}$"):
                st.numa_copy("t", bad)
        for bad in (True, 0.0, "0", None):
            with pytest.raises(TypeError, match=r"^node: expected an int, got "):
                st.numa_copy("t", bad)
