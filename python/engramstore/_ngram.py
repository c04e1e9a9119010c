"""Tokens to rows: the Engram n-gram hash (the C library's engram_ngram_*).

NgramLayout fixes a model's hash (per layer: the columns' primes, their offsets
in the layer's table, the multipliers); NgramHasher turns a request's tokens
into every layer's row ids, exactly as the released models do; build_token_map
makes the raw-to-compressed token map from a Hugging Face tokenizer.
docs/ngram.md has the algorithm and an engine's loop around it.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from . import _engram

# Fields of a model config that NgramLayout.from_config() reads, each with the
# names it answers to (first found wins), under "text_config" if there is one.
_CONFIG_FIELDS: dict[str, tuple[str, ...]] = {
    "layer_ids": ("engram_layer_ids",),
    "vocab_size": ("engram_vocab_size",),
    "max_ngram": ("engram_max_ngram_size", "engram_max_ngram"),
    "heads": ("engram_n_head_per_ngram", "engram_heads"),
    "compressed_vocab": ("engram_compressed_vocab_size", "engram_compressed_vocab"),
    "pad_id": ("engram_pad_id",),
}


def _numpy() -> Any:
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _int64_array(raw: bytes, shape: tuple[int, ...]) -> Any:
    """Native int64 bytes as a read-only numpy array (a memoryview without numpy)."""
    np = _numpy()
    if np is None:
        return memoryview(raw).cast("q", shape)
    return np.frombuffer(raw, dtype=np.int64).reshape(shape)


def _flat_ints(v: Any) -> list[Any]:
    """[L, X] values (nested lists or an array) flattened; the values as they
    are, for the C side to check that each is an int (int() would truncate
    a float)."""
    np = _numpy()
    if np is not None and not isinstance(v, (list, tuple)):
        return list(np.asarray(v).reshape(-1).tolist())
    out: list[Any] = []
    for row in v:
        if isinstance(row, (list, tuple)):
            out.extend(row)
        else:
            out.append(row)
    return out


class NgramLayout:
    """A model's n-gram hash layout.

    ``NgramLayout(layer_ids=, vocab_size=, max_ngram=, heads=, compressed_vocab=,
    pad_id=)`` computes, for each layer (in ``layer_ids`` order), C = (max_ngram
    - 1) * heads columns: column c = (n - 2) * heads + h for n-gram order n and
    head h.  ``primes`` (int64 [L, C]): the columns' prime row counts, searched
    above vocab_size - 1, each prime used once across the layers;
    ``offsets`` (int64 [L, C]): where each column starts in its layer's table;
    ``multipliers`` (int64 [L, max_ngram]): numpy's
    ``default_rng(10007 * layer_id).integers(0, bound, max_ngram) * 2 + 1``
    reproduced in C; ``num_rows``: each layer's table size.  ``primes=`` and
    ``multipliers=`` may be given instead ([L, C] and [L, max_ngram]).
    ``pad_id`` is a compressed id (the token map's value of the raw pad token).
    Bad values raise ValueError naming the field.
    """

    def __init__(self, layer_ids: Sequence[int], vocab_size: int, max_ngram: int, heads: int,
                 compressed_vocab: int, pad_id: int, *, primes: Any = None,
                 multipliers: Any = None) -> None:
        self._c = _engram.NgramLayout(
            layer_ids=layer_ids, vocab_size=vocab_size, max_ngram=max_ngram,
            heads=heads, compressed_vocab=compressed_vocab, pad_id=pad_id,
            primes=None if primes is None else _flat_ints(primes),
            multipliers=None if multipliers is None else _flat_ints(multipliers))
        dims, p, o, m, r = self._c._arrays()
        (self._L, self._N, self._H, self._C, self._vocab, self._cv, self._pad,
         self._layer_ids) = dims
        self._primes = _int64_array(p, (self._L, self._C))
        self._offsets = _int64_array(o, (self._L, self._C))
        self._mults = _int64_array(m, (self._L, self._N))
        self._rows = tuple(memoryview(r).cast("q").tolist())

    @classmethod
    def from_config(cls, config: str | os.PathLike[str] | Mapping[str, Any],
                    **overrides: Any) -> NgramLayout:
        """The layout of a model's ``config.json`` (a path or the parsed dict).

        Reads, from the config or its ``text_config``: ``engram_layer_ids``,
        ``engram_vocab_size`` (one int, or a list whose values are all equal),
        ``engram_max_ngram_size`` (or ``engram_max_ngram``),
        ``engram_n_head_per_ngram`` (or ``engram_heads``),
        ``engram_compressed_vocab_size`` (or ``engram_compressed_vocab``) and
        ``engram_pad_id`` (a compressed id).  Keyword arguments named like
        NgramLayout's give or replace any of them.  A missing field raises
        ValueError naming what was looked for.
        """
        if isinstance(config, Mapping):
            cfg: Mapping[str, Any] = config
        else:
            with open(os.fspath(config), encoding="utf-8") as f:
                cfg = json.load(f)
            if not isinstance(cfg, Mapping):
                raise ValueError(f"config {os.fspath(config)!r}: not a JSON object")
        scopes = [cfg]
        if isinstance(cfg.get("text_config"), Mapping):
            scopes.insert(0, cfg["text_config"])
        args: dict[str, Any] = {}
        for field, names in _CONFIG_FIELDS.items():
            if field in overrides:
                args[field] = overrides.pop(field)
                continue
            for scope in scopes:
                hit = next((scope[n] for n in names if n in scope), None)
                if hit is not None:
                    args[field] = hit
                    break
            else:
                raise ValueError(f"config: no {' or '.join(names)} (in the config or its "
                                 f"text_config); give {field}= instead")
        if overrides:
            raise TypeError(f"from_config() got unexpected keyword arguments: "
                            f"{', '.join(sorted(overrides))}")
        v = args["vocab_size"]
        if isinstance(v, (list, tuple)):
            if not v or any(x != v[0] for x in v):
                raise ValueError(f"config: engram_vocab_size {v!r} holds different sizes; one "
                                 f"base size is supported")
            args["vocab_size"] = v[0]
        return cls(**args)

    layer_ids = property(lambda self: self._layer_ids, doc="The model's layer numbers, in order.")
    vocab_size = property(lambda self: self._vocab, doc="The base table size.")
    max_ngram = property(lambda self: self._N, doc="N, the longest n-gram.")
    heads = property(lambda self: self._H, doc="Heads per n-gram order.")
    num_cols = property(lambda self: self._C, doc="Columns per layer: (N - 1) * heads.")
    compressed_vocab = property(lambda self: self._cv, doc="Compressed ids are below it.")
    pad_id = property(lambda self: self._pad, doc="The compressed id of padding.")
    primes = property(lambda self: self._primes, doc="int64 [L, C]: the columns' row counts.")
    offsets = property(lambda self: self._offsets,
                       doc="int64 [L, C]: each column's first row in its layer's table.")
    multipliers = property(lambda self: self._mults, doc="int64 [L, max_ngram].")
    num_rows = property(lambda self: self._rows, doc="Each layer's table size (a tuple).")

    def layer_index(self, layer_id: int) -> int:
        """The index in layer_ids of model layer ``layer_id`` (ValueError if absent)."""
        try:
            return self._layer_ids.index(layer_id)
        except ValueError:
            raise ValueError(f"layer {layer_id!r} is not one of the layout's layers "
                             f"{list(self._layer_ids)}") from None

    def __repr__(self) -> str:
        return (f"NgramLayout(layer_ids={list(self._layer_ids)}, vocab_size={self._vocab}, "
                f"max_ngram={self._N}, heads={self._H}, compressed_vocab={self._cv}, "
                f"pad_id={self._pad}; num_rows={list(self._rows)})")


class NgramHasher:
    """Tokens to row ids with a layout, and a token map or without.

    ``token_map`` (int32 or int64 [V]): raw token id -> compressed id, as
    build_token_map() makes it; without one, tokens are compressed ids already.
    -1 (DEAD) marks a token that takes no part (an image token, padding).
    Every token is checked first: one outside the map (or not a compressed id)
    raises BadIdError naming its position, and nothing is written.
    """

    def __init__(self, layout: NgramLayout, token_map: Any = None) -> None:
        if not isinstance(layout, NgramLayout):
            raise TypeError(f"layout: expected an NgramLayout, got {type(layout).__name__}")
        self._layout = layout
        self._c = _engram.NgramHasher(layout._c, token_map)

    layout = property(lambda self: self._layout)

    def _out(self, out: Any, n: int, layer: int | None) -> Any:
        if out is not None:
            return out
        lay = self._layout
        shape = (n, lay.num_cols) if layer is not None else (n, len(lay.layer_ids), lay.num_cols)
        np = _numpy()
        if np is None:
            size = 8
            for d in shape:
                size *= d
            return memoryview(bytearray(size)).cast("B").cast("q", shape)
        return np.empty(shape, np.int64)

    def _tokens(self, tokens: Any, arg: str) -> Any:
        """A list or tuple of token ids as int64; an array as it is (the C
        side checks its dtype).  Only ints are tokens: floats or bools in a
        list are refused as they are in an array, not truncated.  One
        dimension: its length sizes the output before the C side sees it."""
        np = _numpy()
        if isinstance(tokens, (list, tuple)) and np is not None:
            a = np.asarray(tokens)
            if a.dtype.kind in "uO":  # Python ints past int64 (numpy names no argument)
                try:
                    a = np.asarray(tokens, dtype=np.int64)
                except (OverflowError, TypeError, ValueError) as e:
                    raise type(e)(f"{arg}: {e}") from None
            elif a.dtype.kind != "i" and a.size:
                raise TypeError(f"{arg}: expected int token ids, got a "
                                f"{type(tokens).__name__} of {a.dtype} values")
            tokens = a.astype(np.int64, copy=False)
        ndim = getattr(tokens, "ndim", None)
        if ndim is None and not hasattr(tokens, "__len__"):
            raise TypeError(f"{arg}: expected a 1-D array of token ids, got "
                            f"{type(tokens).__name__}")
        if ndim is not None and ndim != 1:
            raise ValueError(f"{arg}: expected a contiguous 1-D array, got shape "
                             f"{tuple(tokens.shape)}")
        return tokens

    def hash(self, tokens: Any, history: Any = None, out: Any = None, local: bool = False,
             layer: int | None = None, threads: int = 0) -> Any:
        """Row ids of one request's chunk of tokens.

        ``tokens``: 1-D int32 or int64 (raw ids with a token map).  ``history``:
        the tokens before the chunk, oldest first, of the same dtype: its last
        max_ngram - 1 are used (fewer, or None, at the start of a request).
        Returns ``out`` (allocated as int64 when not given): [T, L, C] ids,
        or [T, C] for one ``layer`` (a model layer number of the layout);
        global rows of each layer's table, or each column's own rows with
        ``local=True`` (the layer API's per-head tables).  out may be int32 or
        int64, C-contiguous.  ``threads``: 0 hashes batches of 32,768 tokens and
        more on several threads (a thread per 16,384 tokens, at most the CPUs
        and 8), 1 on the calling thread only, N on N threads.
        """
        tokens = self._tokens(tokens, "tokens")
        idx = -1 if layer is None else self._layout.layer_index(layer)
        out = self._out(out, len(tokens), layer)
        self._c.hash(tokens, out, history=_history(self, history), local=local, layer=idx,
                     threads=threads)
        return out

    def hash_batch(self, requests: Sequence[Any], histories: Sequence[Any] | None = None,
                   out: Any = None, local: bool = False, layer: int | None = None,
                   threads: int = 0) -> Any:
        """Row ids of a ragged batch: ``requests`` is a sequence of 1-D token
        arrays (one chunk per request), ``histories`` (or None) the tokens
        before each (as in hash(); None for a request that starts there).
        Returns [sum(T_r), L, C] (or [sum(T_r), C] for one layer), the
        requests one after the other.  Needs numpy."""
        np = _numpy()
        if np is None:
            raise ImportError("hash_batch() needs numpy")
        reqs = [np.asarray(self._tokens(r, f"requests[{i}]")) for i, r in enumerate(requests)]
        dtype = reqs[0].dtype if reqs else np.dtype(np.int64)
        if any(r.dtype != dtype for r in reqs):
            raise TypeError("requests: every request must have the same dtype")
        lens = [len(r) for r in reqs]
        starts = np.zeros(len(reqs) + 1, np.int64)
        np.cumsum(lens, out=starts[1:])
        tokens = np.concatenate(reqs).astype(dtype, copy=False) if reqs else np.zeros(0, dtype)
        hist = hstarts = None
        if histories is not None:
            if len(histories) != len(reqs):
                raise ValueError(f"histories: expected {len(reqs)} (one per request, or None), "
                                 f"got {len(histories)}")
            keep = self._layout.max_ngram - 1
            hs = [np.zeros(0, dtype) if h is None else
                  _as_dtype(np, self._tokens(h, f"histories[{i}]"), dtype, f"histories[{i}]")[-keep:]
                  for i, h in enumerate(histories)]
            hstarts = np.zeros(len(hs) + 1, np.int64)
            np.cumsum([len(h) for h in hs], out=hstarts[1:])
            hist = np.concatenate(hs) if hs else np.zeros(0, dtype)
        idx = -1 if layer is None else self._layout.layer_index(layer)
        out = self._out(out, int(starts[-1]), layer)
        if len(reqs) == 1:
            self._c.hash(tokens, out, history=hist, local=local, layer=idx, threads=threads)
        elif reqs:
            self._c.hash(tokens, out, history=hist, starts=starts, history_starts=hstarts,
                         local=local, layer=idx, threads=threads)
        return out

    def lookup(self, store: Any, layer: int, tables: Any, tokens: Any, out: Any = None,
               history: Any = None, zero_dead: bool = False) -> Any:
        """Tokens to rows in one call: hashes ``tokens`` (one request's chunk after
        its ``history``, as hash() does) for model layer ``layer`` and gathers the
        rows from ``store`` into ``out`` (uint8 [T, C, row_bytes], allocated when not
        given), returned.  ``tables``: the layer's one table (a name; global ids), or
        C names, a table per column (local ids: the layer API's engram:l{L}:h{c}).
        A bad token raises BadIdError naming it; nothing is written then."""
        tokens = self._tokens(tokens, "tokens")
        out = _lookup_out(self, store, tables, len(tokens), out)
        self._c._lookup(store, self._layout.layer_index(layer), tables, tokens, out,
                        history=_history(self, history), zero_dead=zero_dead)
        return out

    def submit(self, store: Any, layer: int, tables: Any, tokens: Any, out: Any = None,
               history: Any = None, zero_dead: bool = False) -> tuple[Any, Any]:
        """lookup() on the store's lookup threads: returns at once a PendingLookup
        (``.wait()``, ``.cancel()``, ``.done()``) and the output it fills, as
        ``(pending, out)``.  The hash runs there too.  tokens, history and out are
        held until the wait."""
        tokens = self._tokens(tokens, "tokens")
        out = _lookup_out(self, store, tables, len(tokens), out)
        pending = self._c._lookup(store, self._layout.layer_index(layer), tables, tokens, out,
                                  history=_history(self, history), zero_dead=zero_dead,
                                  submit=True)
        return pending, out


def _as_dtype(np: Any, tokens: Any, dtype: Any, arg: str) -> Any:
    """Tokens (a history of a batch) in the requests' dtype: int tokens whose
    values that dtype holds; floats, or ints it would change, are refused."""
    a = np.asarray(tokens)
    if a.dtype == dtype or a.size == 0:
        return a.astype(dtype, copy=False)
    if a.dtype.kind != "i":
        raise TypeError(f"{arg}: expected int32 or int64 token ids, got {a.dtype}")
    b = a.astype(dtype)
    if not np.array_equal(a, b):
        raise ValueError(f"{arg}: a token id does not fit {np.dtype(dtype).name}, the "
                         f"requests' dtype")
    return b


def _lookup_out(hasher: NgramHasher, store: Any, tables: Any, n: int, out: Any) -> Any:
    if not isinstance(store, _engram.Store):
        raise TypeError(f"store: expected a TableStore, got {type(store).__name__}")
    if out is not None:
        return out
    if isinstance(tables, str):
        first = tables
    elif not isinstance(tables, (list, tuple)):
        raise TypeError(f"tables: expected a table name or a list of them, got "
                        f"{type(tables).__name__}")
    elif len(tables) != hasher.layout.num_cols:
        raise ValueError(f"tables: expected one name (the layer's table) or "
                         f"{hasher.layout.num_cols} (one per column), got {len(tables)}")
    else:
        first = tables[0]
    rb = store.get_table_spec(first)["row_bytes"]
    np = _numpy()
    shape = (n, hasher.layout.num_cols, rb)
    if np is None:
        size = n * hasher.layout.num_cols * rb
        return memoryview(bytearray(size)).cast("B", shape)
    return np.empty(shape, np.uint8)


def _history(hasher: NgramHasher, history: Any) -> Any:
    if history is None:
        return None
    history = hasher._tokens(history, "history")
    keep = hasher.layout.max_ngram - 1
    return history[len(history) - keep:] if len(history) > keep else history


def build_token_map(tokenizer: Any, compressed_vocab: int | None = None) -> Any:
    """The raw-to-compressed token map (int64 [V]) of a Hugging Face tokenizer.

    ``tokenizer``: a ``tokenizers.Tokenizer``, or a transformers fast tokenizer
    (its ``backend_tokenizer``).  Each token id 0..V-1 is decoded alone
    (special tokens kept); a text holding U+FFFD is keyed by the token's raw
    string, any other by its normalized text (NFKC, NFD, accents stripped,
    lowercase, runs of spaces, tabs and line breaks made one space, stripped,
    but a lone space kept), or by the text itself where that leaves nothing.
    Compressed ids are given in order of first appearance.  With
    ``compressed_vocab``, a count that differs raises ValueError.  Needs the
    ``tokenizers`` package (and numpy).
    """
    try:
        from tokenizers import Regex, normalizers
    except ImportError as e:
        raise ImportError("build_token_map() needs the 'tokenizers' package "
                          "(pip install tokenizers)") from e
    np = _numpy()
    if np is None:
        raise ImportError("build_token_map() needs numpy")
    tok = getattr(tokenizer, "backend_tokenizer", tokenizer)
    sentinel = "\ue000"
    norm = normalizers.Sequence([
        normalizers.NFKC(), normalizers.NFD(), normalizers.StripAccents(),
        normalizers.Lowercase(),
        normalizers.Replace(Regex(r"[ \t\r\n]+"), " "),
        normalizers.Replace(Regex(r"^ $"), sentinel),
        normalizers.Strip(),
        normalizers.Replace(sentinel, " "),
    ])
    size = tok.get_vocab_size(with_added_tokens=True)
    out = np.empty(size, np.int64)
    keys: dict[str, int] = {}
    for t in range(size):
        text = tok.decode([t], skip_special_tokens=False)
        if "\ufffd" in text:
            raw = tok.id_to_token(t)
            key = raw if raw is not None else text
        else:
            key = norm.normalize_str(text) or text
        out[t] = keys.setdefault(key, len(keys))
    if compressed_vocab is not None and len(keys) != compressed_vocab:
        raise ValueError(f"the tokenizer compresses to {len(keys)} ids, not "
                         f"compressed_vocab {compressed_vocab}")
    return out
