"""A second process of the Mooncake tests: ``python mc_child.py '<json>'``
sets up its own Mooncake client (no segment) against the servers named in
the JSON, does one job, closes the client and prints one JSON line.

Jobs: "populate" (the layer API populates a layer of make_rows tables, at
wall-clock time `at` if given),
"lookup" (the layer API looks up `rounds` batches of random ids with a row
cache and compares every row with make_rows), "lookup_table" (the same
through the table API), "tables" (the table API's ops in order, each
["populate", name, num_rows, seed], ["remove", name] or ["list"]; the
answers of the "list" ops come back), and "lifetime" (see lifetime())."""
from __future__ import annotations

import gc
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import engramstore  # noqa: E402
from esutil import make_rows  # noqa: E402


def heads(a):
    return [make_rows(n, a["row_bytes"], seed=a["seed"] + h) for h, n in enumerate(a["sizes"])]


def client(a):
    os.environ["MC_TCP_BIND_ADDRESS"] = "127.0.0.1"
    from mooncake.store import MooncakeDistributedStore
    c = MooncakeDistributedStore()
    rc = c.setup("127.0.0.1", a["metadata"], a.get("segment", 0), 64 << 20, "tcp", "",
                 a["master"])
    if rc != 0:
        raise RuntimeError(f"setup {rc}")
    return c


# What lifetime() leaves for the interpreter's exit to free.
_left: dict = {}


def lifetime(a):
    """A layer store and a table store on one client, each with its
    staging buffer registered (a lookup each), each in a reference cycle
    (so that only a garbage collection frees them); then the steps in
    order: "close_store" (both), "drop_store" (both: the last references
    dropped, then gc.collect()), "close_client", "drop_client" (this
    function's reference; the stores hold theirs).  Whatever is left is
    freed by the interpreter's exit, which the caller checks."""
    c = client(a)
    cfg = engramstore.EngramStoreConfig(a["sizes"], a["row_bytes"])
    layer = engramstore.EngramStore({a["layer"]: cfg}, c)
    table = engramstore.EngramStore(namespace=a["namespace"], store_client=c)
    bufs = heads(a)
    ids = np.zeros((2, 3, len(bufs)), np.int64)
    out = np.zeros(ids.shape + (a["row_bytes"],), np.uint8)
    layer.lookup_into(a["layer"], ids, out)
    bad = sum(int((out[:, :, h] != b[0]).any()) for h, b in enumerate(bufs))
    tout = np.zeros((2, 1, a["row_bytes"]), np.uint8)
    table.lookup(["t"], np.zeros((2, 1), np.int64), tout)
    bad += int((tout != bufs[0][0]).any())
    stores = [layer, table]
    for s in stores:
        s.__dict__["_cycle"] = s
    del layer, table
    for step in a["steps"]:
        if step == "close_store":
            for s in stores:
                s.close()
        elif step == "drop_store":
            stores = []
            gc.collect()
        elif step == "close_client":
            c.close()
        elif step == "drop_client":
            c = None
            gc.collect()
        else:
            raise ValueError(step)
    _left.update(stores=stores, client=c)
    return {"ok": bad == 0}


def main(a):
    if a["job"] == "lifetime":
        return lifetime(a)
    try:
        c = client(a)
    except RuntimeError as e:
        return {"error": str(e)}
    try:
        bufs = heads(a) if "sizes" in a else []
        rng = np.random.default_rng(a.get("seed", 0))
        if a["job"] in ("populate", "lookup"):
            cfg = engramstore.EngramStoreConfig(a["sizes"], a["row_bytes"])
            with engramstore.EngramStore({a["layer"]: cfg}, c, cache_bytes=a.get("cache", 0)) as t:
                if a["job"] == "populate":
                    while time.time() < a.get("at", 0):  # writers meant to race start together
                        time.sleep(0.0005)
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
