"""What remove() gives back: a removed table's mapping is released once no
running lookup can read it, also while other threads look the table up,
and stats() counts what removed tables still hold."""
from __future__ import annotations

import threading

import numpy as np
import pytest

import engramstore
from esutil import make_rows

N, R = 512, 264


def maps_count() -> int:
    with open("/proc/self/maps", "rb") as f:
        return f.read().count(b"\n")


def gen_rows(gen: int) -> np.ndarray:
    """Row i: i as int64, then the generation byte."""
    rows = np.full((N, R), gen % 256, np.uint8)
    rows[:, :8] = np.arange(N, dtype=np.int64).view(np.uint8).reshape(N, 8)
    return rows


def test_remove_cycles_keep_nothing(local_dir):
    spec = {"num_rows": N, "row_bytes": R}
    with engramstore.EngramStore(tables={"t": spec}, namespace="cyc",
                                 local_dir=local_dir) as st:
        ids = np.arange(N, dtype=np.int64).reshape(N, 1)
        out = np.empty((N, 1, R), np.uint8)
        base = None
        for i in range(300):
            st.populate("t", gen_rows(i))
            st.lookup(["t"], ids, out)
            assert (out[:, 0, 8:] == i % 256).all()
            st.remove("t")
            s = st.stats()
            assert s["removed_tables"] == 0 and s["removed_bytes"] == 0
            assert s["tables_open"] == 0
            if i == 10:
                base = maps_count()
        # one mapping per removed table would be 290 more
        assert maps_count() <= base + 8


def test_remove_under_lookups_in_threads(local_dir):
    spec = {"num_rows": N, "row_bytes": R}
    keep = make_rows(N, R, seed=3)
    with engramstore.EngramStore(tables={"keep": spec, "t": spec}, namespace="churn",
                                 local_dir=local_dir, threads=2) as st:
        st.populate("keep", keep)
        st.populate("t", gen_rows(0))
        stop = threading.Event()
        seen = {"ok": 0, "gone": 0}
        errors: list[BaseException] = []
        lock = threading.Lock()

        def work(seed: int) -> None:
            rng = np.random.default_rng(seed)
            out = np.empty((600, 2, R), np.uint8)  # > 256 rows: the GIL is released
            try:
                while not stop.is_set():
                    ids = rng.integers(0, N, (600, 2), dtype=np.int64)
                    out.fill(0xA5)
                    try:
                        st.lookup(["keep", "t"], ids, out)
                    except (engramstore.TableRemovedError, engramstore.TableNotFoundError):
                        assert (out == 0xA5).all()
                        with lock:
                            seen["gone"] += 1
                        continue
                    assert (out[:, 0] == keep[ids[:, 0]]).all()
                    got = out[:, 1, :8].copy().view(np.int64).reshape(-1)
                    assert (got == ids[:, 1]).all()
                    gens = np.unique(out[:, 1, 8:])
                    assert len(gens) == 1  # all rows of one table
                    with lock:
                        seen["ok"] += 1
            except BaseException as e:  # noqa: BLE001 - reported by the main thread
                errors.append(e)

        ths = [threading.Thread(target=work, args=(i,)) for i in range(3)]
        for t in ths:
            t.start()
        try:
            for gen in range(1, 300):
                st.remove("t")
                st.populate("t", gen_rows(gen))
        finally:
            stop.set()
            for t in ths:
                t.join()
        if errors:
            raise errors[0]
        assert seen["ok"] > 0
        s = st.stats()
        assert s["removed_tables"] == 0  # nothing runs now: all released


def test_stats_keys_documented(local_dir):
    with engramstore.EngramStore(namespace="k", local_dir=local_dir) as st:
        s = st.stats()
        assert "removed_tables" in s and "removed_bytes" in s
        assert "removed_tables" in type(st).stats.__doc__
