"""Tables shared by processes without a leader: populate_shared (exactly one
process writes, the others reuse after comparing) and wait_for (block until
another process publishes)."""
from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import engramstore
from esutil import make_rows

HERE = os.path.dirname(__file__)

RANK = textwrap.dedent("""
    import json, sys, numpy as np, engramstore
    from esutil import make_rows
    d, ns = sys.argv[1], sys.argv[2]
    st = engramstore.EngramStore(namespace=ns, local_dir=d)
    st.wait_for("go", timeout=60)
    wrote = [st.populate_shared(f"t{i}", make_rows(5000, 264, seed=i)) for i in range(3)]
    cfg = engramstore.EngramStoreConfig([3000, 2000], 264)
    lay = engramstore.EngramStore({1: cfg}, st)
    lay.populate(1, [make_rows(3000, 264, seed=7), make_rows(2000, 264, seed=8)], shared=True)
    ids = np.array([[0, 4999], [17, 2]], np.int64)
    out = np.empty((2, 2, 264), np.uint8)
    st.lookup(["t0", "t2"], ids, out)
    assert (out[:, 0] == make_rows(5000, 264, seed=0)[ids[:, 0]]).all()
    assert (out[:, 1] == make_rows(5000, 264, seed=2)[ids[:, 1]]).all()
    print(json.dumps(wrote))
""")


