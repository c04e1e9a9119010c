"""Capacity before writing: engramstore.can_share() answers up front, and a
layer's populate refuses a layer that does not fit before its first head
is written."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import engramstore


def test_can_share_fits(local_dir):
    ans = engramstore.can_share({"t": {"num_rows": 1000, "row_bytes": 264}}, local_dir=local_dir)
    assert ans and ans.ok and ans.reason == ""
    ok, why = ans
    assert ok is True and why == ""


def test_can_share_refuses_with_figures(local_dir):
    huge = {"a": (10**12, 264), "b": {"num_rows": 10**12, "row_bytes": 264}}
    ans = engramstore.can_share(huge, local_dir=local_dir, namespace="not-made-yet")
    assert not ans
    assert "2 tables need 480.2 TiB" in ans.reason
    assert "free (of" in ans.reason
    assert not os.path.exists(os.path.join(local_dir, "not-made-yet"))


def test_can_share_layer_form_and_lists(local_dir):
    cfg = engramstore.EngramStoreConfig([10**11] * 24, 264)
    ans = engramstore.can_share({1: cfg, 2: cfg}, local_dir=local_dir)
    assert not ans and "48 tables need" in ans.reason
    assert engramstore.can_share([(10, 264), (20, 264, 272)], local_dir=local_dir)


def test_can_share_bad_specs(local_dir):
    with pytest.raises(ValueError, match="missing"):
        engramstore.can_share({"t": {"num_rows": 3}}, local_dir=local_dir)
    with pytest.raises(TypeError, match="expected a dict"):
        engramstore.can_share({"t": 5}, local_dir=local_dir)
    with pytest.raises(engramstore.SpecError):
        engramstore.can_share({"t": (0, 264)}, local_dir=local_dir)


LAYER_SCRIPT = textwrap.dedent("""
    import errno, sys, numpy as np, engramstore
    d = sys.argv[1]
    cfg = engramstore.EngramStoreConfig([12000] * 3, 264)   # 3 x 3.0 MiB: one fits, three do not
    st = engramstore.EngramStore({1: cfg}, engramstore.LocalStore(local_dir=d, namespace="ns"))
    bufs = [np.zeros((12000, 264), np.uint8) for _ in range(3)]
    try:
        st.populate(1, bufs)
    except engramstore.EngramError as e:
        assert e.errno == errno.ENOSPC, e.errno
        assert "3 tables need 9.1 MiB" in str(e), str(e)
        tabs = engramstore.EngramStore(namespace="ns", local_dir=d).list_tables()
        assert tabs == [], tabs        # nothing written
        print("refused")
    else:
        print("written")
""")


def test_layer_populate_refused_before_the_first_head(tmp_path):
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("mounting a small tmpfs needs root and unshare(1)")
    d = tmp_path / "small"
    d.mkdir()
    script = tmp_path / "layer.py"
    script.write_text(LAYER_SCRIPT)
    cmd = (f"mount -t tmpfs -o size=8m tmpfs {d} || exit 77; "
           f"{sys.executable} {script} {d}")
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", cmd],
                          capture_output=True, text=True, env=dict(os.environ))
    if proc.returncode == 77:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "refused"
