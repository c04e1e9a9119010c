#!/usr/bin/env python3
"""Turns benchmark output into the markdown tables of docs/performance.md.

    bench/run.sh > run.txt; bench/report.py run.txt
        one row per (size, variant, R, threads, K) of bench_gather with the
        library, naive, ceiling and numpy rates and their ratios;

    bench/report.py --all DIR [--seconds S]
        the lead table of docs/performance.md from the directory that
        bench/all.sh fills ($BENCH_OUT): per tier, engram's figure, the
        baseline's of the same run, their ratio (engram's speed over the
        baseline's: above 1 engram is faster; where it is below 1 the row
        says in words that the baseline wins, and why), the 1-minute load
        average sampled while that benchmark ran, and its command; the
        commit and date on top.  It reads the JSON that the benchmarks
        write and, for the C benchmarks that print text only, their
        output's result lines (the patterns below); it writes the rows to
        DIR/summary.jsonl.  Exit 1 when a benchmark that ran gave no result
        this script can read, or failed.

Standard library only.
"""
import json
import os
import re
import statistics
import subprocess
import sys


def main(path):
    points = {}  # (size, variant, R, thr, K) -> dict
    size = variant = rb = None
    for line in open(path, encoding="utf-8"):
        # " -- 8G private-huge R=264: ..." and " -- 8G shm R=264 threads=2: ..."
        # name the memory of the rows that follow; " -- 8G R=264: ..." (the
        # shm file being written) names none.
        m = re.match(r"^ -- (\S+) (?:(\S+) )?R=(\d+)[: ]", line)
        if m:
            size, variant, rb = m.group(1), m.group(2), int(m.group(3))
            continue
        m = re.match(r"^\s+([12])\s+(\d+)\s+([\d.]+)\s+([\d.]+|-)\s+([\d.]+|-)\s", line)
        if m and size and variant and rb:
            thr, k = int(m.group(1)), int(m.group(2))
            p = points.setdefault((size, variant, rb, thr, k), {})
            p["lib"] = float(m.group(3))
            p["naive"] = None if m.group(4) == "-" else float(m.group(4))
            p["ceil"] = None if m.group(5) == "-" else float(m.group(5))
            continue
        m = re.match(r"^\s+(\S+)\s+(private-huge|private-4k|shm|shm-phuge)\s+(\d+)\s+(\d+)\s+([12])"
                     r"\s+([\d.]+)\s+([\d.]+)\s+[\d.]+x\s+([\d.]+)", line)
        if m:
            key = (m.group(1), m.group(2), int(m.group(3)), int(m.group(5)), int(m.group(4)))
            points.setdefault(key, {})["np1"] = float(m.group(7))
    fmt = lambda v: "-" if v is None else f"{v:.2f}"
    ratio = lambda a, b: "-" if a is None or not b else f"{a / b:.2f}x"
    for sz in ("256M", "8G"):
        rows = sorted(k for k in points if k[0] == sz)
        if not rows:
            continue
        print(f"#### {sz} table\n")
        print("| variant | R | thr | K | lib | naive | ceiling | numpy take (1 thr) "
              "| lib/naive | lib/ceiling | lib/numpy |")
        print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        order = {"private-huge": 0, "private-4k": 1, "shm": 2, "shm-phuge": 3}
        for key in sorted(rows, key=lambda k: (order[k[1]], k[2], k[3], k[4])):
            p = points[key]
            if "lib" not in p:
                continue
            print(f"| {key[1]} | {key[2]} | {key[3]} | {key[4]} | {fmt(p['lib'])} "
                  f"| {fmt(p.get('naive'))} | {fmt(p.get('ceil'))} | {fmt(p.get('np1'))} "
                  f"| {ratio(p['lib'], p.get('naive'))} | {ratio(p['lib'], p.get('ceil'))} "
                  f"| {ratio(p['lib'], p.get('np1'))} |")
        print()



# ---- bench/report.py --all DIR: the lead table of bench/all.sh --------------

class Missing(Exception):
    """A result line or key that a benchmark's output should hold and does not."""


def _load_jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]


def _load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def _text(d, name):
    with open(os.path.join(d, name + ".txt"), encoding="utf-8", errors="replace") as f:
        return f.read()


def _find(text, pattern, what):
    m = re.search(pattern, text, re.M)
    if not m:
        raise Missing(f"no line for {what} (pattern {pattern!r})")
    return m


