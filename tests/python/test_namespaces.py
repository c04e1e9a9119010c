"""Namespaces through the package: namespaces(), namespace_usage() (a
store's lease while it is open, a killed process's stale lease),
remove_namespace() and gc()."""
from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import engramstore
from esutil import make_rows

HERE = os.path.dirname(__file__)

USER = textwrap.dedent("""
    import sys, time, numpy as np, engramstore
    st = engramstore.EngramStore(namespace=sys.argv[2], local_dir=sys.argv[1])
    st.lookup(["t"], np.array([[1]], np.int64), np.empty((1, 1, 8), np.uint8))
    print("open", flush=True)
    time.sleep(120)
""")


def make_ns(local_dir, ns, rows=16):
    st = engramstore.EngramStore(tables={"t": {"num_rows": rows, "row_bytes": 8}},
                                 namespace=ns, local_dir=local_dir)
    st.populate("t", make_rows(rows, 8, seed=3))
    st.close()


def age(local_dir, ns, seconds):
    d = os.path.join(local_dir, ns)
    t = time.time() - seconds
    for e in os.listdir(d):
        os.utime(os.path.join(d, e), (t, t), follow_symlinks=False)
    os.utime(d, (t, t))


def start_user(local_dir, ns):
    p = subprocess.Popen([sys.executable, "-c", USER, local_dir, ns], stdout=subprocess.PIPE,
                         text=True, env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)),
                         cwd=HERE)
    assert p.stdout is not None and p.stdout.readline().strip() == "open"
    return p


def test_own_store_holds_a_lease(local_dir):
    make_ns(local_dir, "a")
    assert engramstore.namespaces(local_dir) == ["a"]
    u = engramstore.namespace_usage("a", local_dir)
    assert (u.users, u.stale_leases, u.first_user) == (0, 0, "")
    assert abs(time.time() - u.last_used) < 600
    st = engramstore.EngramStore(namespace="a", local_dir=local_dir)
    st.lookup(["t"], np.array([[0]], np.int64), np.empty((1, 1, 8), np.uint8))
    u = engramstore.namespace_usage("a", local_dir)
    assert u.users == 1 and f"pid {os.getpid()} " in u.first_user
    # This process's own lease does not stop a removal.
    engramstore.remove_namespace("a", local_dir, tables=True)
    assert engramstore.namespaces(local_dir) == []
    st.close()


def test_other_process_live_then_stale(local_dir):
    make_ns(local_dir, "busy")
    p = start_user(local_dir, "busy")
    try:
        u = engramstore.namespace_usage("busy", local_dir)
        assert u.users == 1 and f"pid {p.pid} " in u.first_user
        with pytest.raises(engramstore.EngramError) as ei:
            engramstore.remove_namespace("busy", local_dir, tables=True)
        assert ei.value.errno == errno.EBUSY and f"pid {p.pid}" in str(ei.value)
        age(local_dir, "busy", 7200)
        (r,) = engramstore.gc(older_than=0, local_dir=local_dir)
        assert (r.namespace, r.action) == ("busy", "kept") and "in use" in r.reason
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    u = engramstore.namespace_usage("busy", local_dir)
    assert (u.users, u.stale_leases) == (0, 1)
    (r,) = engramstore.gc(older_than=3600, local_dir=local_dir, dry_run=True)
    assert r.action == "would_remove" and r.reason.startswith("no live lease, last used 7")
    assert engramstore.namespaces(local_dir) == ["busy"]
    (r,) = engramstore.gc(older_than=3600, local_dir=local_dir)
    assert r.action == "removed"
    assert engramstore.namespaces(local_dir) == []


def test_remove_in_use_when_asked(local_dir):
    make_ns(local_dir, "busy")
    p = start_user(local_dir, "busy")
    try:
        engramstore.remove_namespace("busy", local_dir, tables=True, in_use=True)
        assert engramstore.namespaces(local_dir) == []
        assert p.poll() is None
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()


def test_gc_keeps_recent_and_foreign(local_dir):
    make_ns(local_dir, "new")
    make_ns(local_dir, "odd")
    with open(os.path.join(local_dir, "odd", "notes.txt"), "w") as f:
        f.write("mine")
    age(local_dir, "odd", 7200)
    res = {r.namespace: r for r in engramstore.gc(older_than=3600, local_dir=local_dir)}
    assert res["new"].action == "kept" and res["new"].reason.startswith("used ")
    assert res["odd"].action == "failed" and "notes.txt" in res["odd"].reason
    assert engramstore.namespaces(local_dir) == ["new", "odd"]


def test_gc_huge_ages_keep_everything(local_dir):
    # An age past what 64 bits hold means "never": it must not wrap
    # around to a small one and remove what it was meant to keep.
    make_ns(local_dir, "old")
    age(local_dir, "old", 7200)
    for older_than in (2**64, 2**64 + 5, 10**400, 1e30, float("inf")):
        (r,) = engramstore.gc(older_than=older_than, local_dir=local_dir)
        assert r.action == "kept", (older_than, r)
    assert engramstore.namespaces(local_dir) == ["old"]
    with pytest.raises(ValueError, match="older_than"):
        engramstore.gc(older_than=float("nan"), local_dir=local_dir)
    # The C layer takes no age it cannot hold either.
    from engramstore import _engram
    with pytest.raises(OverflowError):
        _engram.namespace_gc(local_dir, 2**64, True)
    assert engramstore.namespaces(local_dir) == ["old"]


def test_bad_inputs(local_dir):
    make_ns(local_dir, "a")
    with pytest.raises(engramstore.TableNotFoundError) as ei:
        engramstore.namespace_usage("missing", local_dir)
    assert ei.value.errno == errno.ENOENT and "missing does not exist" in str(ei.value)
    with pytest.raises(engramstore.SpecError):
        engramstore.namespace_usage("../a", local_dir)
    with pytest.raises(ValueError, match="negative"):
        engramstore.gc(older_than=-1, local_dir=local_dir)
    with pytest.raises(engramstore.EngramError) as ei:
        engramstore.gc(local_dir=os.path.join(local_dir, "nope"))
    assert ei.value.errno == errno.ENOENT
    with pytest.raises(engramstore.EngramError) as ei:
        engramstore.remove_namespace("a", local_dir)
    assert ei.value.errno == errno.ENOTEMPTY and "'t'" in str(ei.value)
    with pytest.raises(TypeError):
        engramstore.namespace_usage(5, local_dir)  # type: ignore[arg-type]


def test_namespace_argument_named(local_dir):
    # A NUL would make the library act on "a"; it is refused, like a name
    # that is no str, with the argument named.
    make_ns(local_dir, "a")
    for call in (lambda ns: engramstore.namespace_usage(ns, local_dir),
                 lambda ns: engramstore.remove_namespace(ns, local_dir, tables=True)):
        with pytest.raises(ValueError, match="^namespace: cannot contain NUL"):
            call("a\0b")
        with pytest.raises(TypeError, match="^namespace: expected a str, got int"):
            call(5)
    assert engramstore.namespaces(local_dir) == ["a"]
