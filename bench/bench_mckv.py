#!/usr/bin/env python3
"""The publication protocol over a Mooncake Store, against bare puts and gets.

    bench/bench_mckv.py [--quick] [--table-bytes 268435456] [--chunk-bytes 16777216]
                        [--reps 5]

Starts Mooncake's metadata server and master on free 127.0.0.1 ports
(tests/python/mcserver.py), one client holding the segment and one without
(every byte crosses the transfer engine's TCP path), and times in the same
run, --reps repetitions alternating which goes first:

  (a) push   the library's protocol (engramstore._engram._Publication over
             engramstore._mckv.MooncakeKV): claim, the chunks, persist,
             publish, against
      puts   the same chunks put as objects by the bare client (put, one
             call per chunk: what any writer must send);
  (b) read   _Publication.read(): the manifest, every chunk read and
             checked against its XXH3-64, the whole against its checksum,
             against
      gets   the same chunk objects read by the bare client's get().

Every table read is compared with the rows pushed.  A new name (and new
bare keys) every repetition; both are removed after it.  --quick: 64 MiB,
3 repetitions.  The last line is JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--table-bytes", type=int, default=256 << 20)
    ap.add_argument("--chunk-bytes", type=int, default=16 << 20)
    ap.add_argument("--row-bytes", type=int, default=264)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    if a.quick:
        a.table_bytes, a.reps = 64 << 20, 3

    import mcserver
    from engramstore import _engram
    from engramstore._mckv import MooncakeKV

    why = mcserver.mooncake_missing()
    if why:
        print(f"bench_mckv: skipped: {why}")
        return 0
    rows_n = a.table_bytes // a.row_bytes
    rng = np.random.default_rng(1)
    rows = rng.integers(0, 256, (rows_n, a.row_bytes), dtype=np.uint8)
    chunk_rows = max(1, a.chunk_bytes // a.row_bytes)
    chunks = [np.ascontiguousarray(rows[i:i + chunk_rows]).reshape(-1)
              for i in range(0, rows_n, chunk_rows)]

    srv = mcserver.MooncakeServers(tempfile.mkdtemp(prefix="bench-mckv-"))
    srv.start()
    holder = client = None
    try:
        holder = srv.client(segment_bytes=max(1 << 30, 3 * a.table_bytes))
        client = srv.client()
        kv = MooncakeKV(client, "bench-mckv")
        pub = _engram._Publication(kv, "mooncake://bench-mckv", a.chunk_bytes, 600000)
        times: dict[str, list[float]] = {"push": [], "puts": [], "read": [], "gets": []}

        def run_push(rep: int) -> None:
            t0 = time.perf_counter()
            pub.push(f"t{rep}", rows)
            times["push"].append(time.perf_counter() - t0)

        def run_puts(rep: int) -> None:
            t0 = time.perf_counter()
            for i, c in enumerate(chunks):
                rc = client.put(f"bench-bare/{rep}/{i}", c.tobytes())
                if rc != 0:
                    raise RuntimeError(f"put answered {rc}")
            times["puts"].append(time.perf_counter() - t0)

        def run_read(rep: int) -> None:
            t0 = time.perf_counter()
            got = pub.read(f"t{rep}")
            times["read"].append(time.perf_counter() - t0)
            if got != rows.tobytes():
                raise RuntimeError("read: other bytes than pushed")

        def run_gets(rep: int) -> None:
            t0 = time.perf_counter()
            parts = [client.get(f"bench-bare/{rep}/{i}") for i in range(len(chunks))]
            times["gets"].append(time.perf_counter() - t0)
            if b"".join(bytes(p) for p in parts) != rows.tobytes():
                raise RuntimeError("gets: other bytes than put")

        for rep in range(a.reps + 1):  # repetition 0 is untimed (warm-up)
            order = [(run_push, run_puts), (run_read, run_gets)]
            for pair in order:
                first, second = pair if rep % 2 == 0 else pair[::-1]
                first(rep)
                second(rep)
            if rep == 0:
                for v in times.values():
                    v.clear()
            pub.remove(f"t{rep}")
            for i in range(len(chunks)):
                client.remove(f"bench-bare/{rep}/{i}", True)
    finally:
        for c in (client, holder):
            if c is not None:
                c.close()
        srv.stop()

    mib = a.table_bytes / (1 << 20)
    med = {k: statistics.median(v) for k, v in times.items()}
    load = os.getloadavg()[0]
    print(f"bench_mckv: {mib:.0f} MiB in {len(chunks)} chunks of {a.chunk_bytes >> 20} MiB, "
          f"{a.reps} reps, load average {load:.2f}")
    for k in ("push", "puts", "read", "gets"):
        v = times[k]
        print(f"{k:5s} median {med[k] * 1e3:8.1f} ms ({min(v) * 1e3:8.1f} to "
              f"{max(v) * 1e3:8.1f})  {mib / med[k]:7.0f} MiB/s")
    print(f"push / puts (bare's median time / push's): {med['puts'] / med['push']:.2f}x")
    print(f"read / gets (bare's median time / read's): {med['gets'] / med['read']:.2f}x")
    print(json.dumps({"bench": "mckv", "table_bytes": a.table_bytes,
                      "chunk_bytes": a.chunk_bytes, "reps": a.reps, "load": load,
                      "median_s": med,
                      "push_vs_puts": med["puts"] / med["push"],
                      "read_vs_gets": med["gets"] / med["read"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
