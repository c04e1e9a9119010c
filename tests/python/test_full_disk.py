"""A full file system through the package: populate fails with ENOSPC
before any row is written, nothing is published, no temporary file is
left, and the tables already there still verify.  Needs root to mount a
small tmpfs; skipped elsewhere (tests/test_full_disk.c checks the same in C)."""
from __future__ import annotations

import errno
import os
import subprocess

import numpy as np
import pytest

import engramstore
from esutil import make_rows


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "mnt"
    mnt.mkdir(mode=0o700)
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m,mode=0700", "tmpfs", str(mnt)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {r.stderr.strip()}")
    try:
        yield str(mnt)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_populate_on_a_full_disk(small_fs):
    with engramstore.EngramStore(namespace="full", local_dir=small_fs) as st:
        small = make_rows(1000, 264, seed=4)  # ~0.3 MiB: fits
        st.populate("small", small)
        with pytest.raises(engramstore.EngramError) as ei:
            st.populate("big", np.zeros((40000, 264), np.uint8))  # ~10 MiB: does not
        assert ei.value.errno == errno.ENOSPC
        assert st.list_tables() == ["small"]
        ns = os.path.join(small_fs, "full")
        assert [e for e in os.listdir(ns) if e.startswith(".tmp.")] == []
        st.verify("small")
        out = np.zeros((2, 1, 264), np.uint8)
        st.lookup(["small"], np.array([[0], [999]], np.int64), out)
        np.testing.assert_array_equal(out[:, 0], small[[0, 999]])
        # The space is free again: a table that fits can still be written.
        st.populate("big", np.zeros((4000, 264), np.uint8))
        assert st.list_tables() == ["big", "small"]
