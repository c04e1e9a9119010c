"""A second process of the Mooncake tests: ``python mc_child.py '<json>'``
sets up its own Mooncake client (no segment) against the servers named in
the JSON, does one job, closes the client and prints one JSON line.

Jobs: "populate" (the layer API populates a layer of make_rows tables),
"lookup" (the layer API looks up `rounds` batches of random ids with a row
cache and compares every row with make_rows), "lookup_table" (the same
through the table API), "tables" (the table API's ops in order, each
["populate", name, num_rows, seed], ["remove", name] or ["list"]; the
answers of the "list" ops come back)."""
from __future__ import annotations

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramstore  # noqa: E402
from esutil import make_rows  # noqa: E402


def heads(a):
    return [make_rows(n, a["row_bytes"], seed=a["seed"] + h) for h, n in enumerate(a["sizes"])]


def main(a):
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    from mooncake.store import MooncakeDistributedStore
    c = MooncakeDistributedStore()
    rc = c.setup("127.0.0.1", a["metadata"], 0, 64 << 20, "tcp", "", a["master"])
    if rc != 0:
        return {"error": f"setup {rc}"}
    try:
        bufs = heads(a) if "sizes" in a else []
        rng = np.random.default_rng(a.get("seed", 0))
        if a["job"] in ("populate", "lookup"):
            cfg = engramstore.EngramStoreConfig(a["sizes"], a["row_bytes"])
            with engramstore.EngramStore({a["layer"]: cfg}, c, cache_bytes=a.get("cache", 0)) as t:
                if a["job"] == "populate":
                    t.populate(a["layer"], bufs)
                    return {"ok": True}
                bad = 0
                for _ in range(a["rounds"]):
                    ids = np.stack([rng.integers(0, n, (a["B"], a["L"])) for n in a["sizes"]],
                                   -1).astype(np.int64)
                    out = np.zeros(ids.shape + (a["row_bytes"],), np.uint8)
                    t.lookup_into(a["layer"], ids, out)
                    for h, b in enumerate(bufs):
                        bad += int((out[:, :, h] != b[ids[:, :, h]]).any(-1).sum())
                st = t.stats()
                return {"ok": bad == 0, "bad_rows": bad, "hits": st["cache"]["hits"],
                        "reads": st["cache"]["reads"]}
        if a["job"] == "lookup_table":
            names = [f"t{h}" for h in range(len(a["sizes"]))]
            with engramstore.EngramStore(namespace=a["namespace"], store_client=c) as st:
                ids = np.stack([rng.integers(0, n, a["B"]) for n in a["sizes"]], -1)
                out = np.zeros((a["B"], len(names), a["row_bytes"]), np.uint8)
                st.lookup(names, ids, out)
                bad = sum(int((out[:, h] != b[ids[:, h]]).any(-1).sum())
                          for h, b in enumerate(bufs))
                return {"ok": bad == 0, "bad_rows": bad, "tables": st.list_tables()}
        if a["job"] == "tables":
            lists = []
            with engramstore.EngramStore(namespace=a["namespace"], store_client=c) as st:
                for op in a["ops"]:
                    if op[0] == "populate":
                        st.populate(op[1], make_rows(op[2], a["row_bytes"], seed=op[3]))
                    elif op[0] == "remove":
                        st.remove(op[1], force=True)
                    else:
                        lists.append(st.list_tables())
            return {"ok": True, "lists": lists}
        return {"error": f"unknown job {a['job']}"}
    except engramstore.EngramError as e:
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        c.close()


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))), flush=True)