def _fig(median, lo=None, hi=None, unit="", nd=2):
    """'12.3 [10.1-14.0] unit': a median with its min and max where given."""
    f = lambda v: f"{v:,.{nd}f}"  # noqa: E731
    s = f(median)
    if lo is not None and hi is not None:
        s += f" [{f(lo)}-{f(hi)}]"
    return f"{s} {unit}".strip()


class Table:
    def __init__(self):
        self.rows = []

    def add(self, bench, tier, what, engram, baseline, against, ratio, why=""):
        """ratio: engram's speed over the baseline's (> 1: engram faster).
        why: said in words where the ratio is below 1."""
        self.rows.append(dict(bench=bench, tier=tier, what=what, engram=engram,
                              baseline=baseline, against=against, ratio=ratio, why=why))


def _gather(d, t):
    g = _load_jsonl(os.path.join(d, "gather", "gather.jsonl"))
    npath = os.path.join(d, "gather", "numpy.jsonl")
    n = _load_jsonl(npath) if os.path.exists(npath) else []
    def pick(rows, **kw):
        for r in rows:
            if all(r.get(k) == v for k, v in kw.items()):
                return r
        raise Missing(f"no point {kw}")
    big = max(r["size"] for r in g)
    sl = next(r["size_label"] for r in g if r["size"] == big)
    sl = re.sub(r"^(\d+)([MG])$", r"\1 \2iB", sl)
    for thr in (1, 2):
        r = pick(g, size=big, variant="private-huge", R=264, K=4096, threads=thr)
        what = f"memory, {sl} huge pages, R = 264, K = 4096, {thr} thread{'s' * (thr > 1)}"
        lib = r["lib_rows_s"] / 1e6
        t.add("gather", "memory", what, _fig(lib, unit="M rows/s"),
              _fig(r["ceil_rows_s"] / 1e6, unit="M rows/s"), "the ceiling probe (reads, no copy)",
              r["lib_rows_s"] / r["ceil_rows_s"],
              "the probe copies nothing: it is the machine's random-row read rate, the bound of any gather")
        if thr == 1:
            t.add("gather", "memory", what, _fig(lib, unit="M rows/s"),
                  _fig(r["naive_rows_s"] / 1e6, unit="M rows/s"), "a naive memcpy loop",
                  r["lib_rows_s"] / r["naive_rows_s"])
        if n:
            for nthr in sorted({1, thr}):
                p = pick(n, size=big, R=264, K=4096, threads=nthr)
                t.add("gather", "memory", what, _fig(lib, unit="M rows/s"),
                      _fig(p["rows_s"] / 1e6, unit="M rows/s"),
                      f"numpy's take, {nthr} thread{'s' * (nthr > 1)}", r["lib_rows_s"] / p["rows_s"])
    r = pick(g, size=big, variant="private-huge", R=264, K=1, threads=1)
    if n:
        p = pick(n, size=big, R=264, K=1, threads=1)
        t.add("gather", "memory", f"memory, {sl}, one row a call (K = 1)",
              _fig(r["lib_ns_call"], unit="ns/call", nd=0), _fig(p["ns_call"], unit="ns/call", nd=0),
              "numpy's take", p["ns_call"] / r["lib_ns_call"])


def _filecache(d, t):
    x = _text(d, "filecache")
    size = _find(x, r"^table .*: \d+ rows of \d+ bytes \((\d+) MiB\), cache (\d+) MiB.*qd (\d+)",
                 "the table")
    what = f"file cache, {size.group(1)} MiB file, {size.group(2)} MiB cache, qd {size.group(3)}, cold"
    def rate(name):
        m = _find(x, r"^  " + re.escape(name) + r"\s+(\d+) \[(\d+), (\d+)\]", f"cold '{name}'")
        return [float(v) for v in m.groups()]
    c = rate("cache")
    eng = _fig(*c, unit="rows/s", nd=0)
    disk = "the disk is the limit: any reader that keeps as many reads in flight reaches it"
    for name, against, why in (
            ("uring", "a bare io_uring O_DIRECT reader, same qd", disk),
            ("pread", "pread, 1 thread", ""),
            ("pread x16", "pread on 16 threads", disk),
            (f"pread x{size.group(3)}", f"pread on {size.group(3)} threads (the cache's qd)", disk)):
        b = rate(name)
        t.add("filecache", "file", what, eng, _fig(*b, unit="rows/s", nd=0), against, c[0] / b[0], why)
    m = _find(x, r"^warm all-hit lookups.*: cache ([\d.]+) \[([\d.]+), ([\d.]+)\]\s+mapped ([\d.]+) "
                 r"\[([\d.]+), ([\d.]+)\]", "the warm lookups")
    v = [float(g) for g in m.groups()]
    t.add("filecache", "file", "file cache, all hits (K = 4096)", _fig(*v[:3], unit="ns/row", nd=1),
          _fig(*v[3:], unit="ns/row", nd=1), "the same table mapped (page cache)", v[3] / v[0],
          "a hit costs a probe of the cache's index on top of the row copy")