def test_processes_share_without_a_leader(local_dir, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    # Independent interpreters: they share nothing but the directory (and
    # this process's import path, to find the same engramstore).
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE] + [p for p in sys.path if p]))
    procs = [subprocess.Popen([sys.executable, str(script), local_dir, "shared"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env, start_new_session=True) for _ in range(4)]
    time.sleep(0.5)
    with engramstore.EngramStore(namespace="shared", local_dir=local_dir) as st:
        st.populate("go", np.zeros((1, 8), np.uint8))
        results = []
        for p in procs:
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
            results.append(json.loads(out.strip().splitlines()[-1]))
        for i in range(3):
            assert sum(r[i] for r in results) == 1  # exactly one writer per table
        assert st.list_tables() == ["engram:l1:h0", "engram:l1:h1", "go", "t0", "t1", "t2"]
        assert st.verify("t1") is None


def test_populate_shared_reuses_and_refuses_other_rows(local_dir):
    rows = make_rows(100, 264, seed=1)
    with engramstore.EngramStore(namespace="ns", local_dir=local_dir) as st:
        assert st.populate_shared("t", rows) is True
        assert st.populate_shared("t", rows) is False
        other = rows.copy()
        other[5, 3] ^= 1
        with pytest.raises(engramstore.LayoutMismatchError, match="other rows"):
            st.populate_shared("t", other)
        with pytest.raises(engramstore.LayoutMismatchError, match="num_rows=100"):
            st.populate_shared("t", make_rows(99, 264, seed=1))
        with pytest.raises(TypeError):
            st.populate_shared("t", rows.astype(np.int16))


def test_layer_shared_is_local_only(local_dir):
    cfg = engramstore.EngramStoreConfig([10], 264)
    with engramstore.EngramStore(namespace="ns", local_dir=local_dir) as st:
        lay = engramstore.EngramStore({1: cfg}, st)
        lay.populate(1, [make_rows(10, 264, seed=2)], shared=True)
        lay.populate(1, [make_rows(10, 264, seed=2)], shared=True)   # reused
        with pytest.raises(engramstore.TableExistsError):
            lay.populate(1, [make_rows(10, 264, seed=2)])


def test_wait_for(local_dir):
    with engramstore.EngramStore(namespace="ns", local_dir=local_dir) as st:
        t0 = time.monotonic()
        with pytest.raises(engramstore.EngramError) as ei:
            st.wait_for("never", timeout=0.2)
        assert ei.value.errno == errno.ETIMEDOUT
        assert time.monotonic() - t0 >= 0.19
        assert "within 200 ms" in str(ei.value)
        with pytest.raises(engramstore.TableNotFoundError):
            st.wait_for("never", timeout=0)
        with pytest.raises(ValueError, match="timeout"):
            st.wait_for("never", timeout=-1)
        # Another store (as another process would) publishes while we wait.
        other = engramstore.EngramStore(namespace="ns", local_dir=local_dir)
        th = threading.Timer(0.2, other.populate, ("soon", make_rows(4, 264, seed=3)))
        th.start()
        st.wait_for("soon")              # no limit
        th.join()
        other.close()
        out = np.empty((1, 1, 264), np.uint8)
        st.lookup(["soon"], np.array([[3]], np.int64), out)
        assert (out[0, 0] == make_rows(4, 264, seed=3)[3]).all()


# A writer of table "h" that hangs: it makes its temporary file as the
# library's writers do (docs/format.md, "Publication"), takes its lock,
# and stops itself, holding the name until the test kills it.
HUNG_WRITER = textwrap.dedent("""
    import ctypes, fcntl, os, signal, sys
    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG: dies with the test
    ns = sys.argv[1]
    fd = os.open(os.path.join(ns, f".tmp.h.{os.getpid()}.1a2b"),
                 os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    print("ready", flush=True)
    while True:
        os.kill(os.getpid(), signal.SIGSTOP)
""")


def test_populate_shared_gives_up_on_a_writer_that_hangs(local_dir):
    rows = make_rows(100, 264, seed=5)
    with engramstore.EngramStore(namespace="hung", local_dir=local_dir) as st:
        writer = subprocess.Popen([sys.executable, "-c", HUNG_WRITER, st.path],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert writer.stdout.readline().strip() == "ready"
            who = f"by pid {writer.pid}, which has held it for "
            t0 = time.monotonic()
            with pytest.raises(engramstore.EngramError) as ei:
                st.populate_shared("h", rows, timeout=0.2)
            assert time.monotonic() - t0 >= 0.19  # a deadline never comes early
            assert ei.value.errno == errno.ETIMEDOUT
            msg = str(ei.value)
            assert "table 'h' is still being written" in msg and who in msg, msg
            assert f".tmp.h.{writer.pid}.1a2b" in msg and "after 200 ms" in msg, msg
            with pytest.raises(engramstore.EngramError, match=f"by pid {writer.pid}"):
                st.populate_shared("h", rows, timeout=0)
            with pytest.raises(engramstore.EngramError, match="it is being written " + who):
                st.wait_for("h", timeout=0.1)
            with pytest.raises(ValueError, match="timeout"):
                st.populate_shared("h", rows, timeout=-1)
            with pytest.raises(TypeError):
                st.populate_shared("h", rows, 5.0)  # keyword only
        finally:
            os.kill(writer.pid, signal.SIGKILL)
            writer.wait()
        # The writer is gone: the next call writes the table itself.
        assert st.populate_shared("h", rows, timeout=0.2) is True
        assert st.populate_shared("h", rows, timeout=None) is False


def test_populate_shared_bad_timeouts(local_dir):
    rows = make_rows(10, 264, seed=6)
    with engramstore.EngramStore(namespace="to", local_dir=local_dir) as st:
        for timeout, exc, text in [(float("nan"), ValueError, "timeout: expected seconds >= 0 or None, got nan"),
                                   (-0.001, ValueError, "timeout: expected seconds >= 0"),
                                   (float("-inf"), ValueError, "timeout: expected seconds >= 0"),
                                   ("1", TypeError, "str"),
                                   ([1], TypeError, "list")]:
            with pytest.raises(exc, match=text):
                st.populate_shared("x", rows, timeout=timeout)
        assert st.list_tables() == []
        # No limit at all, or beyond what the C API counts: the same as None.
        assert st.populate_shared("x", rows, timeout=float("inf")) is True
        assert st.populate_shared("x", rows, timeout=1e300) is False
        with pytest.raises(TypeError, match="unexpected keyword|invalid keyword"):
            st.populate_shared("x", rows, timeot=1)
