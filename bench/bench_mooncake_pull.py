#!/usr/bin/env python3
"""Pulling a table from a Mooncake Store into local memory, and lookups after.

    bench/bench_mooncake_pull.py [--quick] [--table-bytes 1073741824] [--row-bytes 264]
                                 [--chunk-bytes 268435456] [--baseline batch|each]
                                 [--reps 5] [--ids 4096] [--lookups 20] [--json FILE]

This process starts Mooncake's metadata server and master on free
127.0.0.1 ports (tests/python/mcserver.py), joins the store with a segment
that holds the objects, and publishes one table of --table-bytes (rows of
--row-bytes, their bytes known without the table, as bench_mooncake.py
makes them) twice: through engramstore's table API (what a pull copies:
its chunk objects of --chunk-bytes, the library's default 256 MiB) and as
head 0 of a layer of Mooncake's own EngramStore (the same rows).  A
second process (this script with --reader) joins the store without a
segment, so every byte it reads crosses the transfer engine's TCP path, and
times, in the same run:

  (a) pull      local.pull(MooncakeTableStore, name) into a namespace on
                /dev/shm (a new table every repetition, removed after it),
                against
      bulk      the same bytes, the table's chunk objects
                (get_table_spec()["chunk_keys"]), read by the bare Mooncake
                client into one buffer registered (and touched) once, each
                chunk at its place: one batch_get_into() call of every
                chunk (--baseline batch, the default), or one get_into()
                call per chunk in turn (--baseline each); --reps
                repetitions after one untimed run of each, alternating
                which goes first; the median, min and max of each, and
                pull / bulk of the medians (said plainly when the bare read
                wins); and
      write     the same rows written into a local table by populate()
                from memory (the rows the bulk read left): the local write
                every pull makes and the bare read does not, timed in the
                same repetitions, so that pull / (bulk + write) says how
                much of the pull is neither;
  (b) lookups   of [ids, 1] uniform ids from the pulled table against
                Mooncake's EngramStore (mooncake.store.EngramStore, its
                float32 API, embedding_dim = row_bytes / 4) on the same rows:
                --lookups lookups per run, --reps runs alternating which
                goes first, the median rate in ids/s.

Each arm of (a) also counts the CPU time it took, of this reader and of
the process serving the Store's segment (user + system, from /proc): on a
machine whose CPUs the transfer alone fills, a pull cannot take less than
its CPU time over the CPUs, and the output says what bound that puts on
pull / bulk.

Every pulled table and every lookup's rows are checked against the rows'
known contents.  --quick: a 64 MiB table, 3 repetitions, for a smoke run.
The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

from bench_mooncake import expected_words, fill_head  # noqa: E402

NAME = "t"
NAMESPACE = "bench-pull"


def check_words(got, ids, row_bytes):
    """Rows of head 0 for ids [T]: wrong rows counted."""
    w = np.ascontiguousarray(got).view(np.uint32).reshape(len(ids), row_bytes // 4)
    want = expected_words(ids.reshape(1, -1, 1), row_bytes).reshape(len(ids), row_bytes // 4)
    return int((w != want).any(-1).sum())


def summary(ts):
    return {"median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts), "runs": ts}


def cpu_s(pid):
    """User + system CPU seconds of process pid so far (every thread)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed(fn):
    """(wall seconds, CPU seconds of this process and of its parent, the
    Store's server) of fn()."""
    me, server = os.getpid(), os.getppid()
    c0 = cpu_s(me) + cpu_s(server)
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return dt, cpu_s(me) + cpu_s(server) - c0