def _source(d, t):
    x = _text(d, "source")
    what = "your own store (Zipf ids), 20 us a call + 100 ns a row"
    direct = float(_find(x, r"^  direct\s+([\d.]+)", "direct").group(1))
    for name, against in (("source", "no row cache"), ("source\\+cache", "64 MiB row cache")):
        v = float(_find(x, r"^  " + name + r"\s+([\d.]+)", name).group(1))
        t.add("source", "source", f"{what}, {against}", _fig(v, unit="us/lookup", nd=0),
              _fig(direct, unit="us/lookup", nd=0), "the caller's own batched read", direct / v,
              "deduplication and the cache cost more than they save here")


def _decode(d, t):
    x = _text(d, "decode")
    head = _find(x, r"^  (\S+ \S+) thp, threads=1, idle", "the decode configuration").group(1)
    for m in re.finditer(r"^\s+(\d+)\s+(\d+) ns\s+(\d+) ns\s+(\d+) ns\s+(\d+) ns\s+([\d.]+)x", x, re.M):
        T, e, n = int(m.group(1)), float(m.group(2)), float(m.group(4))
        t.add("decode", "memory", f"decode shape: 24 tables, {head}, T = {T}",
              _fig(e, unit="ns/call", nd=0), _fig(n, unit="ns/call", nd=0),
              "the naive per-id loop (check, memcpy)", n / e)
    if not any(r["bench"] == "decode" for r in t.rows):
        raise Missing("no result line")


def _callcost(d, t):
    x = _text(d, "callcost")
    runs = {}
    for m in re.finditer(r"^-- (\w+) (\d+) calls\n(?:.*\n)*?==\d+== I\s+refs:\s+([\d,]+)", x, re.M):
        runs[(m.group(1), int(m.group(2)))] = int(m.group(3).replace(",", ""))
    per = {}
    for side in ("engram", "naive"):
        calls = [c for (s, c) in runs if s == side and c]
        if (side, 0) not in runs or not calls:
            raise Missing(f"the callgrind counts of {side}")
        per[side] = (runs[(side, calls[0])] - runs[(side, 0)]) / calls[0]
    t.add("callcost", "memory", "one decode-step lookup, T = 1, 24 tables in the caches",
          _fig(per["engram"], unit="instructions", nd=0), _fig(per["naive"], unit="instructions", nd=0),
          "the naive per-id loop", per["naive"] / per["engram"],
          "the call validates every id and resolves its tables first; the timed decode-shape rows are what it costs")


def _python(d, t):
    r = _load_json(os.path.join(d, "python.json"))
    for K in (1, 64):
        k = r[f"K{K}"]
        t.add("python", "Python", f"Python: Store.lookup, 1 token x {K} column{'s' * (K > 1)}",
              _fig(k["engramstore_ns"] / 1e3, unit="us/call"), _fig(k["np_take_ns"] / 1e3, unit="us/call"),
              "numpy's take", k["np_take_ns"] / k["engramstore_ns"])
    k = r["T4096"]
    t.add("python", "Python", "Python: Store.lookup, 4096 random rows",
          _fig(k["engramstore_rows_per_s"] / 1e6, unit="M rows/s"), _fig(k["c_rows_per_s"] / 1e6, unit="M rows/s"),
          "the same lookup from C (engram bench)", k["ratio_python_vs_c"],
          "the Python call's own cost (goal: within 10%)")
    p = _load_json(os.path.join(d, "pycall.json"))
    for T, v in p["T"].items():
        if "c" not in v:
            raise Missing("the C side of bench_pycall (this engramstore has no _bench_lookup)")
        c = v["c"]["median"] - v["c_floor"]["median"]
        py = v["lookup"]["median"] - v["py_floor"]["median"]
        t.add("pycall", "Python", f"Python: a decode step's Store.lookup, 24 tables, T = {T}",
              _fig(py, unit="ns/call", nd=0), _fig(c, unit="ns/call", nd=0),
              "engram_lookup() called from C", c / py,
              f"a call from Python costs {py - c:.0f} ns more than from C (goal: at most 300 ns more)")


