"""Shard plans for TP x DP ranks (the thin layer over engram_shard_plan)."""
from __future__ import annotations

import operator
import re
from collections.abc import Mapping, Sequence
from typing import Any

from . import _engram

_PER_TP, _BALANCED = 0x1, 0x2
_NAME = re.compile(r"^engram:l(\d+):h(\d+)$")


def _layer_sizes(head_rows: Mapping[int, object] | Sequence[int],
                 layers: Sequence[int]) -> dict[int, list[int]]:
    """{layer_id: [rows of head h]} from a list of sizes (the same for every
    layer of `layers`) or a {layer_id: sizes or EngramStoreConfig} dict."""
    from . import EngramStoreConfig
    out: dict[int, list[int]]
    if isinstance(head_rows, Mapping):
        out = {}
        for lid, v in head_rows.items():
            sizes = v.table_vocab_sizes if isinstance(v, EngramStoreConfig) else v
            out[int(lid)] = _row_counts(sizes, f"head_rows[{lid!r}]")
        if layers:
            raise TypeError("layers: given by head_rows already (a dict of layer -> sizes)")
    else:
        sizes = _row_counts(head_rows, "head_rows")
        out = {int(lid): sizes for lid in (layers or (0,))}
    if not out:
        raise ValueError("head_rows: no layer")
    counts = {len(v) for v in out.values()}
    if len(counts) != 1:
        raise ValueError(f"head_rows: every layer needs the same number of heads, got {sorted(counts)}")
    if 0 in counts:
        raise ValueError("head_rows: a layer of 0 heads")
    for lid, v in out.items():
        if any(n <= 0 for n in v):
            raise ValueError(f"head_rows: layer {lid} has a head of {min(v)} rows")
        if any(n > 2**63 - 1 for n in v):
            raise ValueError(f"head_rows: layer {lid} has a head of {max(v)} rows, past 2**63 - 1")
    return out


def _row_counts(sizes: Any, arg: str) -> list[int]:
    """A layer's head sizes: ints (numpy's too), never truncated floats or
    the digits of a string."""
    if isinstance(sizes, (str, bytes)) or not hasattr(sizes, "__iter__"):
        raise TypeError(f"{arg}: expected a list of row counts, got {type(sizes).__name__}")
    out = []
    for h, n in enumerate(sizes):
        try:
            out.append(operator.index(n))
        except TypeError:
            raise TypeError(f"{arg}: head {h} has {n!r} rows, not an int") from None
    return out


def _head_reads(reads: object, num_heads: int) -> list[int] | None:
    """Per-head read counts from a list, or from stats()["tables"] (a dict
    of table name -> {"rows": n, ...} or -> n), summed over layers."""
    if reads is None:
        return None
    if isinstance(reads, Mapping):
        out = [0] * num_heads
        for name, v in reads.items():
            m = _NAME.match(str(name))
            if not m:
                continue  # not a layer table
            h = int(m.group(2))
            if h >= num_heads:
                raise ValueError(f"reads: table {name!r} is head {h} of a layer of {num_heads} heads")
            out[h] += int(v["rows"] if isinstance(v, Mapping) else v)
        return out
    if isinstance(reads, Sequence) or hasattr(reads, "__len__"):
        out = [int(r) for r in reads]  # type: ignore[attr-defined]
        if len(out) != num_heads:
            raise ValueError(f"reads: expected {num_heads} counts (one per head), got {len(out)}")
        if any(r < 0 for r in out):
            raise ValueError("reads: counts must be >= 0")
        return out
    raise TypeError(f"reads: expected a list of counts or a stats()['tables'] dict, "
                    f"got {type(reads).__name__}")


def _imbalance(shards: Sequence[tuple[int, int, int]]) -> float:
    loads = [s[2] for s in shards]
    mean = sum(loads) / len(loads)
    return max(loads) / mean if mean else 1.0