def reader(args):
    import engramstore
    from mooncake.store import EngramStore as MooncakeEngramStore
    from mooncake.store import EngramStoreConfig as MooncakeConfig
    from mooncake.store import MooncakeDistributedStore

    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    mc = MooncakeDistributedStore()
    if mc.setup("127.0.0.1", args.metadata, 0, 64 << 20, "tcp", "", args.master) != 0:
        raise SystemExit("reader: setup failed")
    N, R = args.rows, args.row_bytes
    size = N * R
    remote = engramstore.EngramStore(namespace=NAMESPACE, store_client=mc)
    spec = remote.get_table_spec(NAME)
    # The chunk objects a pull reads, each at its place in the table.
    keys, cr = spec["chunk_keys"], spec["chunk_rows"]
    sizes = [min(cr, N - i * cr) * R for i in range(len(keys))]
    if (spec["num_rows"], spec["row_bytes"]) != (N, R) or sum(sizes) != size or \
            min(sizes) <= 0:
        raise SystemExit(f"reader: the table is not {N} rows of {R} bytes in chunks of {cr} "
                         f"rows: {len(keys)} chunk keys")
    buf = np.ones(size, np.uint8)  # touched: the timing is the read's alone
    assert mc.register_buffer(buf.ctypes.data, buf.nbytes) == 0
    ptrs = [buf.ctypes.data + i * cr * R for i in range(len(keys))]
    root = tempfile.mkdtemp(prefix="bench-mooncake-pull-", dir=args.local_root)

    def run_bulk():
        got = []

        def read():
            if args.baseline == "batch":
                got.extend(mc.batch_get_into(keys, ptrs, sizes))
            else:
                got.extend(mc.get_into(k, p, n) for k, p, n in zip(keys, ptrs, sizes))
        t = timed(read)
        if got != sizes:
            bad = next(i for i, (g, n) in enumerate(zip(got, sizes)) if g != n)
            raise SystemExit(f"bulk: {'batch_get_into' if args.baseline == 'batch' else 'get_into'}"
                             f" answered {got[bad]} for chunk {bad} ({keys[bad]}), not "
                             f"{sizes[bad]}")
        return t

    def run_pull():
        with engramstore.EngramStore(namespace="p", local_dir=root) as local:
            copied = []
            t = timed(lambda: copied.append(local.pull(remote, NAME)))
            if copied != [True]:
                raise SystemExit("pull: the table was not copied")
            return t

    def drop_local():
        engramstore.remove_namespace("p", root, tables=True)

    def run_write(rows=buf.reshape(N, R)):
        with engramstore.EngramStore(namespace="w", local_dir=root) as local:
            t = timed(lambda: local.populate(NAME, rows))
        engramstore.remove_namespace("w", root, tables=True)
        return t

    # One untimed run of each first: the connections, the staging buffer's
    # registration and the threads are set up once per process.
    run_bulk()
    run_pull()
    drop_local()
    run_write()
    load = [os.getloadavg()[0]]  # other work on the machine skews every figure
    pull_t, bulk_t, write_t = [], [], []
    cpu = {"pull": [], "bulk": [], "write": []}
    wrong = {"bulk": 0, "pull": 0}
    for rep in range(args.reps):
        # bulk before write: the write's rows are the ones the bulk read
        order = ("pull", "bulk", "write") if rep % 2 == 0 else ("bulk", "write", "pull")
        for what in order:
            if what == "bulk":
                dt, c = run_bulk()
                bulk_t.append(dt)
                if rep == 0:
                    wrong["bulk"] = check_words(buf.reshape(N, R), np.arange(N), R)
            elif what == "write":
                dt, c = run_write()
                write_t.append(dt)
            else:
                dt, c = run_pull()
                pull_t.append(dt)
                if rep < args.reps - 1:
                    drop_local()
            cpu[what].append(c)
        print(f"rep {rep}: pull {pull_t[-1]:.3f} s, bulk {bulk_t[-1]:.3f} s, "
              f"write {write_t[-1]:.3f} s", file=sys.stderr, flush=True)
    mc.unregister_buffer(buf.ctypes.data)
    del buf

    # (b) lookups from the pulled table against Mooncake's EngramStore.
    local = engramstore.EngramStore(namespace="p", local_dir=root)
    with engramstore.EngramStore(namespace="p", local_dir=root) as check:
        check.verify(NAME)
    wrong["pull"] = check_words(
        local.lookup([NAME], np.arange(N, dtype=np.int64)[:, None]), np.arange(N), R)
    mcfg = MooncakeConfig()
    mcfg.table_vocab_sizes = [N]
    mcfg.embedding_dim = R // 4
    theirs = MooncakeEngramStore(args.layer, mcfg, mc)
    out = np.zeros((args.ids, 1, R), np.uint8)
    rng = np.random.default_rng(5)
    look_t = {"engram": [], "mooncake": []}
    for rep in range(args.reps):
        pool = [rng.integers(0, N, args.ids, dtype=np.int64) for _ in range(args.lookups)]
        order = ("engram", "mooncake") if rep % 2 == 0 else ("mooncake", "engram")
        for what in order:
            t0 = time.perf_counter()
            for ids in pool:
                if what == "engram":
                    local.lookup([NAME], ids[:, None], out)
                    res = out
                else:
                    res = theirs.lookup(ids.reshape(1, -1, 1))
            look_t[what].append(time.perf_counter() - t0)
            bad = check_words(res.view(np.uint8) if what == "mooncake" else res, pool[-1], R)
            wrong[f"lookup {what}"] = wrong.get(f"lookup {what}", 0) + bad
    local.close()
    remote.close()
    theirs = None
    mc.close()
    shutil.rmtree(root, ignore_errors=True)
    ids_per_run = args.ids * args.lookups
    load.append(os.getloadavg()[0])
    res = {"bytes": size, "chunks": len(keys), "chunk_rows": cr, "baseline": args.baseline,
           "loadavg_1min": load, "pull": summary(pull_t), "bulk": summary(bulk_t),
           "write": summary(write_t), "cpu_s": cpu, "cpus": os.cpu_count(),
           "lookup_ids_per_s": {k: ids_per_run / statistics.median(v) for k, v in look_t.items()},
           "lookup_runs_s": look_t, "wrong_rows": wrong}
    print("RESULT " + json.dumps(res), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 64 MiB table, 3 repetitions")
    ap.add_argument("--table-bytes", type=int, default=1 << 30)
    ap.add_argument("--row-bytes", type=int, default=264)
    ap.add_argument("--chunk-bytes", type=int, default=None,
                    help="the table's chunk objects, at most (default: the library's, 256 MiB)")
    ap.add_argument("--baseline", choices=("batch", "each"), default="batch",
                    help="the bare read of the chunks: one batch_get_into() of them all "
                         "(default), or one get_into() per chunk")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ids", type=int, default=4096, help="ids per lookup")
    ap.add_argument("--lookups", type=int, default=20, help="lookups per timed run")
    ap.add_argument("--layer", type=int, default=62)
    ap.add_argument("--local-root", default="/dev/shm" if os.path.isdir("/dev/shm") else None,
                    help="where the pulled namespace is made (default /dev/shm)")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--metadata", help=argparse.SUPPRESS)
    ap.add_argument("--master", help=argparse.SUPPRESS)
    ap.add_argument("--rows", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.quick:
        args.table_bytes, args.reps = 64 << 20, 3
    if args.row_bytes % 4 or args.row_bytes <= 0:
        ap.error("--row-bytes must be a positive multiple of 4 (Mooncake's EngramStore reads "
                 "float32)")
    if args.reps < 1 or args.lookups < 1 or args.ids < 1:
        ap.error("--reps, --lookups and --ids must be positive")
    if args.chunk_bytes is not None and args.chunk_bytes < args.row_bytes:
        ap.error("--chunk-bytes must hold a row at least")
    args.rows = args.rows or args.table_bytes // args.row_bytes
    if args.reader:
        return reader(args)

    import engramstore
    import mcserver
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    why = mcserver.mooncake_missing()
    if why:
        raise SystemExit(f"bench_mooncake_pull: {why}")
    srv = mcserver.MooncakeServers(tempfile.mkdtemp(prefix="bench-mooncake-pull-"))
    srv.start()
    size = args.rows * args.row_bytes
    mc = None
    try:
        from mooncake.store import MooncakeDistributedStore
        mc = MooncakeDistributedStore()
        seg = 2 * size + size // 8 + (256 << 20)
        if mc.setup("127.0.0.1", srv.metadata_url, seg, 64 << 20, "tcp", "", srv.master_addr) != 0:
            raise SystemExit("bench_mooncake_pull: setup failed")
        rows = fill_head(args.rows, args.row_bytes, 0)
        cfg = engramstore.EngramStoreConfig([args.rows], args.row_bytes)
        chunking = {} if args.chunk_bytes is None else {"chunk_bytes": args.chunk_bytes}
        with engramstore.EngramStore(namespace=NAMESPACE, store_client=mc, **chunking) as tables, \
                engramstore.EngramStore({args.layer: cfg}, mc) as layer:
            t0 = time.perf_counter()
            tables.populate(NAME, rows)
            layer.populate(args.layer, [rows])
            del rows
            print(f"published {args.rows} rows of {args.row_bytes} bytes ({size / 2**30:.3f} "
                  f"GiB) twice in {time.perf_counter() - t0:.1f} s", flush=True)
            argv = [sys.executable, os.path.abspath(__file__), "--reader",
                    "--metadata", srv.metadata_url, "--master", srv.master_addr,
                    "--rows", str(args.rows)]
            for k in ("row_bytes", "reps", "ids", "lookups", "layer", "baseline"):
                argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            if args.local_root:
                argv += ["--local-root", args.local_root]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=3000)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            if r.returncode != 0 or not lines:
                sys.stderr.write(r.stderr[-5000:])
                raise SystemExit(f"bench_mooncake_pull: the reader failed ({r.returncode})")
            for ln in r.stderr.splitlines():
                if ln.startswith("rep "):
                    print(ln)
            res = json.loads(lines[-1][len("RESULT "):])
            tables.remove(NAME, force=True)
            layer.remove_from_store(args.layer, force=True)
    finally:
        if mc is not None:
            mc.close()
        srv.stop()
    gib = res["bytes"] / 2**30
    p, b, w = res["pull"], res["bulk"], res["write"]
    bare = "batch_get_into" if args.baseline == "batch" else "get_into x chunk"
    print(f"\n(a) {gib:.3f} GiB in {res['chunks']} chunk objects of {res['chunk_rows']} rows, "
          f"{args.reps} repetitions, order alternating")
    for what, s in (("pull", p), (f"bulk {bare}", b), ("write (local populate)", w)):
        print(f"  {what:22} median {s['median_s']:.3f} s ({gib / s['median_s']:.2f} GiB/s), "
              f"min {s['min_s']:.3f} s, max {s['max_s']:.3f} s")
    ratio = b["median_s"] / p["median_s"]
    print(f"  pull / bulk (rate, medians): {ratio:.2f}x")
    if ratio < 1:
        print(f"  the bare read wins: the pull takes {1 / ratio:.2f}x its time (median)")
    else:
        print(f"  the pull is as fast or faster than the bare read ({ratio:.2f}x its rate)")
    both = (b["median_s"] + w["median_s"]) / p["median_s"]
    print(f"  pull / (bulk + write) (rate, medians): {both:.2f}x: the pull "
          + ("overlaps its read and its write" if both > 1 else
             f"spends {p['median_s'] - b['median_s'] - w['median_s']:.3f} s beyond the two"))
    cs = {k: statistics.median(v) for k, v in res["cpu_s"].items()}
    ncpu = res["cpus"]
    print(f"  CPU time (this reader and the Store's server, medians): pull {cs['pull']:.2f} s, "
          f"bulk {cs['bulk']:.2f} s, write {cs['write']:.2f} s")
    floor = cs["pull"] / ncpu
    print(f"  on {ncpu} CPUs a pull cannot take less than {floor:.3f} s (its CPU time / "
          f"{ncpu}), nor pull / bulk exceed {b['median_s'] / max(floor, 1e-9):.2f}x here; "
          f"the pull's CPU beyond the bulk read's: {cs['pull'] - cs['bulk']:.2f} s")
    lk = res["lookup_ids_per_s"]
    print(f"(b) lookups of [{args.ids}, 1] uniform ids, {args.lookups} per run, median of "
          f"{args.reps} runs")
    print(f"  engram (pulled) {lk['engram']:14.0f} ids/s")
    print(f"  mooncake        {lk['mooncake']:14.0f} ids/s")
    print(f"  engram / mooncake: {lk['engram'] / lk['mooncake']:.0f}x")
    print(f"  wrong rows: {res['wrong_rows']}")
    print(f"load average (1 min) when the timing began and ended: "
          f"{res['loadavg_1min'][0]:.2f}, {res['loadavg_1min'][1]:.2f} ({os.cpu_count()} CPUs)")
    out = {"args": vars(args), "results": res}
    print(json.dumps(out))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    if any(res["wrong_rows"].values()):
        raise SystemExit("bench_mooncake_pull: wrong rows")


if __name__ == "__main__":
    main()