def _ngram(d, t):
    x = _text(d, "ngram")
    m = _find(x, r"^layer table (\d+) rows of (\d+) bytes", "the table")
    size = f"{int(m.group(1)) * int(m.group(2)) / 2**20:,.0f} MiB"
    for title, key in (("the same tokens each call", "same tokens (rows in the caches)"),
                       ("fresh tokens each call", "fresh tokens (a decode step)")):
        block = _find(x, "^" + re.escape(title) + r".*\n.*\n((?:\s+\d+ .*\n?)+)", title).group(1)
        for m in re.finditer(r"^\s+(\d+)\s+(\d+)ns\s+(\d+)ns", block, re.M):
            T, lk, fu = int(m.group(1)), float(m.group(2)), float(m.group(3))
            t.add("ngram", "tokens to rows", f"tokens to rows fused, {key}, T = {T}, {size} table",
                  _fig(fu, unit="ns/call", nd=0), _fig(lk, unit="ns/call", nd=0),
                  "the lookup alone of ids hashed before", lk / fu,
                  "the fused call also hashes the tokens (goal: at least 0.91x, i.e. at most 1.1x the time)")
    for name in ("ngram_py_16k", "ngram_py_1m"):
        r = _load_json(os.path.join(d, name + ".json"))
        e, n = r["engram_tokens_per_s"], r["numpy_tokens_per_s"]
        t.add(name, "tokens to rows", f"the n-gram hash, {r['tokens']:,} tokens, 1 thread",
              _fig(e["median"] / 1e6, e["min"] / 1e6, e["max"] / 1e6, "M tokens/s", 1),
              _fig(n["median"] / 1e6, n["min"] / 1e6, n["max"] / 1e6, "M tokens/s", 2),
              "numpy, vectorized, 1 thread", r["ratio_median"])


def _prefetch(d, t):
    x = _text(d, "prefetch")
    n = 0
    for m in re.finditer(r"^(\w+)\s+inline\s+([\d.]+) us/step\s+prefetch\s+([\d.]+) us/step\s+work\s+([\d.]+) us"
                         r".*hidden\s+([\d.]+)%", x, re.M):
        tier, inl, pre, work, hidden = m.group(1), float(m.group(2)), float(m.group(3)), \
            float(m.group(4)), m.group(5)
        t.add("prefetch", "file" if tier == "file" else "Redis Cluster",
              f"decode loop, lookups submitted ahead ({tier} tier), {work / 1e3:.1f} ms of work a step, "
              f"{hidden}% of the lookups hidden",
              _fig(pre / 1e3, unit="ms/step"), _fig(inl / 1e3, unit="ms/step"),
              "the same loop, lookups inline", inl / pre,
              "nothing hidden: submitting costs more than it overlaps here")
        n += 1
    if not n:
        raise Missing("no result line")


def _redis(d, t):
    x = _text(d, "redis")
    head = _find(x, r"table\(s\) of \d+ rows of \d+ bytes \((\d+) MiB\)", "the table").group(1)
    n = 0
    for m in re.finditer(r"^(uniform|zipf)\s+threads (\d+):.*\n((?:  \S.*\n?)+)", x, re.M):
        dist, thr, block = m.group(1), int(m.group(2)), m.group(3)
        v = {}
        for ln in re.finditer(r"^  (\S+)\s+([\d.]+) \[([\d.]+), ([\d.]+)\]", block, re.M):
            v[ln.group(1)] = [float(g) for g in ln.groups()[1:]]
        if "engram" not in v or "bare" not in v:
            raise Missing(f"engram or bare in {dist} threads {thr}")
        ids = "uniform" if dist == "uniform" else "Zipf(1.0)"
        what = f"Redis Cluster, {head} MiB, 3 masters, {ids} ids, {thr} thread{'s' * (thr > 1)}"
        for name, label in (("engram", "no row cache"), ("engram+cache", "row cache of 5%")):
            if name not in v:
                continue
            t.add("redis", "Redis Cluster", f"{what}, {label}", _fig(*v[name], unit="M rows/s", nd=3),
                  _fig(*v["bare"], unit="M rows/s", nd=3),
                  "a competent bare client (one poll() loop, no allocation a row)", v[name][0] / v["bare"][0],
                  "the client shares the cores with the servers, and engram spends more CPU a row "
                  "(validation, deduplication, hiredis's reader)" if name == "engram" else
                  "with few repeats a cache costs more than it saves")
        n += 1
    if not n:
        raise Missing("no result block")