def shard_plan(head_rows: Mapping[int, object] | Sequence[int], tp: int, dp: int = 1, *,
               per_tp: bool = False, reads: object = None, balanced: bool = False,
               layers: Sequence[int] = (), by_rows: bool = False) -> dict[str, Any]:
    """Which heads each rank of a TP x DP topology holds, as a JSON-ready dict.

    ``head_rows``: the rows of each head of a layer (a list, the same for
    every layer id of ``layers``), or ``{layer_id: sizes or
    EngramStoreConfig}``.  One shard per rank (TP-major slot ``tp_rank * dp +
    dp_rank``), or with ``per_tp=True`` one per TP rank shared by its DP
    peers.  The head-wise plan gives each shard ``ceil(heads / shards)``
    heads in order and refuses a topology that leaves a shard without one
    (SpecError); ``balanced=True`` chooses the cuts from ``reads`` (a count
    per head, or ``stats()["tables"]``) to minimise the busiest shard's
    reads.  With ``reads``, ``"imbalance"`` gives max / mean reads of both
    plans (the head-wise one None where it is refused).

    ``by_rows=True``: the row-wise plan, for topologies with more shards than
    heads: each layer's rows (its heads laid end to end) cut into equal
    contiguous ranges, heads split between shards where they must be.  Each
    rank then holds one table of its ``[row_start, row_end)`` of each layer
    and looks the layer's global ids up with ``offset`` row_start;
    shard_route() says which rank holds each id.
    """
    sizes = _layer_sizes(head_rows, layers)
    if by_rows:
        return _row_plan(sizes, tp, dp, per_tp, reads, balanced)
    H = len(next(iter(sizes.values())))
    counts = _head_reads(reads, H)
    if balanced and counts is None:
        raise TypeError("balanced: needs reads (a count per head, or stats()['tables'])")
    flags = (_PER_TP if per_tp else 0) | (_BALANCED if balanced else 0)
    shards = _engram.shard_plan(H, counts, tp, dp, flags)
    plan: dict[str, Any] = {
        "schema": 1,
        "tp": tp, "dp": dp,
        "mode": "per_tp" if per_tp else "per_rank",
        "plan": "balanced" if balanced else "head_wise",
        "heads": H,
        "shards": [{"shard": i, "heads": list(range(f, f + n)), "reads": r}
                   for i, (f, n, r) in enumerate(shards)],
    }
    if counts is not None:
        other = "head_wise" if balanced else "balanced"
        try:
            alt = _engram.shard_plan(H, counts, tp, dp, flags ^ _BALANCED)
            alt_imb = _imbalance(alt)
        except _engram.SpecError:
            alt_imb = None
        plan["imbalance"] = {plan["plan"]: _imbalance(shards), other: alt_imb}
    ranks = []
    for t in range(tp):
        for d in range(dp):
            s = t if per_tp else t * dp + d
            f, n, _ = shards[s]
            per_layer = {}
            for lid, v in sizes.items():
                starts = [sum(v[:h]) for h in range(H + 1)]
                per_layer[str(lid)] = {
                    "tables": [f"engram:l{lid}:h{h}" for h in range(f, f + n)],
                    "offsets": starts[f:f + n],
                    "row_start": starts[f],
                    "row_end": starts[f + n],
                }
            ranks.append({"tp_rank": t, "dp_rank": d, "shard": s, "layers": per_layer})
    plan["ranks"] = ranks
    return plan


def _row_plan(sizes: dict[int, list[int]], tp: int, dp: int, per_tp: bool, reads: object,
              balanced: bool) -> dict[str, Any]:
    if balanced or reads is not None:
        raise TypeError("by_rows: the row-wise plan cuts rows evenly; it takes no reads or "
                        "balanced")
    flags = _PER_TP if per_tp else 0
    rows = {lid: _engram.shard_plan_rows(v, tp, dp, flags) for lid, v in sizes.items()}
    count = len(next(iter(rows.values())))
    plan: dict[str, Any] = {
        "schema": 1,
        "tp": tp, "dp": dp,
        "mode": "per_tp" if per_tp else "per_rank",
        "plan": "row_wise",
        "heads": len(next(iter(sizes.values()))),
        "shards": [{"shard": i, "layers": {
            str(lid): {"row_start": r[i][0], "row_end": r[i][1],
                       "heads": list(range(r[i][2], r[i][3] + 1))}
            for lid, r in rows.items()}} for i in range(count)],
        "row_shards": {str(lid): [list(t) for t in r] for lid, r in rows.items()},
    }
    ranks = []
    for t in range(tp):
        for d in range(dp):
            s = t if per_tp else t * dp + d
            per_layer = {str(lid): {"row_start": r[s][0], "row_end": r[s][1], "offset": r[s][0],
                                    "heads": list(range(r[s][2], r[s][3] + 1))}
                         for lid, r in rows.items()}
            ranks.append({"tp_rank": t, "dp_rank": d, "shard": s, "layers": per_layer})
    plan["ranks"] = ranks
    return plan


def shard_route(plan: Mapping[str, Any], layer: int, ids: Any, out: Any = None) -> Any:
    """The shard holding each of ``ids`` (global row ids of model layer
    ``layer``, int64 1-D; -1 is DEAD, on no shard) in a row-wise ``plan``
    (shard_plan(..., by_rows=True)): int32 of the same length (``out`` if
    given), -1 for DEAD.  An id outside the layer's rows raises BadIdError
    naming it; nothing is written then."""
    try:
        shards = plan["row_shards"][str(int(layer))]
    except KeyError:
        raise ValueError(f"plan: no row-wise plan of layer {layer!r} (shard_plan(..., "
                         f"by_rows=True) makes one)") from None
    if out is None:
        try:
            import numpy as np
        except ImportError:
            raise ImportError("shard_route() without out needs numpy") from None
        ids = _int64_ids(np, ids)
        out = np.empty(len(ids), np.int32)
    _engram.shard_route([tuple(s) for s in shards], ids, out)
    return out


def _int64_ids(np: Any, ids: Any) -> Any:
    """ids as a contiguous int64 array, for shard_route() without out: ints
    whose values int64 holds, or refused naming them (a cast would
    truncate 1.7 to row 1 and wrap the uint64 2**64 - 1 to -1, DEAD)."""
    a = np.asarray(ids)
    if a.size == 0:
        return np.zeros(a.shape, np.int64)
    if a.dtype.kind not in "iu":
        raise TypeError(f"ids: expected int64 row ids, got {a.dtype}")
    if a.dtype.kind == "u" and a.max() > np.iinfo(np.int64).max:
        i = int(np.argmax(a > np.iinfo(np.int64).max))
        raise ValueError(f"ids[{i}] = {a.reshape(-1)[i]} does not fit int64")
    return np.ascontiguousarray(a, dtype=np.int64)
