"""engramstore.NgramLayout, NgramHasher and build_token_map against a plain
Python reference of the Engram n-gram hash written here (not a mirror of the
C code), and numpy's default_rng itself for the multipliers."""
from __future__ import annotations

import json
import unicodedata

import numpy as np
import pytest

import engramstore as es

INT64_MAX = 2**63 - 1


# ---- the reference ---------------------------------------------------------

def ref_is_prime(n: int) -> bool:
    if n < 2:
        return False
    if n % 2 == 0:
        return n == 2
    f = 3
    while f * f <= n:
        if n % f == 0:
            return False
        f += 2
    return True


def ref_layout(layer_ids, vocab_size, max_ngram, heads, compressed_vocab):
    seen: set[int] = set()
    primes = []
    for _ in layer_ids:
        row = []
        for _n in range(2, max_ngram + 1):
            cur = vocab_size - 1
            for _h in range(heads):
                cur += 1
                while not ref_is_prime(cur) or cur in seen:
                    cur += 1
                seen.add(cur)
                row.append(cur)
        primes.append(row)
    bound = max(1, (INT64_MAX // compressed_vocab) // 2)
    mults = [(np.random.default_rng(10007 * lid).integers(0, bound, size=max_ngram,
                                                          dtype=np.int64) * 2 + 1).tolist()
             for lid in layer_ids]
    offsets = [[sum(row[:c]) for c in range(len(row))] for row in primes]
    return primes, offsets, mults


def ref_hash(c, skip, primes, offsets, mults, max_ngram, heads, pad, local=False):
    """ids [T - skip][L][C] of the compressed stream c (its first `skip`
    tokens are history)."""
    out = []
    for p in range(skip, len(c)):
        per_layer = []
        for lay in range(len(primes)):
            ids = [0] * ((max_ngram - 1) * heads)
            blocked = False
            rolling = 0
            for s in range(max_ngram):
                blocked = blocked or p - s < 0 or c[p - s] == -1
                v = pad if blocked else c[p - s]
                rolling ^= v * mults[lay][s]
                if s >= 1:
                    for h in range(heads):
                        col = (s - 1) * heads + h
                        ids[col] = rolling % primes[lay][col] + (0 if local else offsets[lay][col])
            per_layer.append(ids)
        out.append(per_layer)
    return np.array(out, dtype=np.int64).reshape(len(c) - skip, len(primes),
                                                 (max_ngram - 1) * heads)


CONFIGS = [
    # layer_ids, vocab_size, max_ngram, heads, compressed_vocab
    ([1, 14], 16_000_000, 4, 8, 99_092),
    ([0], 10, 2, 1, 7),
    ([3, 5, 2], 1000, 3, 5, 50),
    ([7, 8, 9, 10], 100_000, 5, 2, 3),
    ([2], 2, 6, 3, 1 << 20),
    ([11, 12], 1 << 20, 3, 4, 1 << 40),
]


@pytest.mark.parametrize("cfg", CONFIGS)
def test_layout_matches_reference(cfg):
    lids, vocab, n, h, cv = cfg
    lay = es.NgramLayout(layer_ids=lids, vocab_size=vocab, max_ngram=n, heads=h,
                         compressed_vocab=cv, pad_id=cv // 2)
    primes, offsets, mults = ref_layout(lids, vocab, n, h, cv)
    assert lay.primes.dtype == np.int64 and lay.primes.shape == (len(lids), (n - 1) * h)
    assert lay.primes.tolist() == primes
    assert lay.offsets.tolist() == offsets
    assert lay.multipliers.tolist() == mults
    assert lay.num_rows == tuple(sum(r) for r in primes)
    assert lay.layer_ids == tuple(lids) and lay.num_cols == (n - 1) * h
    assert (lay.max_ngram, lay.heads, lay.compressed_vocab, lay.pad_id) == (n, h, cv, cv // 2)


def test_v41_rows():
    lay = es.NgramLayout(layer_ids=[1, 14], vocab_size=16_000_000, max_ngram=4, heads=8,
                         compressed_vocab=99_092, pad_id=2)
    assert lay.num_rows == (384_006_168, 384_016_682)
    assert "384006168" in repr(lay)


@pytest.mark.parametrize("cv", [1, 2, 3, 99_092, 2**20 + 7, 2**31 - 1, 2**31, 2**32 + 1,
                                3**30, 2**61, 2**62])
def test_multipliers_are_numpys(cv):
    """numpy's stream for many seeds (layer ids) and bounds (from the
    compressed vocabulary: 32-bit and 64-bit draws, bound 1)."""
    lids = [0, 1, 14, 61, 10**6, 2**40 + 3]
    lay = es.NgramLayout(layer_ids=lids, vocab_size=100, max_ngram=6, heads=1,
                         compressed_vocab=cv, pad_id=0)
    bound = max(1, (INT64_MAX // cv) // 2)
    for i, lid in enumerate(lids):
        want = np.random.default_rng(10007 * lid).integers(0, bound, size=6, dtype=np.int64)
        assert lay.multipliers[i].tolist() == (want * 2 + 1).tolist(), (lid, cv)


def make(cfg, pad=None):
    lids, vocab, n, h, cv = cfg
    lay = es.NgramLayout(layer_ids=lids, vocab_size=vocab, max_ngram=n, heads=h,
                         compressed_vocab=cv, pad_id=cv // 2 if pad is None else pad)
    primes, offsets, mults = ref_layout(lids, vocab, n, h, cv)
    return lay, (primes, offsets, mults, n, h, lay.pad_id)


def stream(rng, t, cv, dead=0.15):
    c = rng.integers(0, cv, size=t, dtype=np.int64)
    c[rng.random(t) < dead] = -1
    return c


@pytest.mark.parametrize("cfg", CONFIGS)
def test_hash_matches_reference(cfg):
    rng = np.random.default_rng(sum(cfg[0]) + cfg[2])
    lay, ref = make(cfg)
    c = stream(rng, 37, cfg[4])
    want = ref_hash(c.tolist(), 0, *ref)
    h = es.NgramHasher(lay)
    got = h.hash(c)
    assert got.dtype == np.int64 and got.shape == want.shape
    assert (got == want).all()
    # Local ids; one layer by its model number; int32 tokens and ids.
    local = ref_hash(c.tolist(), 0, *ref, local=True)
    assert (h.hash(c, local=True) == local).all()
    for i, lid in enumerate(cfg[0]):
        assert (h.hash(c, layer=lid) == want[:, i]).all()
    if cfg[4] < 2**31 and max(lay.num_rows) < 2**31:
        out = np.zeros(want.shape, np.int32)
        assert h.hash(c.astype(np.int32), out=out) is out
        assert (out == want).all()
    # On several threads, parts cutting the request: the same ids.
    for th in (2, 5):
        assert (h.hash(c, threads=th) == want).all()
    # Every chunking, with the history before it (a longer one is cut).
    for cut in range(len(c) + 1):
        got = h.hash(c[cut:], history=c[:cut] if cut else None)
        assert (got == want[cut:]).all(), cut


def test_token_map():
    cfg = ([4, 6], 5000, 4, 3, 40)
    rng = np.random.default_rng(7)
    lay, ref = make(cfg)
    token_map = rng.integers(0, 40, size=300, dtype=np.int64)
    raw = rng.integers(0, 300, size=50)
    raw[rng.random(50) < 0.2] = -1
    c = np.where(raw < 0, -1, token_map[np.maximum(raw, 0)])
    want = ref_hash(c.tolist(), 0, *ref)
    h = es.NgramHasher(lay, token_map)
    assert (h.hash(raw) == want).all()
    assert (es.NgramHasher(lay, token_map.astype(np.int32)).hash(raw.astype(np.int32)) == want).all()
    # A raw token outside the map; nothing written.
    bad = raw.copy()
    bad[17] = 300
    out = np.full(want.shape, 7, np.int64)
    with pytest.raises(es.BadIdError, match=r"tokens\[17\] = 300.*map"):
        h.hash(bad, out=out)
    assert (out == 7).all()
    with pytest.raises(ValueError, match=r"token_map\[3\] = 40"):
        es.NgramHasher(lay, np.array([0, 1, 2, 40]))
    with pytest.raises(TypeError, match="token_map"):
        es.NgramHasher(lay, np.array([0.5]))


def test_hash_batch():
    cfg = ([2, 9], 700, 3, 4, 25)
    rng = np.random.default_rng(11)
    lay, ref = make(cfg)
    h = es.NgramHasher(lay)
    full = [stream(rng, n, 25) for n in (12, 1, 30, 0, 8)]
    cuts = [0, 0, 17, 0, 5]
    reqs = [f[k:] for f, k in zip(full, cuts)]
    hists = [f[:k] if k else None for f, k in zip(full, cuts)]
    got = h.hash_batch(reqs, hists)
    want = np.concatenate([ref_hash(f.tolist(), k, *ref) for f, k in zip(full, cuts)])
    assert got.shape == want.shape and (got == want).all()
    got = h.hash_batch(reqs, hists, layer=9, local=True)
    want = np.concatenate([ref_hash(f.tolist(), k, *ref, local=True)[:, 1]
                           for f, k in zip(full, cuts)])
    assert (got == want).all()
    assert h.hash_batch([reqs[0]]).shape == (12, 2, 8)
    assert h.hash_batch([]).shape == (0, 2, 8)
    bad = [r.copy() for r in reqs]
    bad[2][3] = 25
    with pytest.raises(es.BadIdError, match=r"tokens\[16\] = 25 \(request 2\)"):
        h.hash_batch(bad, hists)
    with pytest.raises(ValueError, match="histories"):
        h.hash_batch(reqs, hists[:2])


def test_bad_arguments():
    lay = es.NgramLayout(layer_ids=[1], vocab_size=100, max_ngram=3, heads=2,
                         compressed_vocab=10, pad_id=0)
    h = es.NgramHasher(lay)
    t = np.array([1, 2, 3], np.int64)
    for kw, exc, text in [
        ({"out": np.zeros((3, 1, 3), np.int64)}, ValueError, r"shape \(3, 1, 4\)"),
        ({"out": np.zeros((3, 1, 4), np.float64)}, TypeError, "int32 or int64"),
        ({"out": np.zeros((3, 1, 4), np.int64)[:, :, ::-1]}, ValueError, "contiguous"),
        ({"out": np.zeros((3, 4), np.int64)}, ValueError, "shape"),
        ({"layer": 2}, ValueError, "layer 2 is not one of"),
        ({"history": np.array([1], np.int32)}, TypeError, "history: expected int64"),
    ]:
        with pytest.raises(exc, match=text):
            h.hash(t, **kw)
    ro = np.zeros((3, 1, 4), np.int64)
    ro.flags.writeable = False
    with pytest.raises((TypeError, ValueError), match="out"):
        h.hash(t, out=ro)
    with pytest.raises(TypeError, match="tokens"):
        h.hash(np.array([1.0, 2.0]))
    with pytest.raises(es.BadIdError, match=r"tokens\[1\] = 10 is not a compressed id"):
        h.hash(np.array([1, 10]))
    with pytest.raises(es.BadIdError, match=r"tokens\[0\] = -2"):
        h.hash(np.array([-2]))
    with pytest.raises(es.BadIdError, match=r"history\[0\] = 11"):
        h.hash(t, history=np.array([11, 1]))
    with pytest.raises(TypeError, match="layout"):
        es.NgramHasher("not a layout")
    base = dict(layer_ids=[1], vocab_size=100, max_ngram=3, heads=2, compressed_vocab=10,
                pad_id=0)
    for change, text in [({"max_ngram": 1}, "max_ngram"), ({"heads": 0}, "heads"),
                         ({"pad_id": 10}, "pad_id 10"), ({"layer_ids": []}, "num_layers"),
                         ({"layer_ids": [-1]}, "layer_ids"), ({"compressed_vocab": 0}, "compressed"),
                         ({"vocab_size": 1}, "vocab_size"),
                         ({"primes": [5, 7, 11]}, "primes: expected"),
                         ({"primes": [5, 7, 0, 3]}, r"primes\[2\] = 0"),
                         ({"multipliers": [1, 2]}, "multipliers: expected"),
                         ({"multipliers": [1, 2, 0]}, r"multipliers\[2\] = 0"),
                         ({"pad_id": -1}, "pad_id")]:
        with pytest.raises(ValueError, match=text):
            es.NgramLayout(**{**base, **change})
    with pytest.raises(TypeError, match="missing required keyword argument 'heads'"):
        es._engram.NgramLayout(layer_ids=[1], vocab_size=100, max_ngram=3,
                               compressed_vocab=10, pad_id=0)


def test_explicit_primes_and_multipliers():
    lay = es.NgramLayout(layer_ids=[9], vocab_size=2, max_ngram=3, heads=1,
                         compressed_vocab=10, pad_id=0, primes=[[7, 1]],
                         multipliers=np.array([[1, 3, 5]]))
    assert lay.primes.tolist() == [[7, 1]] and lay.num_rows == (8,)
    ids = es.NgramHasher(lay).hash(np.array([4, -1, 2]))
    assert ids.reshape(-1).tolist() == [4, 7, 0, 7, 2, 7]


def test_from_config(tmp_path):
    fields = {"engram_layer_ids": [1, 14], "engram_vocab_size": [16_000_000] * 3,
              "engram_max_ngram_size": 4, "engram_n_head_per_ngram": 8,
              "engram_compressed_vocab_size": 99_092, "engram_pad_id": 2}
    lay = es.NgramLayout.from_config({"text_config": fields, "model_type": "x"})
    assert lay.num_rows == (384_006_168, 384_016_682)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(fields))
    assert es.NgramLayout.from_config(p).num_rows == lay.num_rows
    assert es.NgramLayout.from_config(str(p), layer_ids=[1]).num_rows == (384_006_168,)
    short = {k: v for k, v in fields.items() if k != "engram_pad_id"}
    with pytest.raises(ValueError, match="engram_pad_id"):
        es.NgramLayout.from_config(short)
    assert es.NgramLayout.from_config(short, pad_id=2).pad_id == 2
    with pytest.raises(ValueError, match="different sizes"):
        es.NgramLayout.from_config({**fields, "engram_vocab_size": [1, 2]})
    with pytest.raises(TypeError, match="unexpected keyword"):
        es.NgramLayout.from_config(fields, nonsense=1)


# ---- build_token_map -------------------------------------------------------

def ref_key(text: str, raw: str) -> str:
    if "\ufffd" in text:
        return raw
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(ch for ch in s if unicodedata.category(ch) != "Mn").lower()
    out, space = [], False
    for ch in s:
        if ch in " \t\r\n":
            if not space:
                out.append(" ")
            space = True
        else:
            out.append(ch)
            space = False
    s = "".join(out)
    s = " " if s == " " else s.strip(" ")
    return s or text


def test_build_token_map():
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import decoders, models

    # Byte-level tokens (GPT-2's alphabet: Ġ is a space, Ã the byte 0xC3,
    # which alone is not UTF-8 and decodes to U+FFFD).
    vocab = ["<pad>", "Hello", "hello", "Ġhello", "HÃ©llo", "ï¼¨ï¼¥ï¼¬ï¼¬ï¼¯", "Ġ", "ĠĠ",
             "ĉ", "Ã", "Ã©", "Ġthe", "The", "Ċ", "ĠĉĠ", "!", "Ã¤", "a"]
    tok = tokenizers.Tokenizer(models.BPE({t: i for i, t in enumerate(vocab)}, []))
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|end|>"])
    texts = [tok.decode([i], skip_special_tokens=False) for i in range(len(vocab) + 1)]
    assert texts[9] == "\ufffd" and texts[5] == "ＨＥＬＬＯ" and texts[3] == " hello"
    keys: dict[str, int] = {}
    want = [keys.setdefault(ref_key(t, tok.id_to_token(i)), len(keys))
            for i, t in enumerate(texts)]
    got = es.build_token_map(tok)
    assert got.dtype == np.int64 and got.tolist() == want
    # hello, Hello, " hello", HÉllo, ＨＥＬＬＯ are one; " " and "  " one; the and The one.
    assert len(set(got[[1, 2, 3, 4, 5]].tolist())) == 1
    assert got[6] == got[7] and got[11] == got[12] and got[9] != got[10]
    assert es.build_token_map(tok, compressed_vocab=len(keys)).tolist() == want
    with pytest.raises(ValueError, match="compresses to"):
        es.build_token_map(tok, compressed_vocab=len(keys) + 1)
    # The map feeds a hasher.
    lay = es.NgramLayout(layer_ids=[1], vocab_size=1000, max_ngram=3, heads=2,
                         compressed_vocab=len(keys), pad_id=int(got[0]))
    es.NgramHasher(lay, got).hash(np.arange(len(texts)))


# ---- bad inputs: each refused with an error that names it ---------------------

def small():
    lay = es.NgramLayout(layer_ids=[1], vocab_size=100, max_ngram=3, heads=2,
                         compressed_vocab=10, pad_id=0)
    return lay, es.NgramHasher(lay)


@pytest.mark.parametrize("tokens, exc, text", [
    (np.array([1, 2], np.uint64), TypeError, "tokens: expected int32 or int64, got uint64"),
    (np.array([1, 2], np.uint32), TypeError, "tokens: expected int32 or int64, got uint32"),
    (np.array([1, 2], np.int16), TypeError, "tokens: expected int32 or int64, got int16"),
    (np.array([True, False]), TypeError, "tokens: expected int32 or int64, got bool"),
    (np.array([1, 2], object), TypeError, "tokens: expected int32 or int64"),
    (np.array([1, 2], np.float32), TypeError, "tokens: expected int32 or int64, got float32"),
    (np.array([[1, 2]]), ValueError, r"tokens: expected a contiguous 1-D array, got shape \(1, 2\)"),
    (np.arange(8)[::2], ValueError, r"tokens: expected a contiguous 1-D array, got shape \(4,\)"),
])
def test_bad_token_arrays(tokens, exc, text):
    _, h = small()
    out = np.full((len(tokens), 1, 4), 7, np.int64)
    with pytest.raises(exc, match=text):
        h.hash(tokens, out=out)
    assert (out == 7).all()
    if tokens.ndim != 1:
        with pytest.raises(ValueError, match=r"requests\[0\]: expected a contiguous 1-D array"):
            h.hash_batch([tokens, tokens])
    elif tokens.flags.c_contiguous:
        with pytest.raises(exc, match=text):
            h.hash_batch([tokens, tokens])
    else:  # a batch is copied together: strides are fine there
        want = h.hash(np.ascontiguousarray(tokens))
        assert (h.hash_batch([tokens, tokens]) == np.concatenate([want, want])).all()


def test_tokens_at_the_ends_of_their_types():
    _, h = small()
    out = np.full((2, 1, 4), 7, np.int64)
    for bad, dtype in [(2**63 - 1, np.int64), (-2**63, np.int64), (2**31 - 1, np.int32),
                       (-2**31, np.int32), (-2, np.int32)]:
        with pytest.raises(es.BadIdError, match=rf"tokens\[1\] = {bad} is not a compressed id"):
            h.hash(np.array([3, bad], dtype), out=out)
        assert (out == 7).all()
    with pytest.raises(es.BadIdError, match=rf"history\[0\] = {-2**63}"):
        h.hash(np.array([3]), history=np.array([-2**63, 1]))


def test_empty_inputs():
    lay, h = small()
    for dtype in (np.int32, np.int64):
        got = h.hash(np.zeros(0, dtype))
        assert got.shape == (0, 1, 4)
        assert h.hash(np.zeros(0, dtype), history=np.array([1, 2], dtype)).shape == (0, 1, 4)
        assert h.hash(np.zeros(0, dtype), layer=1).shape == (0, 4)
    assert h.hash([]).shape == (0, 1, 4)
    assert h.hash_batch([np.zeros(0, np.int64)] * 3).shape == (0, 1, 4)
    # An empty request among others, and an empty history.
    want = h.hash(np.array([4, 5]))
    got = h.hash_batch([np.zeros(0, np.int64), np.array([4, 5]), np.zeros(0, np.int64)],
                       [None, np.zeros(0, np.int64), None])
    assert (got == want).all()


def test_bad_token_maps():
    lay, _ = small()
    for m, exc, text in [
        (np.array([0, 1], np.uint64), TypeError, "token_map: expected a 1-D int32 or int64 array, got uint64"),
        (np.array([True]), TypeError, "token_map: .* got bool"),
        (np.array([1], object), TypeError, "token_map: expected a 1-D int32 or int64"),
        (np.array([0, 1], np.int16), TypeError, "token_map: .* got int16"),
        (np.zeros((2, 2), np.int64), TypeError, "token_map: .* with 2 dimensions"),
        (np.array(1), TypeError, "token_map: .* with 0 dimensions"),
        (np.zeros(0, np.int64), ValueError, "token_map: empty"),
        (np.array([0, -1]), ValueError, r"token_map\[1\] = -1 is not a compressed id"),
        (np.array([0, 10], np.int32), ValueError, r"token_map\[1\] = 10 is not a compressed id"),
        (np.array([0, 2**40]), ValueError, r"token_map\[1\] = 1099511627776"),
        ([0, 1, 2], TypeError, "token_map: expected an array, got a Python list"),
        ("0123", TypeError, "token_map"),
    ]:
        with pytest.raises(exc, match=text):
            es.NgramHasher(lay, m)
    # A map with strides is read through them.
    strided = np.arange(20, dtype=np.int64)[::2] % 10
    raw = np.array([0, 3, -1, 9, 4])
    want = es.NgramHasher(lay).hash(np.where(raw < 0, -1, strided[np.maximum(raw, 0)]))
    assert (es.NgramHasher(lay, strided).hash(raw) == want).all()
    # A raw token at the end of the map, and one just past it.
    h = es.NgramHasher(lay, strided)
    h.hash(np.array([9]))
    with pytest.raises(es.BadIdError, match=r"tokens\[0\] = 10 is not a token of the map"):
        h.hash(np.array([10]))


def test_bad_outputs():
    lay, h = small()
    t = np.array([1, 2, 3])
    for out, exc, text in [
        (np.zeros((3, 1, 4), np.int16), TypeError, "out: expected int32 or int64, got int16"),
        (np.zeros((3, 1, 4), np.uint64), TypeError, "out: expected int32 or int64, got uint64"),
        (np.zeros((3, 1, 4), bool), TypeError, "out: expected int32 or int64, got bool"),
        (np.zeros((2, 1, 4), np.int64), ValueError, r"out: expected .* shape \(3, 1, 4\), got \(2, 1, 4\)"),
        (np.zeros((4, 1, 4), np.int64), ValueError, r"shape \(3, 1, 4\), got \(4, 1, 4\)"),
        (np.zeros(12, np.int64), ValueError, r"shape \(3, 1, 4\), got \(12,\)"),
        (bytes(96), ValueError, "out: the array is read-only"),
        ([0] * 12, TypeError, "out: expected an array, got a Python list"),
    ]:
        with pytest.raises(exc, match=text):
            h.hash(t, out=out)
    # One layer: [T, C].
    with pytest.raises(ValueError, match=r"shape \(3, 4\), got \(3, 1, 4\)"):
        h.hash(t, out=np.zeros((3, 1, 4), np.int64), layer=1)
    # int32 ids that cannot hold the layout's rows; local ids fit.
    big = es.NgramLayout(layer_ids=[1], vocab_size=2, max_ngram=2, heads=2, compressed_vocab=10,
                         pad_id=0, primes=[2**31, 5])
    hb = es.NgramHasher(big)
    out = np.full((3, 1, 2), 7, np.int32)
    with pytest.raises(ValueError, match="do not fit int32 output: use int64"):
        hb.hash(t, out=out)
    assert (out == 7).all()
    hb.hash(t, out=out, local=True)
    assert (out[..., 1] < 5).all()


@pytest.mark.parametrize("change, exc, text", [
    ({"vocab_size": 2**64}, ValueError, r"vocab_size: expected an int in \[0, 18446744073709551615\]"),
    ({"vocab_size": -1}, ValueError, "vocab_size: expected an int in"),
    ({"vocab_size": 2**62}, ValueError, "vocab_size 4611686018427387904 is not in 2..2\\^61"),
    ({"vocab_size": 1.5}, TypeError, "vocab_size: expected an int, got float"),
    ({"vocab_size": "100"}, TypeError, "vocab_size: expected an int, got str"),
    ({"compressed_vocab": 2**62 + 1}, ValueError, "compressed_vocab 4611686018427387905 is not in 1..2\\^62"),
    ({"compressed_vocab": -5}, ValueError, "compressed_vocab: expected an int in"),
    ({"max_ngram": 2**32}, ValueError, "max_ngram: expected an int in"),
    ({"max_ngram": 17}, ValueError, "max_ngram 17 is not in 2..16"),
    ({"heads": 2**32 + 2}, ValueError, "heads: expected an int in"),
    ({"heads": 2000}, ValueError, "heads 2000: .* must be in 1..1024"),
    ({"heads": None}, TypeError, "heads: expected an int, got NoneType"),
    ({"layer_ids": [2**63]}, ValueError, r"layer_ids\[0\]: 9223372036854775808 does not fit int64"),
    ({"layer_ids": [10**16]}, ValueError, r"layer_ids\[0\] = 10000000000000000 is negative or too large"),
    ({"layer_ids": list(range(257))}, ValueError, "num_layers 257 is not in 1..256"),
    ({"pad_id": 2**64}, ValueError, "pad_id: expected an int in"),
    ({"pad_id": 1.0}, TypeError, "pad_id: expected an int, got float"),
    ({"primes": [2**64, 1, 1, 1]}, ValueError, r"primes\[0\]: 18446744073709551616 does not fit uint64"),
    ({"primes": [-1, 1, 1, 1]}, ValueError, r"primes\[0\]: -1 does not fit uint64"),
    ({"primes": [2**62 + 1, 1, 1, 1]}, ValueError, r"primes\[0\] = 4611686018427387905 is not in 1..2\^62"),
    ({"primes": [2**61, 2**61, 1, 1]}, ValueError, "add up past 2\\^62"),
    ({"multipliers": [-1, 1, 1]}, ValueError, r"multipliers\[0\] = -1 is not in 1\.\."),
    ({"multipliers": [2**63, 1, 1]}, ValueError, r"multipliers\[0\]: 9223372036854775808 does not fit int64"),
    ({"multipliers": [[1, 1, 1], [1, 1, 1]]}, ValueError, "multipliers: expected num_layers \\* max_ngram = 3"),
])
def test_bad_layout_values(change, exc, text):
    base = dict(layer_ids=[1], vocab_size=100, max_ngram=3, heads=2, compressed_vocab=10,
                pad_id=0)
    with pytest.raises(exc, match=text):
        es.NgramLayout(**{**base, **change})


def test_bad_configs(tmp_path):
    fields = {"engram_layer_ids": [1, 14], "engram_vocab_size": 1000, "engram_max_ngram_size": 3,
              "engram_n_head_per_ngram": 2, "engram_compressed_vocab_size": 50,
              "engram_pad_id": 2}
    with pytest.raises(FileNotFoundError):
        es.NgramLayout.from_config(tmp_path / "missing.json")
    with pytest.raises(IsADirectoryError):
        es.NgramLayout.from_config(tmp_path)
    for text, exc, match in [("{nope", json.JSONDecodeError, "Expecting property name"),
                             ("", json.JSONDecodeError, "Expecting value"),
                             ("[1, 2]", ValueError, "not a JSON object"),
                             ("null", ValueError, "not a JSON object")]:
        p = tmp_path / "c.json"
        p.write_text(text)
        with pytest.raises(exc, match=match):
            es.NgramLayout.from_config(p)
    for key, value, exc, match in [
        ("engram_max_ngram_size", "3", TypeError, "max_ngram: expected an int, got str"),
        ("engram_max_ngram_size", 3.5, TypeError, "max_ngram: expected an int, got float"),
        ("engram_n_head_per_ngram", -3, ValueError, "heads: expected an int in"),
        ("engram_n_head_per_ngram", 0, ValueError, "heads 0"),
        ("engram_vocab_size", 2**70, ValueError, "vocab_size: expected an int in"),
        ("engram_vocab_size", [], ValueError, "engram_vocab_size \\[\\] holds different sizes"),
        ("engram_compressed_vocab_size", 0, ValueError, "compressed_vocab 0"),
        ("engram_pad_id", None, ValueError, "no engram_pad_id"),
        ("engram_pad_id", 50, ValueError, "pad_id 50 is not a compressed id"),
        ("engram_layer_ids", [], ValueError, "num_layers 0"),
        ("engram_layer_ids", [-1], ValueError, r"layer_ids\[0\] = -1"),
    ]:
        with pytest.raises(exc, match=match):
            es.NgramLayout.from_config({**fields, key: value})
        with pytest.raises(exc, match=match):
            es.NgramLayout.from_config({"text_config": {**fields, key: value}})


def test_token_lists_hold_ints_only():
    """A list of tokens becomes int64 only when it holds ints: floats and
    bools are refused, as they are in an array, not truncated ([1.5, 2.7]
    used to hash as [1, 2])."""
    _, h = small()
    for bad in ([1.5, 2.7], [1.0], [True, False], (3, 0.5)):
        with pytest.raises(TypeError, match="tokens: expected int token ids"):
            h.hash(bad)
        with pytest.raises(TypeError, match="history: expected int token ids"):
            h.hash([1], history=bad)
    with pytest.raises(OverflowError, match="tokens: "):
        h.hash([2**63])
    assert (h.hash([1, 2]) == h.hash(np.array([1, 2]))).all()
    assert (h.hash((1, 2), history=[3]) == h.hash(np.array([1, 2]), history=np.array([3]))).all()


def test_batch_histories_keep_their_values():
    """A batch's histories are taken in the requests' dtype only when that
    keeps every value: floats, uint64 and ints that int32 would change are
    refused (they used to be cast: 1.9 hashed as 1, 2**32 + 4 as 4, the
    uint64 2**64 - 1 as -1, which is DEAD)."""
    _, h = small()
    reqs = [np.array([1, 2]), np.array([3])]
    for hist, exc, text in [
        ([np.array([1.9]), None], TypeError, r"histories\[0\]: expected int32 or int64 token ids, got float64"),
        ([[1.9], None], TypeError, r"histories\[0\]: expected int token ids"),
        ([None, np.array([2**64 - 1], np.uint64)], TypeError, r"histories\[1\]: .* got uint64"),
        ([None, np.array([True])], TypeError, r"histories\[1\]: .* got bool"),
    ]:
        with pytest.raises(exc, match=text):
            h.hash_batch(reqs, hist)
    want = h.hash_batch(reqs, [np.array([4]), None])
    r32 = [r.astype(np.int32) for r in reqs]
    assert (h.hash_batch(r32, [np.array([4]), None]) == want).all()
    assert (h.hash_batch(r32, [[4], None]) == want).all()
    assert (h.hash_batch(reqs, [np.array([4], np.int32), None]) == want).all()
    with pytest.raises(ValueError, match=r"histories\[0\]: a token id does not fit int32"):
        h.hash_batch(r32, [np.array([2**32 + 4]), None])


def test_layout_ints_are_not_truncated():
    """layer_ids, primes and multipliers are ints: a float among them is
    refused naming it, in a list or an array (int() made layer 1.5 layer 1
    and prime 7.5 prime 7).  Arrays of ints and any sequence still serve."""
    base = dict(layer_ids=[1], vocab_size=100, max_ngram=3, heads=2, compressed_vocab=10,
                pad_id=0)
    for change, text in [({"layer_ids": [1.5]}, r"layer_ids\[0\]: expected an int, got float"),
                         ({"layer_ids": np.array([1.0])}, r"layer_ids\[0\]: expected an int"),
                         ({"layer_ids": "1,14"}, r"layer_ids\[0\]: expected an int, got str"),
                         ({"layer_ids": 3}, "layer_ids: expected a sequence of ints, got int"),
                         ({"primes": [[7.5, 5], [3, 2]]}, r"primes\[0\]: expected an int, got float"),
                         ({"primes": np.array([[7, 5, 3, 2.5]])}, r"primes\[0\]: expected an int, got float"),
                         ({"primes": "abcd"}, r"primes\[0\]: expected an int, got str"),
                         ({"multipliers": np.array([1.0, 3.0, 5.0])}, r"multipliers\[0\]: expected an int")]:
        with pytest.raises(TypeError, match=text):
            es.NgramLayout(**{**base, **change})
    with pytest.raises(TypeError, match=r"layer_ids\[1\]: expected an int, got float"):
        es.NgramLayout.from_config({"engram_layer_ids": [1, 14.5], "engram_vocab_size": 100,
                                    "engram_max_ngram_size": 3, "engram_n_head_per_ngram": 2,
                                    "engram_compressed_vocab_size": 10, "engram_pad_id": 0})
    ref = es.NgramLayout(**{**base, "layer_ids": [1, 14], "primes": [[7, 5, 3, 2], [11, 13, 17, 19]],
                            "multipliers": [[1, 3, 5], [7, 9, 11]]})
    for lids, primes, mults in [(np.array([1, 14]), np.array([[7, 5, 3, 2], [11, 13, 17, 19]]),
                                 np.array([[1, 3, 5], [7, 9, 11]], np.uint64)),
                                (range(1, 15, 13), ((7, 5, 3, 2), (11, 13, 17, 19)), [1, 3, 5, 7, 9, 11])]:
        lay = es.NgramLayout(**{**base, "layer_ids": lids, "primes": primes, "multipliers": mults})
        assert lay.layer_ids == (1, 14)
        assert lay.primes.tolist() == ref.primes.tolist()
        assert lay.multipliers.tolist() == ref.multipliers.tolist()


def test_tokens_that_are_no_vector():
    """The length of the tokens sizes the output before the C side sees
    them: a scalar, a 0-d array or a 0-d request is refused naming it (it
    failed with len()'s "len() of unsized object")."""
    _, h = small()
    for call, exc, text in [
        (lambda: h.hash(np.array(3)), ValueError, r"tokens: expected a contiguous 1-D array, got shape \(\)"),
        (lambda: h.hash(3), TypeError, "tokens: expected a 1-D array of token ids, got int"),
        (lambda: h.hash(np.array([3]), history=np.array(3)), ValueError, r"history: .* got shape \(\)"),
        (lambda: h.hash_batch([np.array([1]), np.array(3)]), ValueError, r"requests\[1\]: .* got shape \(\)"),
        (lambda: h.hash_batch([np.array([1]), [[3]]]), ValueError, r"requests\[1\]: .* got shape \(1, 1\)"),
        (lambda: h.hash_batch([[1.5], [3]]), TypeError, r"requests\[0\]: expected int token ids"),
    ]:
        with pytest.raises(exc, match=text):
            call()
    # Lists and memoryviews of tokens still serve.
    want = h.hash(np.array([1, 2, 3]))
    assert (h.hash_batch([[1, 2], [3]], [None, [1, 2]]) == want).all()
    assert (h.hash(memoryview(np.array([1, 2, 3]))) == want).all()


def test_threads_is_a_count():
    """threads is 0 or a count: a negative or oversized one is refused (it
    was taken modulo 2**32: -1 asked for 2**32 - 1 threads, which ran 8,
    and 2**40 for 0, automatic)."""
    _, h = small()
    t = np.arange(5)
    for call in (lambda th: h.hash(t, threads=th), lambda th: h.hash_batch([t, t], threads=th)):
        with pytest.raises(ValueError, match="threads: expected 0 .* got -1"):
            call(-1)
        for big in (2**31, 2**40):
            with pytest.raises(OverflowError):
                call(big)
        with pytest.raises(TypeError):
            call(1.5)
    want = h.hash(t)
    for th in (0, 1, 3, 2**31 - 1):
        assert (h.hash(t, threads=th) == want).all()