def _pull(d, t):
    x = _text(d, "pull")
    size = _find(x, r"\((\d+) MiB\) in \d+ chunks", "the table").group(1)
    def ms(name):
        m = _find(x, r"^" + name + r"\s+median\s+([\d.]+) ms \(\s*([\d.]+) to\s+([\d.]+)\)", name)
        return [float(g) for g in m.groups()]
    b, p = ms("bare"), ms("pull")
    t.add("pull", "Redis Cluster", f"pull of {size} MiB from the cluster to /dev/shm",
          _fig(*p, unit="ms", nd=0), _fig(*b, unit="ms", nd=0),
          "a bare client reading the same bytes (nothing checked or written)", b[0] / p[0],
          "the pull also checks every chunk and writes, syncs and checksums the table (goal: at least 0.8x)")


def _mooncake(d, t):
    r = _load_json(os.path.join(d, "mooncake.json"))
    a, res = r["args"], r["results"]
    size = f"{a['heads']} heads x {a['rows']:,} rows"
    for dist, label in (("uniform", "uniform"), ("zipf", "Zipf(1.0)")):
        if dist not in res:
            raise Missing(f"the {dist} results")
        v = {k: x["rows_per_s"] for k, x in res[dist].items()}
        bad = [k for k, x in res[dist].items() if x.get("wrong_rows") or x.get("error")]
        if bad:
            raise Missing(f"variants that failed or returned wrong rows: {bad}")
        t.add("mooncake", "Mooncake Store", f"Mooncake Store ({size}), {label} ids, no row cache",
              _fig(v["engram"], unit="ids/s", nd=0), _fig(v["bare"], unit="ids/s", nd=0),
              "bare get_into_ranges, one call a lookup", v["engram"] / v["bare"],
              "every id is a distinct row: engram has nothing to save over one call of all the ranges")
        c = res[dist]["cached"]
        t.add("mooncake", "Mooncake Store",
              f"Mooncake Store ({size}), {label} ids, row cache of {a['cache_frac']:.0%} "
              f"({(c.get('hit_rate') or 0):.0%} hits)",
              _fig(v["cached"], unit="ids/s", nd=0), _fig(v["mooncake"], unit="ids/s", nd=0),
              "Mooncake's own EngramStore", v["cached"] / v["mooncake"])


PARSERS = [("gather", _gather), ("filecache", _filecache), ("source", _source), ("decode", _decode),
           ("callcost", _callcost), ("python", _python), ("pycall", None), ("ngram", _ngram),
           ("ngram_py_16k", None), ("ngram_py_1m", None), ("prefetch", _prefetch),
           ("redis", _redis), ("pull", _pull), ("mooncake", _mooncake)]
BENCH_TIER = {"gather": "memory", "decode": "memory", "callcost": "memory", "filecache": "file",
              "source": "source", "prefetch": "file", "redis": "Redis Cluster",
              "pull": "Redis Cluster", "mooncake": "Mooncake Store", "ngram": "tokens to rows",
              "ngram_py_16k": "tokens to rows", "ngram_py_1m": "tokens to rows", "python": "Python",
              "pycall": "Python"}
TIERS = ["memory", "file", "source", "Redis Cluster", "Mooncake Store", "tokens to rows", "Python"]


