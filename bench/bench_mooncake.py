#!/usr/bin/env python3
"""Store-backed lookups on a Mooncake Store, from a second process.

    bench/bench_mooncake.py [--heads 24] [--rows 170000] [--row-bytes 264]
                            [--ids 4096] [--batches 4] [--repeats 5]
                            [--cache-frac 0.05] [--read-calls auto,1,4] [--json FILE]

This process starts Mooncake's metadata server and master on free
127.0.0.1 ports (tests/python/mcserver.py; or uses --metadata/--master of
a running deployment), joins the store with a segment large enough for the
tables, and populates one layer of `heads` tables of `rows` rows of
`row_bytes` bytes through engramstore's layer API.  A second process (this
script with --reader) joins the store without a segment, so every row it
reads crosses the transfer engine's TCP path, and times, on the same rows
in the same run, with interleaved repeats:

  bare       get_into_ranges calls alone: the ranges of every id of a lookup,
             one call per lookup, into a buffer registered once;
  mooncake   Mooncake's own EngramStore (mooncake.store.EngramStore, in the
             wheel) on the same objects: its float32 API, embedding_dim =
             row_bytes / 4, comparing a uint8 view of what it returns;
  engram     engramstore's layer API on the Mooncake store, no row cache;
  cached     the same with a row cache of --cache-frac of the rows
             (cache_bytes = that many rows times the cache's slot size),
             warmed first until it has turned over (--warm-turnover times
             its slots in misses) and its hit rate settles; its hit rate
             and the rows it read per id are those of the timed lookups;
  cached keep-all  the same cache without its admission filter
             (cache_keep_all=True: every row read is kept, CLOCK alone),
             same bytes, warmed alike: what the filter is worth.

engram and cached read with the first value of --read-calls (engramstore's
read_calls: Mooncake calls of a lookup in flight at once; "auto", the
default, adapts it to what the reads measure, and the stores without a
cache are warmed by 16 lookups so that it has); each further
value adds the variants "engram rc=N" and "cached rc=N".

Each lookup is row_ids [1, T, heads] with T = ceil(ids / heads), drawn
(new ones for every repeat, the same for every variant) uniform or Zipf(1.0) (rank r with probability proportional to 1/r over a
head's rows, ranks mapped to rows by a fixed random permutation).  Every
result is checked against the rows' known contents; a variant that returns
a wrong row is reported as such.  Rates are ids looked up per second (the
median of the repeats); the last lines are JSON.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

MIX = np.uint32(0x9E3779B1)


def fill_head(n, row_bytes, h):
    """Rows whose bytes are known without the table: word w of row r of
    head h is (r * 64 + h) ^ (w * MIX)."""
    words = row_bytes // 4
    a = np.empty((n, row_bytes), np.uint8)
    w = a.view(np.uint32)
    w[:] = (np.arange(n, dtype=np.uint32)[:, None] * np.uint32(64) + np.uint32(h)) ^ \
        (np.arange(words, dtype=np.uint32)[None, :] * MIX)
    return a


def expected_words(ids, row_bytes):
    """The uint32 words that rows ids [B, L, H] must hold."""
    H = ids.shape[-1]
    base = ids.astype(np.uint32) * np.uint32(64) + np.arange(H, dtype=np.uint32)
    return base[..., None] ^ (np.arange(row_bytes // 4, dtype=np.uint32) * MIX)


class ZipfSampler:
    def __init__(self, n, heads, seed):
        rng = np.random.default_rng(seed)
        self.cdf = np.cumsum(1.0 / np.arange(1, n + 1))
        self.cdf /= self.cdf[-1]
        self.perm = [rng.permutation(n) for _ in range(heads)]

    def draw(self, rng, T):
        cols = []
        for p in self.perm:
            ranks = np.searchsorted(self.cdf, rng.random(T), side="right")
            cols.append(p[np.minimum(ranks, len(p) - 1)])
        return np.stack(cols, -1)[None].astype(np.int64)


def batches(args, dist, count, seed):
    rng = np.random.default_rng(seed)
    T = math.ceil(args.ids / args.heads)
    if dist == "uniform":
        return [rng.integers(0, args.rows, (1, T, args.heads), dtype=np.int64)
                for _ in range(count)]
    z = ZipfSampler(args.rows, args.heads, seed=7)
    return [z.draw(rng, T) for _ in range(count)]


# ---- the reader (second process) ------------------------------------------

def reader(args):
    import engramstore
    from mooncake.store import EngramStore as MooncakeEngramStore
    from mooncake.store import EngramStoreConfig as MooncakeConfig
    from mooncake.store import MooncakeDistributedStore

    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    mc = MooncakeDistributedStore()
    rc = mc.setup("127.0.0.1", args.metadata, 0, 64 << 20, "tcp", "", args.master)
    if rc != 0:
        raise SystemExit(f"reader: setup failed with {rc}")
    H, N, R, L = args.heads, args.rows, args.row_bytes, args.layer
    keys = [f"engram:l{L}:h{h}" for h in range(H)]
    cfg = engramstore.EngramStoreConfig([N] * H, R)
    # A cache of cache_frac of the rows: that many slots of the row size
    # rounded to 16 bytes, with the cache's set headers (64 bytes a set of 7).
    slots = int(args.cache_frac * N * H)
    cache_bytes = slots * (((R + 15) // 16) * 16 + 64 // 7 + 1)
    # "auto": read_calls=None, the number of calls adapted to what the
    # reads measure (the default).
    rcs = [None if x == "auto" else int(x) for x in args.read_calls.split(",")]
    plains = {rc: engramstore.EngramStore({L: cfg}, mc, read_calls=rc) for rc in rcs}
    cacheds = {rc: engramstore.EngramStore({L: cfg}, mc, cache_bytes=cache_bytes, read_calls=rc)
               for rc in rcs}
    # The same cache without its admission filter (every row read is kept,
    # CLOCK alone), same bytes, first read_calls: what the filter is worth.
    keepall = engramstore.EngramStore({L: cfg}, mc, cache_bytes=cache_bytes, read_calls=rcs[0],
                                      cache_keep_all=True)
    mcfg = MooncakeConfig()
    mcfg.table_vocab_sizes = [N] * H
    mcfg.embedding_dim = R // 4
    theirs = MooncakeEngramStore(L, mcfg, mc)

    T = math.ceil(args.ids / H)
    bare_out = np.zeros((1, T, H, R), np.uint8)
    assert mc.register_buffer(bare_out.ctypes.data, bare_out.nbytes) == 0

    def run_bare(ids):
        n = ids.shape[1]
        dst = [((np.arange(n) * H + h) * R).tolist() for h in range(H)]
        src = [(ids[0, :, h] * R).tolist() for h in range(H)]
        sz = [[R] * n for _ in range(H)]
        res = mc.get_into_ranges([bare_out.ctypes.data], [keys], [dst], [src], [sz])
        if any(x != R for lst in res[0] for x in lst):
            raise RuntimeError("bare: a range did not return row_bytes")
        return bare_out

    out = np.zeros((1, T, H, R), np.uint8)

    def run_engram(store):
        def f(ids):
            store.lookup_into(L, ids, out)
            return out
        return f

    def run_theirs(ids):
        return theirs.lookup(ids).view(np.uint8)

    # "engram" and "cached" read with the first --read-calls value; the
    # others are variants of their own ("engram rc=N", "cached rc=N").
    def vname(kind, rc):
        return kind if rc == rcs[0] else f"{kind} rc={rc or 'auto'}"
    variants = {"bare": run_bare, "mooncake": run_theirs}
    stores = {}
    for rc in rcs:
        variants[vname("engram", rc)] = run_engram(plains[rc])
        stores[vname("cached", rc)] = cacheds[rc]
        variants[vname("cached", rc)] = run_engram(cacheds[rc])
    stores["cached keep-all"] = keepall
    variants["cached keep-all"] = run_engram(keepall)
    results = {}
    for dist in args.dists.split(","):
        # New batches every repeat (the same for every variant): rows cached
        # in one repeat are not asked for again by design, only by chance.
        pools = [batches(args, dist, args.batches, seed=100 + rep) for rep in range(args.repeats)]
        wrong = {v: 0 for v in variants}
        errors = {v: None for v in variants}
        # Warm the cache on other batches of the same distribution, as in a
        # server that has been running a while: until its misses reach
        # --warm-turnover times its slots (the admission filter learns which
        # rows come back over several turnovers, so a cache's early hit rate
        # is below its lasting one) and then its hit rate settles (two
        # rounds of 20 lookups within 0.5%); at most --warmup lookups.
        warm_info = {}
        for cname, cached in stores.items():
            warm, last, rate, t_warm = 0, None, 0.0, time.perf_counter()
            wrng = np.random.default_rng(12)
            c_start = cached.stats()["cache"]
            while warm < args.warmup:
                before = cached.stats()["cache"]
                for ids in batches(args, dist, 20, seed=int(wrng.integers(1 << 30))):
                    cached.lookup_into(L, ids, out)
                warm += 20
                after = cached.stats()["cache"]
                rate = (after["hits"] - before["hits"]) / max(1, (after["hits"] + after["misses"]) -
                                                              (before["hits"] + before["misses"]))
                turned = (after["misses"] - c_start["misses"]) >= args.warm_turnover * after["slots"]
                if turned and last is not None and abs(rate - last) < 0.005:
                    break
                last = rate
            warm_info[cname] = warm
            print(f"{dist}: {cname}: cache warmed by {warm} lookups in "
                  f"{time.perf_counter() - t_warm:.0f} s, hit rate {rate:.3f}",
                  file=sys.stderr, flush=True)
        # The stores without a cache: 16 lookups, so that an adapted
        # read_calls has tried its choices before the timing.
        for plain in plains.values():
            for ids in batches(args, dist, 16, seed=13):
                plain.lookup_into(L, ids, out)
        timed = {c: {"hits": 0, "looked": 0, "reads": 0} for c in stores}
        times = {v: [] for v in variants}
        for rep in range(args.repeats):
            pool = pools[rep]
            order = list(variants)
            order = order[rep % len(order):] + order[:rep % len(order)]
            for v in order:
                if errors[v]:
                    continue
                try:
                    c0 = stores[v].stats()["cache"] if v in stores else None
                    t0 = time.perf_counter()
                    for ids in pool[:-1]:
                        variants[v](ids)
                    res = variants[v](pool[-1])
                    times[v].append(time.perf_counter() - t0)
                    if c0 is not None:  # the cache's work in the timed lookups only
                        c1, tv = stores[v].stats()["cache"], timed[v]
                        tv["hits"] += c1["hits"] - c0["hits"]
                        tv["looked"] += (c1["hits"] + c1["misses"]) - (c0["hits"] + c0["misses"])
                        tv["reads"] += c1["reads"] - c0["reads"]
                    # The last batch's rows are checked (outside the timing);
                    # the others in the first repeat.
                    checks = [(pool[-1], res)] if rep else \
                        [(ids, variants[v](ids).copy()) for ids in pool]
                except Exception as e:  # noqa: BLE001 - reported, not hidden
                    errors[v] = f"{type(e).__name__}: {e}"
                    continue
                for ids, res in checks:
                    w = np.ascontiguousarray(res).view(np.uint32).reshape(ids.shape + (R // 4,))
                    wrong[v] += int((w != expected_words(ids, R)).any(-1).sum())
        ids_per_run = sum(ids.size for ids in pools[0])
        res = {}
        for v in variants:
            ts = sorted(times[v])
            res[v] = {"rows_per_s": ids_per_run / ts[len(ts) // 2] if ts else None,
                      "wrong_rows": wrong[v], "error": errors[v]}
        for v, cached in stores.items():
            looked, c = timed[v]["looked"], cached.stats()["cache"]
            res[v]["hit_rate"] = timed[v]["hits"] / looked if looked else None
            # Rows read from Mooncake per id looked up (misses less repeats).
            res[v]["reads_per_id"] = timed[v]["reads"] / looked if looked else None
            res[v]["warmup_lookups"] = warm_info[v]
            res[v]["cache_bytes"] = c["cache_bytes"]
            res[v]["slots"] = c["slots"]
        # What an adapted read_calls settled on (calls at once, and its
        # moving average of a read's time per row for each choice).
        for kind, by_rc in (("engram", plains), ("cached", cacheds)):
            if None in by_rc:
                m = by_rc[None].stats()["mooncake"]
                res[vname(kind, None)]["read_calls"] = m["read_calls"]
                res[vname(kind, None)]["read_us_per_row"] = {
                    str(k): (round(x * 1e6, 2) if x is not None else None)
                    for k, x in m["read_time_per_row"].items()}
        results[dist] = res
    mc.unregister_buffer(bare_out.ctypes.data)
    for st in list(plains.values()) + list(cacheds.values()) + [keepall]:
        st.close()
    variants.clear()  # drops Mooncake's EngramStore before its client closes
    theirs = None
    mc.close()
    print("RESULT " + json.dumps(results), flush=True)


# ---- the driver -------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--rows", type=int, default=170000, help="rows per head")
    ap.add_argument("--row-bytes", type=int, default=264)
    ap.add_argument("--ids", type=int, default=4096, help="ids per lookup (about)")
    ap.add_argument("--batches", type=int, default=4, help="lookups per timed run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warm-turnover", type=float, default=6.0,
                    help="misses, in slots, that warm the cache before its hit rate may settle")
    ap.add_argument("--warmup", type=int, default=3000,
                    help="at most this many lookups warm the cache (until its hit rate settles)")
    ap.add_argument("--cache-frac", type=float, default=0.05)
    ap.add_argument("--dists", default="uniform,zipf")
    ap.add_argument("--read-calls", default="auto,1,4",
                    help="engramstore's read_calls (Mooncake calls of a lookup in flight at "
                         "once; auto: adapted, the default): the first for engram and cached, "
                         "each other one a variant of its own")
    ap.add_argument("--layer", type=int, default=61)
    ap.add_argument("--metadata", help="a running deployment's metadata URL")
    ap.add_argument("--master", help="a running deployment's master host:port")
    ap.add_argument("--json", help="also write the results to this file")
    ap.add_argument("--reader", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row_bytes % 4:
        ap.error("--row-bytes must be a multiple of 4 (Mooncake's EngramStore reads float32)")
    if args.reader:
        return reader(args)

    import engramstore
    import mcserver
    os.environ.setdefault("MC_TCP_BIND_ADDRESS", "127.0.0.1")
    srv = None
    if not args.metadata:
        why = mcserver.mooncake_missing()
        if why:
            raise SystemExit(f"bench_mooncake: {why}")
        srv = mcserver.MooncakeServers(tempfile.mkdtemp(prefix="bench-mooncake-"))
        srv.start()
        args.metadata, args.master = srv.metadata_url, srv.master_addr
    table_bytes = args.heads * args.rows * args.row_bytes
    mc = None
    try:
        from mooncake.store import MooncakeDistributedStore
        mc = MooncakeDistributedStore()
        seg = table_bytes + table_bytes // 8 + (256 << 20)
        if mc.setup("127.0.0.1", args.metadata, seg, 64 << 20, "tcp", "", args.master) != 0:
            raise SystemExit("bench_mooncake: setup failed")
        cfg = engramstore.EngramStoreConfig([args.rows] * args.heads, args.row_bytes)
        with engramstore.EngramStore({args.layer: cfg}, mc) as t:
            t0 = time.perf_counter()
            bufs = [fill_head(args.rows, args.row_bytes, h) for h in range(args.heads)]
            t.populate(args.layer, bufs)
            del bufs
            print(f"populated {args.heads} x {args.rows} rows of {args.row_bytes} bytes "
                  f"({table_bytes / 2**30:.2f} GiB) in {time.perf_counter() - t0:.1f} s",
                  flush=True)
            argv = [sys.executable, os.path.abspath(__file__), "--reader",
                    "--metadata", args.metadata, "--master", args.master]
            for k in ("heads", "rows", "row_bytes", "ids", "batches", "repeats", "warmup", "warm_turnover",
                      "cache_frac", "dists", "layer", "read_calls"):
                argv += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=3000)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
            if r.returncode != 0 or not lines:
                sys.stderr.write(r.stderr[-5000:])
                raise SystemExit(f"bench_mooncake: the reader failed ({r.returncode})")
            results = json.loads(lines[-1][len("RESULT "):])
            t.remove_from_store(args.layer, force=True)
    finally:
        if mc is not None:
            mc.close()
        if srv is not None:
            srv.stop()
    T = math.ceil(args.ids / args.heads)
    print(f"\nlookups of row_ids [1, {T}, {args.heads}] ({T * args.heads} ids), "
          f"{args.batches} per run, median of {args.repeats}; rates in ids/s")
    for dist, res in results.items():
        rate = {v: r["rows_per_s"] for v, r in res.items()}
        ratio = lambda a, b: f"{a / b:.2f}x" if a and b else "-"  # noqa: E731
        print(f"{dist}:")
        for v, r in res.items():
            extra = ""
            if v.startswith("engram"):
                extra = f"  engram/bare {ratio(rate[v], rate['bare'])}"
            elif v.startswith("cached"):
                extra = (f"  cached/mooncake {ratio(rate[v], rate['mooncake'])}, hit rate "
                         f"{r['hit_rate'] or 0:.3f}, reads/id {r['reads_per_id'] or 0:.3f}, "
                         f"{r['slots']} slots")
                if v == "cached" and rate.get("cached keep-all"):
                    extra += f", cached/keep-all {ratio(rate[v], rate['cached keep-all'])}"
            if r.get("read_calls"):
                extra += f", read_calls settled on {r['read_calls']} ({r['read_us_per_row']} us/row)"
            got = f"{rate[v]:10.0f}" if rate[v] else f"{'failed':>10}"
            print(f"  {v:16} {got} ids/s{extra}")
            if r["wrong_rows"] or r["error"]:
                print(f"    {v}: {r['wrong_rows']} wrong rows, error: {r['error']}")
    print(json.dumps({"args": vars(args), "results": results}))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
