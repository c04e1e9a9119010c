"""Under load: lookups from many threads, the GIL released around lookup and
populate, and close() while other threads are inside lookup."""
from __future__ import annotations

import sys
import threading
import time

import numpy as np

import engramstore
from esutil import expected, make_rows, sentinel


def run_threads(n, target):
    errors = []

    def wrap(i):
        try:
            target(i)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append((i, e))

    threads = [threading.Thread(target=wrap, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
        assert not t.is_alive(), "a thread hung"
    return errors


def test_eight_threads_match_numpy(local_dir):
    tabs = {"a": make_rows(3000, 128, 1), "b": make_rows(5000, 128, 2)}
    names = ["a", "b", "a", "b"]
    with engramstore.EngramStore(namespace="mt", local_dir=local_dir) as st:
        for n, rows in tabs.items():
            st.populate(n, rows)
        barrier = threading.Barrier(8)
        done = [0] * 8

        def work(i):
            rng = np.random.default_rng(1000 + i)
            barrier.wait()
            for it in range(12):
                T = [1, 37, 600, 5000][it % 4]
                ids = np.stack([rng.integers(-1, 3000, T), rng.integers(-1, 5000, T),
                                rng.integers(0, 3000, T), rng.integers(0, 5000, T)], axis=1)
                ids = ids.astype(np.int32 if i % 2 else np.int64)
                if it % 3 == 0:  # head-major output
                    km = sentinel((4, T, 128))
                    st.lookup(names, ids, km.transpose(1, 0, 2))
                    out = km.transpose(1, 0, 2)
                else:
                    out = sentinel((T, 4, 128))
                    st.lookup(names, ids, out)
                np.testing.assert_array_equal(out, expected(tabs, names, ids))
                done[i] += 1

        assert run_threads(8, work) == []
        assert done == [12] * 8
        assert st.stats()["lookups"] == 8 * 12


def test_first_lookups_race_to_open_the_tables(local_dir):
    tabs = {f"t{j}": make_rows(100 + j, 64, j) for j in range(6)}
    with engramstore.EngramStore(namespace="race", local_dir=local_dir) as st:
        for n, rows in tabs.items():
            st.populate(n, rows)
    names = sorted(tabs)
    with engramstore.EngramStore(namespace="race", local_dir=local_dir) as st:
        barrier = threading.Barrier(8)

        def work(i):
            order = names[i % 6:] + names[:i % 6]
            ids = np.array([[k + i for k in range(6)]], np.int64)
            out = sentinel((1, 6, 64))
            barrier.wait()
            st.lookup(order, ids, out)
            np.testing.assert_array_equal(out, expected(tabs, order, ids))

        assert run_threads(8, work) == []
        assert st.stats()["tables_open"] == 6


def test_bad_ids_in_threads_leave_outputs_untouched(ab):
    st, tabs = ab

    def work(i):
        rng = np.random.default_rng(i)
        for _ in range(50):
            ids = np.stack([rng.integers(0, 17, 300), rng.integers(0, 19, 300)], 1)
            out = sentinel((300, 2, 264))
            if i % 2:
                ids[rng.integers(300), 1] = 19 + i
                try:
                    st.lookup(["a", "b"], ids, out)
                except engramstore.BadIdError as e:
                    assert f"= {19 + i} is outside table 'b'" in str(e)
                    assert (out == 0xA5).all()
                else:
                    raise AssertionError("no BadIdError")
            else:
                st.lookup(["a", "b"], ids, out)
                np.testing.assert_array_equal(out, expected(tabs, ["a", "b"], ids))

    assert run_threads(6, work) == []


def _timed(call):
    t0 = time.perf_counter()
    call()
    return time.perf_counter() - t0


def _max_gap_while(worker):
    """Runs worker() in a thread; meanwhile the main thread spins, and the
    times between its iterations (the stalls) are returned, sorted."""
    th = threading.Thread(target=worker)
    gaps = []
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        th.start()
        last = time.perf_counter()
        while th.is_alive():
            now = time.perf_counter()
            gaps.append(now - last)
            last = now
        th.join()
    finally:
        sys.setswitchinterval(old)
    return sorted(gaps)


def _assert_gil_released(calls, call_time, attempts=3):
    """Runs calls() (n library calls of about call_time each) in a thread,
    up to `attempts` times.  Holding the GIL through a call would stall the
    main thread for the whole call, n times, on every attempt; with the GIL
    released, stalls are short (an attempt may still see a few from the OS,
    e.g. page-table locks while 64 MiB are mapped, so one clean attempt
    suffices)."""
    seen = []
    for _ in range(attempts):
        n, gaps = calls()
        long_stalls = sum(g > call_time * 0.5 for g in gaps)
        if long_stalls < max(2, n // 2):
            return
        seen.append((long_stalls, n, gaps[-n:]))
    raise AssertionError(f"the main thread stalled for most calls ({call_time:.4f} s each): "
                         f"{seen}")


def test_gil_is_released_around_lookup(big_table):
    d, ns, name, rows = big_table
    with engramstore.EngramStore(namespace=ns, local_dir=d, threads=1) as st:
        names = [name] * 4
        ids = np.random.default_rng(3).integers(0, 65536, (65536, 4))
        out = np.empty((65536, 4, 1024), np.uint8)
        st.lookup(names, ids, out)  # warm up: map and fault in
        call = min(_timed(lambda: st.lookup(names, ids, out)) for _ in range(2))

        def calls(n=6):
            return n, _max_gap_while(lambda: [st.lookup(names, ids, out) for _ in range(n)])

        _assert_gil_released(calls, call)
        np.testing.assert_array_equal(out[:, 3, :8].view(np.int64)[:, 0], ids[:, 3])


def test_gil_is_released_around_populate(big_table, local_dir):
    _, _, _, rows = big_table
    with engramstore.EngramStore(namespace="pop", local_dir=local_dir, threads=1) as st:
        call = min(_timed(lambda: st.populate(n, rows)) for n in ("first", "second"))
        made = ["first", "second"]

        def calls(n=4):
            names = [f"t{len(made) + i}" for i in range(n)]
            made.extend(names)
            return n, _max_gap_while(lambda: [st.populate(x, rows) for x in names])

        _assert_gil_released(calls, call)
        assert st.list_tables() == sorted(made)
        for x in made:  # 64 MiB each: give the disk back
            st.remove(x)


def test_close_while_threads_are_inside_lookup(big_table):
    d, ns, name, rows = big_table
    nthreads = 4
    st = engramstore.EngramStore(namespace=ns, local_dir=d)
    started = [threading.Event() for _ in range(nthreads)]
    results = [[0, 0, []] for _ in range(nthreads)]  # ok, closed, other errors

    def work(i):
        rng = np.random.default_rng(50 + i)
        ids = rng.integers(0, 65536, (65536, 1)).astype(np.int64 if i % 2 else np.int32)
        out = np.empty((65536, 1, 1024), np.uint8)
        want = ids[:, 0].astype(np.int64)
        while True:
            out[:, 0, :8] = 0xFF
            try:
                st.lookup([name], ids, out)
            except engramstore.StoreClosedError as e:
                assert e.errno == engramstore.ESTATE
                results[i][1] += 1
                return
            except BaseException as e:  # noqa: BLE001
                results[i][2].append(repr(e))
                return
            # each completed lookup is complete and right
            if not (np.array_equal(out[:, 0, :8].view(np.int64)[:, 0], want)
                    and np.array_equal(out[::997, 0], rows[want[::997]])):
                results[i][2].append("wrong rows")
                return
            results[i][0] += 1
            started[i].set()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(nthreads)]
    for t in threads:
        t.start()
    for e in started:
        assert e.wait(30)
    time.sleep(0.05)
    st.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert st.closed
    for ok, closed, other in results:
        assert other == []
        assert ok >= 1 and closed == 1


def test_close_races_close_and_lookup(ab):
    # several threads close one store while others look up: one close wins,
    # the others return quietly; lookups finish or see StoreClosedError
    st, tabs = ab
    barrier = threading.Barrier(6)
    outcome = []

    def work(i):
        barrier.wait()
        if i < 2:
            st.close()
            outcome.append("closed")
            return
        ids = np.zeros((2000, 2), np.int64)
        for _ in range(200):
            out = sentinel((2000, 2, 264))
            try:
                st.lookup(["a", "b"], ids, out)
            except engramstore.StoreClosedError:
                outcome.append("saw-closed")
                return
            np.testing.assert_array_equal(out[:, 1], np.broadcast_to(tabs["b"][0], (2000, 264)))
        outcome.append("finished")

    assert run_threads(6, work) == []
    assert outcome.count("closed") == 2 and len(outcome) == 6
    assert st.closed


def test_stats_while_tables_come_and_go(local_dir):
    with engramstore.EngramStore(namespace="churn", local_dir=local_dir) as st:
        stop = threading.Event()
        rows = make_rows(64, 32, 1)

        def churn(i):
            n = 0
            while not stop.is_set() and n < 300:
                name = f"w{i}-{n}"
                st.populate(name, rows)
                out = sentinel((1, 1, 32))
                st.lookup([f"w{i}-{n}"], np.array([[n % 64]], np.int64), out)
                assert (out[0, 0] == rows[n % 64]).all()
                st.remove(f"w{i}-{n}")
                n += 1

        def watch(i):
            for _ in range(400):
                s = st.stats()
                assert set(s["tables"]) <= {f"w{j}-{k}" for j in range(2) for k in range(300)}
                for t in s["tables"].values():
                    assert t["rows"] in (0, 1)
            stop.set()

        errs = run_threads(3, lambda i: churn(i) if i < 2 else watch(i))
        assert errs == []
        assert st.list_tables() == []