def _git(*args):
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        return subprocess.run(["git", "-C", here, *args], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def report_all(d, seconds=None):
    runs = {}
    for r in _load_jsonl(os.path.join(d, "runs.jsonl")):
        runs.setdefault(r["bench"], {})[r["phase"]] = r
    samples = []
    lp = os.path.join(d, "load.txt")
    if os.path.exists(lp):
        for ln in open(lp, encoding="utf-8"):
            f = ln.split()
            if len(f) >= 2:
                samples.append((float(f[0]), float(f[1])))

    def load(bench):
        r = runs.get(bench, {})
        s, e = r.get("start"), r.get("end")
        if not s or not e or "t" not in e:
            return "-"
        v = [float(s["loadavg"].split()[0]), float(e["loadavg"].split()[0])]
        v += [l for (ts, l) in samples if s["t"] <= ts <= e["t"]]
        lo, hi = f"{min(v):.1f}", f"{max(v):.1f}"
        return lo if lo == hi else f"{lo}-{hi}"

    t = Table()
    problems = []
    for name, fn in PARSERS:
        r = runs.get(name)
        if not r:
            continue
        tier = BENCH_TIER.get(name, "memory")
        if "skipped" in r:
            t.add(name, tier, f"`{name}`", "-", "-", "-", None, "skipped: " + r["skipped"]["reason"])
            continue
        end = r.get("end")
        if end is None:
            problems.append(f"{name}: did not finish (no end recorded)")
            t.add(name, tier, f"`{name}`", "-", "-", "-", None, "**did not finish**")
            continue
        if end.get("rc", 1) != 0:
            why = f"exit {end.get('rc', '?')}{': ' + end['error'] if 'error' in end else ''}"
            problems.append(f"{name}: failed ({why}; its output: {name}.txt)")
            t.add(name, tier, f"`{name}`", "-", "-", "-", None, f"**FAILED** ({why})")
            continue
        if fn is None:
            continue
        n0 = len(t.rows)
        try:
            fn(d, t)
        except (Missing, OSError, KeyError, ValueError) as e:
            del t.rows[n0:]
            problems.append(f"{name}: its output has no result this report can read: {e}")
            t.add(name, tier, f"`{name}`", "-", "-", "-", None, "**no result read** (see below the table)")

    cpath = os.path.join(d, "commit")  # written by bench/all.sh when it starts
    if os.path.exists(cpath):
        commit = open(cpath, encoding="utf-8").read().strip()
    else:
        commit = _git("rev-parse", "--short", "HEAD") or "unknown"
        if _git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
    date = next((r["start"]["t"] for r in runs.values() if "start" in r), None)
    import time
    day = time.strftime("%Y-%m-%d", time.gmtime(date)) if date else "unknown"
    cpus = os.cpu_count()
    print(f"bench/all.sh at commit {commit}, {day}, {cpus} CPUs"
          + (f", {seconds / 60:.1f} minutes of benchmarks" if seconds else "")
          + "; ratio = engram's speed / the baseline's (above 1: engram faster)")
    print()
    print("| tier | what | engram | baseline | against | ratio | load (1 min) | command |")
    print("|---|---|---|---|---|---|---|---|")
    out = []
    order = {tier: i for i, tier in enumerate(TIERS)}
    for r in sorted(t.rows, key=lambda r: order.get(r["tier"], 99)):
        cmd = runs.get(r["bench"], {}).get("end", {}).get("command", "")
        cmd = re.sub(r"--json \S+|--nodes \S+|env BENCH_GATHER=\S+ BENCH_OUT=\S+ ", "", cmd)
        cmd = re.sub(r"^\S*/python3? ", "python ", cmd)
        cmd = " ".join(cmd.split())
        if r["ratio"] is None:
            ratio = r["why"]
        elif r["ratio"] < 1:
            ratio = f"**{r['ratio']:.2f}x, the baseline wins**: {r['why'] or 'see the section below'}"
        else:
            ratio = f"{r['ratio']:.2f}x"
        print(f"| {r['tier']} | {r['what']} | {r['engram']} | {r['baseline']} | {r['against']} "
              f"| {ratio} | {load(r['bench'])} | `{cmd}` |" if cmd else
              f"| {r['tier']} | {r['what']} | {r['engram']} | {r['baseline']} | {r['against']} "
              f"| {ratio} | {load(r['bench'])} | |")
        out.append(dict(r, load=load(r["bench"]), command=cmd, commit=commit, date=day))
    with open(os.path.join(d, "summary.jsonl"), "w", encoding="utf-8") as f:
        for r in out:
            f.write(json.dumps(r) + "\n")
    for p in problems:
        print(f"\nreport.py: {p}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "--all":
        sec = None
        if len(sys.argv) == 5 and sys.argv[3] == "--seconds":
            sec = float(sys.argv[4])
        elif len(sys.argv) != 3:
            sys.exit("usage: bench/report.py --all DIR [--seconds S]")
        sys.exit(report_all(sys.argv[2], sec))
    if len(sys.argv) != 2:
        sys.exit("usage: bench/report.py RUN_OUTPUT | bench/report.py --all DIR [--seconds S]")
    main(sys.argv[1])
