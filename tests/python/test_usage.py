"""usage(): the processes that map a table file, their shares, and the cgroup
its pages are charged to."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import engramstore

HERE = os.path.dirname(__file__)
N, R = 4096, 256  # 1 MiB

MAPPER = textwrap.dedent("""
    import sys, numpy as np, engramstore
    st = engramstore.EngramStore(namespace="u", local_dir=sys.argv[1])
    out = np.empty((4096, 1, 256), np.uint8)
    st.lookup(["t"], np.arange(4096, dtype=np.int64).reshape(4096, 1), out)  # touches every row
    print("mapped", flush=True)
    sys.stdin.readline()
""")


def test_usage_counts_the_processes_and_their_shares(local_dir, tmp_path):
    script = tmp_path / "mapper.py"
    script.write_text(MAPPER)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    with engramstore.EngramStore(namespace="u", local_dir=local_dir) as st:
        st.populate("t", np.full((N, R), 3, np.uint8))
        u = st.usage("t")
        assert u["processes"] == 0 and u["pss_bytes"] == 0
        assert u["file_bytes"] >= N * R
        out = np.empty((N, 1, R), np.uint8)
        st.lookup(["t"], np.arange(N, dtype=np.int64).reshape(N, 1), out)
        p = subprocess.Popen([sys.executable, str(script), local_dir], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert p.stdout.readline().strip() == "mapped"
            u = st.usage("t")
            assert u["processes"] == 2
            # Whatever this process may not read (a container's PID 1) maps none of it.
            assert u["unreadable_may_map"] is False
            assert u["rss_bytes"] == N * R
            assert abs(u["pss_bytes"] - N * R / 2) <= N * R * 0.05
            assert abs(u["total_pss_bytes"] - N * R) <= N * R * 0.05
            if u["cgroup"] is not None:  # page frames readable (CAP_SYS_ADMIN)
                assert os.path.isdir(u["cgroup"])
                assert u["cgroup_pages"] <= u["sampled_pages"]
            else:
                assert u["sampled_pages"] == 0
        finally:
            p.communicate("\n", timeout=60)
        assert p.returncode == 0


HIDDEN = textwrap.dedent("""
    import ctypes, mmap, sys
    assert ctypes.CDLL(None).prctl(4, 0, 0, 0, 0) == 0  # PR_SET_DUMPABLE: 0
    f = open(sys.argv[1], "rb")
    m = mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ)
    sum(m[i] for i in range(0, len(m), 4096))
    print("mapped", flush=True)
    sys.stdin.readline()
""")


def test_usage_of_a_mapper_that_cannot_be_read(local_dir, tmp_path):
    """A process that is not dumpable cannot be read without CAP_SYS_PTRACE:
    a table it maps is flagged, one it does not map is not."""
    script = tmp_path / "hidden.py"
    script.write_text(HIDDEN)
    with engramstore.EngramStore(namespace="u", local_dir=local_dir) as st:
        st.populate("mapped", np.full((N, R), 3, np.uint8))
        st.populate("other", np.full((N, R), 4, np.uint8))
        p = subprocess.Popen([sys.executable, str(script), os.path.join(local_dir, "u", "mapped")],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        try:
            assert p.stdout.readline().strip() == "mapped"
            try:
                open(f"/proc/{p.pid}/maps").close()
                pytest.skip("this process reads a process that is not dumpable "
                            "(root, or CAP_SYS_PTRACE): tests/test_usage.c runs it as another user")
            except PermissionError:
                pass
            u = st.usage("mapped")
            assert u["unreadable"] >= 1 and u["unreadable_may_map"] is True, u
            u = st.usage("other")
            assert u["unreadable"] >= 1 and u["unreadable_may_map"] is False, u
        finally:
            p.communicate("\n", timeout=60)
        assert p.returncode == 0


def test_usage_errors(local_dir):
    with engramstore.EngramStore(namespace="u", local_dir=local_dir) as st:
        with pytest.raises(engramstore.TableNotFoundError):
            st.usage("missing")
        with pytest.raises(TypeError):
            st.usage(5)
        with pytest.raises(ValueError):
            st.usage("a\x00b")
    with engramstore.EngramStore(local_dir=None) as mem:
        with pytest.raises(engramstore.TableNotFoundError):
            mem.usage("t")
