"""Fixtures for the engramstore tests.  Every store lives under pytest's
tmp_path (never the default root /dev/shm/engram)."""
from __future__ import annotations

import gc
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import engramstore  # noqa: E402
from esutil import make_rows  # noqa: E402

SPEC_A = {"num_rows": 17, "row_bytes": 264}
SPEC_B = {"num_rows": 19, "row_bytes": 264}


@pytest.fixture
def local_dir(tmp_path):
    d = tmp_path / "root"
    d.mkdir()
    return str(d)


@pytest.fixture
def rows_a():
    return make_rows(17, 264, seed=1)


@pytest.fixture
def rows_b():
    return make_rows(19, 264, seed=2)


@pytest.fixture
def store(local_dir):
    """An empty table store with tables a [17, 264] and b [19, 264] declared."""
    st = engramstore.EngramStore(tables={"a": SPEC_A, "b": SPEC_B}, namespace="model-x",
                                 local_dir=local_dir)
    yield st
    st.close()


@pytest.fixture
def ab(store, rows_a, rows_b):
    """(store, {"a": rows, "b": rows}) with both tables populated."""
    store.populate("a", rows_a)
    store.populate("b", rows_b)
    return store, {"a": rows_a, "b": rows_b}


@pytest.fixture
def config():
    def make(sizes, row_bytes):
        cfg = engramstore.EngramStoreConfig()
        cfg.table_vocab_sizes = list(sizes)
        cfg.row_bytes = row_bytes
        return cfg
    return make


@pytest.fixture(autouse=True)
def _collect():
    yield
    gc.collect()


@pytest.fixture(scope="session")
def big_table(tmp_path_factory):
    """A 64 MiB table (65536 rows of 1024 bytes) stored once per session:
    (local_dir, namespace, name, rows).  Row i starts with i as int64."""
    d = str(tmp_path_factory.mktemp("big"))
    n, r = 65536, 1024
    base = make_rows(1024, r, seed=7)
    rows = np.tile(base, (n // 1024, 1))
    rows[:, :8] = np.arange(n, dtype=np.int64).view(np.uint8).reshape(n, 8)
    with engramstore.EngramStore(namespace="big", local_dir=d) as st:
        st.populate("big", rows)
    return d, "big", "big", rows


# ---- a Mooncake Store on 127.0.0.1 (tests/python/mcserver.py) ------------

@pytest.fixture(scope="session")
def mooncake(tmp_path_factory):
    """The session's Mooncake metadata server and master (MooncakeServers),
    with one client holding a 512 MiB segment, so every object lives in
    this process's memory and every test client (segment 0) reads it over
    TCP, as a second node would.  Skips where the wheel is not installed,
    unless ENGRAM_REQUIRE_MOONCAKE=1 (scripts/test.sh sets it once the
    wheel installed), where that is a failure."""
    import mcserver
    mcserver.require_mooncake()
    srv = mcserver.MooncakeServers(str(tmp_path_factory.mktemp("mooncake")))
    srv.start()
    holder = None
    try:
        holder = srv.client(segment_bytes=512 << 20)
        yield srv
    finally:
        if holder is not None:
            holder.close()
        srv.stop()


@pytest.fixture(scope="session")
def mc_client(mooncake):
    """A client of the session's store with no segment of its own."""
    c = mooncake.client()
    yield c
    c.close()
