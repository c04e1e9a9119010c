"""Checkpoints through the CLI: `engram import --layers` on a generated
two-shard DeepSeek-style checkpoint (per-layer [N, 256] F8_E4M3 weight and
[N, 8] F8_E8M0 scale tensors, found through model.safetensors.index.json),
read back through the layer API's lookup_into and compared byte for byte;
the row ranges tables record (layer heads, TP shards of --rows, tables
served from a checkpoint); `engram inspect`; and the bad inputs (a missing
or mistyped tensor, a wrong shape, head sizes that do not add up, tables
that exist, a shard swapped during the import).

The safetensors files are written byte by byte here (8-byte header length,
JSON header, data), so the test needs no torch or safetensors package.  The
`engram` binary is $ENGRAM_BIN, or build/release/engram of this tree."""
from __future__ import annotations

import json
import os
import subprocess

import numpy as np
import pytest

import engramstore

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.join(HERE, "..", "..", "build", "release")
ENGRAM = os.environ.get("ENGRAM_BIN") or os.path.join(BUILD, "engram")
SHIM = os.environ.get("ENGRAM_SWAP_SHIM") or os.path.join(BUILD, "libswap_open.so")

if not os.environ.get("ENGRAM_BIN") and not os.access(ENGRAM, os.X_OK):
    pytest.skip(f"no engram binary at {ENGRAM} (build the tree, or set ENGRAM_BIN)",
                allow_module_level=True)

VOCAB = [17, 19, 23]             # head sizes of every layer: N = 59
N = sum(VOCAB)
LAYERS = (1, 14)
W, S = 256, 8


def write_safetensors(path, tensors):
    """tensors: {name: (dtype, uint8 array of the bytes, shape)}, in file order."""
    header, blobs, at = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, data, shape) in tensors.items():
        b = np.ascontiguousarray(data).tobytes()
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(b)]}
        blobs.append(b)
        at += len(b)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def planes(layer):
    """The weight [N, 256] and scale [N, 8] bytes of a layer."""
    rng = np.random.default_rng(1000 + layer)
    return (rng.integers(0, 256, (N, W), dtype=np.uint8),
            rng.integers(0, 256, (N, S), dtype=np.uint8))


def make_checkpoint(d, *, scale_name="scale", w14_rows=N, s14_rows=N):
    """Two shards: shard 1 holds layer 1's weight and layer 14's scale,
    shard 2 layer 14's weight, layer 1's scale and an unrelated tensor;
    the index maps each tensor to its shard.  Returns the index's path."""
    w1, s1 = planes(1)
    w14, s14 = planes(14)
    w14 = np.resize(w14, (w14_rows, W))
    s14 = np.resize(s14, (s14_rows, S))
    shards = {
        "model-00001-of-00002.safetensors": {
            "model.layers.1.engram.weight": ("F8_E4M3", w1, w1.shape),
            f"model.layers.14.engram.{scale_name}": ("F8_E8M0", s14, s14.shape),
        },
        "model-00002-of-00002.safetensors": {
            "model.embed_tokens.weight": ("BF16", np.arange(12, dtype=np.uint8), (2, 3)),
            "model.layers.14.engram.weight": ("F8_E4M3", w14, w14.shape),
            "model.layers.1.engram.scale": ("F8_E8M0", s1, s1.shape),
        },
    }
    weight_map = {}
    for shard, tensors in shards.items():
        write_safetensors(os.path.join(d, shard), tensors)
        weight_map.update({name: shard for name in tensors})
    index = os.path.join(d, "model.safetensors.index.json")
    with open(index, "w") as f:
        json.dump({"metadata": {"total_size": 0}, "weight_map": weight_map}, f)
    return index


def engram(root, *args, env=None):
    return subprocess.run([ENGRAM, "--root", root, "--ns", "model-x", *args],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def import_layers(root, index, *extra, env=None):
    return engram(root, "import", "--layers", "--safetensors", index,
                  "--head-vocab", ",".join(map(str, VOCAB)), *extra, env=env)


def tables(root):
    """The namespace's tables; none when it was never made (ls fails then)."""
    r = engram(root, "ls", "--json")
    if r.returncode == 1 and "does not exist" in r.stderr:
        return []
    assert r.returncode == 0, r.stderr
    return sorted(t["name"] for t in json.loads(r.stdout)["tables"])


@pytest.fixture
def ckpt(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    return make_checkpoint(str(d))


def test_import_layers_end_to_end(tmp_path, ckpt, local_dir):
    r = import_layers(local_dir, ckpt)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"importing 2 layers x 3 heads from {ckpt} into namespace 'model-x'"
    assert lines[1] == ("[1/6] engram:l1:h0: 17 rows of 264 bytes, rows 0..16 of layer 1, "
                        "verified")
    assert lines[6] == ("[6/6] engram:l14:h2: 23 rows of 264 bytes, rows 36..58 of layer 14, "
                        "verified")
    assert lines[-1].startswith("imported 6 tables (layers 1, 14;")
    assert tables(local_dir) == sorted(f"engram:l{l}:h{h}" for l in LAYERS for h in range(3))

    # The layer API reads them: every row of every head, byte for byte,
    # and -1 keeps its output row.
    cfg = engramstore.EngramStoreConfig(VOCAB, W + S)
    with engramstore.LocalStore(local_dir, "model-x") as client:
        layers = engramstore.EngramStore({l: cfg for l in LAYERS}, store=client)
        rng = np.random.default_rng(7)
        for l in LAYERS:
            w, s = planes(l)
            packed = np.concatenate([w, s], axis=1)           # [N, 264]
            firsts = np.cumsum([0] + VOCAB[:-1])
            B, L = 4, 40
            row_ids = np.stack([rng.integers(0, n, (B, L)) for n in VOCAB], axis=2)
            row_ids[0, 0, :] = 0
            row_ids[0, 1, :] = np.array(VOCAB) - 1               # each head's last row
            row_ids[1, 2, 1] = -1
            row_ids = np.ascontiguousarray(row_ids, dtype=np.int64)
            out = np.full((B, L, 3, W + S), 0xA5, np.uint8)
            layers.lookup_into(l, row_ids, out)
            for h in range(3):
                ids = row_ids[:, :, h]
                live = ids != -1
                want = packed[firsts[h] + ids[live]]
                assert np.array_equal(out[:, :, h][live], want), (l, h)
            assert (out[1, 2, 1] == 0xA5).all()
        layers.close()

        # Each head records its range of the layer: global id g of the
        # layer's [N] rows is row g - row_start of the head.
        for l in LAYERS:
            for h, first in enumerate(np.cumsum([0] + VOCAB[:-1])):
                spec = client.get_table_spec(f"engram:l{l}:h{h}")
                assert (spec["row_start"], spec["total_rows"]) == (first, N)
                assert (spec["num_rows"], spec["row_bytes"]) == (VOCAB[h], W + S)
        # The table API with offsets = row_start takes the layer's global ids.
        w, s = planes(14)
        names = [f"engram:l14:h{h}" for h in range(3)]
        offsets = np.array([client.get_table_spec(n)["row_start"] for n in names], np.int64)
        gids = np.array([[0, 17, 36], [16, 35, 58]], np.int64)
        out = np.zeros((2, 3, W + S), np.uint8)
        client.lookup(names, gids, out, offsets=offsets)
        assert np.array_equal(out, np.concatenate([w, s], axis=1)[gids])
        with pytest.raises(engramstore.BadIdError):   # a global id of another head
            client.lookup(names, np.array([[17, 17, 36]], np.int64), out[:1], offsets=offsets)

    r = engram(local_dir, "info", "engram:l14:h2", "--json")
    info = json.loads(r.stdout)
    assert (info["row_start"], info["total_rows"], info["num_rows"]) == (36, N, 23)
    r = engram(local_dir, "info", "engram:l14:h2")
    assert ("row_range         rows 36..58 of 59 (global id = row + 36: look up with "
            "--offset 36)") in r.stdout.splitlines()
    r = engram(local_dir, "lookup", "engram:l14:h2", "36", "--offset", "36")
    w, s = planes(14)
    assert r.stdout.split()[1:] == [f"{b:02x}" for b in np.concatenate([w[36], s[36]])]

    # Importing again: the names exist, nothing is touched.
    r = import_layers(local_dir, ckpt)
    assert r.returncode == 1
    assert "table 'engram:l1:h0' already exists in namespace 'model-x'" in r.stderr
    assert "nothing was imported" in r.stderr


def test_import_layers_selected_and_patterns(tmp_path, local_dir):
    """Other tensor names (patterns with {L}), one layer only, a pitch."""
    d = tmp_path / "ck"
    d.mkdir()
    index = make_checkpoint(str(d), scale_name="scale_inv")   # layer 14's scale only
    args = ["--weight", "model.layers.{L}.engram.weight",
            "--scale", "model.layers.{L}.engram.scale_inv", "--pitch", "272"]
    r = import_layers(local_dir, index, *args)
    assert r.returncode == 1
    assert ("layer 1: '%s' has no scale tensor 'model.layers.1.engram.scale_inv' (did you "
            "mean 'model.layers.14.engram.scale_inv'?)" % index) in r.stderr
    assert tables(local_dir) == []
    r = import_layers(local_dir, index, *args, "--layer-ids", "14")
    assert r.returncode == 0, r.stderr
    assert tables(local_dir) == ["engram:l14:h0", "engram:l14:h1", "engram:l14:h2"]
    info = json.loads(engram(local_dir, "info", "engram:l14:h1", "--json").stdout)
    assert (info["row_pitch"], info["row_start"], info["total_rows"]) == (272, 17, N)
    w, s = planes(14)
    r = engram(local_dir, "lookup", "engram:l14:h1", "0", "18")
    assert r.stdout.splitlines() == [
        f"{i}: " + " ".join(f"{b:02x}" for b in np.concatenate([w[17 + i], s[17 + i]]))
        for i in (0, 18)]


def test_import_layers_bad_inputs(tmp_path, ckpt, local_dir):
    def fails(*args, index=ckpt, vocab=None):
        a = ["import", "--layers", "--safetensors", index,
             "--head-vocab", ",".join(map(str, VOCAB)) if vocab is None else vocab, *args]
        r = engram(local_dir, *a)
        assert r.returncode != 0, r.stdout
        assert tables(local_dir) == []          # nothing written
        return r

    # Head sizes that do not add up to N.
    r = fails(vocab="17,19,22")
    assert r.returncode == 1
    assert ("layer 1: the 3 head sizes of --head-vocab add up to 58 rows, but "
            "'model.layers.1.engram.weight' has 59 (shape [59, 256] F8_E4M3)") in r.stderr
    # A layer that is not there, with the closest name.
    r = fails("--layer-ids", "1,2")
    assert ("layer 2: '%s' has no tensor 'model.layers.2.engram.weight' (did you mean "
            "'model.layers.1.engram.weight'?)" % ckpt) in r.stderr
    # A mistyped pattern: no layer found, the pattern that would match.
    r = fails("--weight", "model.layers.{L}.engram.wieght")
    assert ("no tensor of '%s' matches --weight 'model.layers.{L}.engram.wieght' (did you "
            "mean --weight 'model.layers.{L}.engram.weight'?)" % ckpt) in r.stderr
    assert "engram inspect" in r.stderr
    r = fails("--scale", "model.layers.{L}.engram.scael")
    assert ("no scale tensor 'model.layers.1.engram.scael' (did you mean "
            "'model.layers.1.engram.scale'?)") in r.stderr
    # Usage errors: exit 2.
    for args, phrase in [(["--weight", "model.layers.engram.weight"], "exactly once"),
                         (["--weight", "a.{L}.{L}"], "exactly once"),
                         (["--rows", "0:5"], "--rows does not apply"),
                         (["--layer-ids", "1,x"], "--layer-ids"),
                         (["--layer-ids", "1,1"], "given twice")]:
        r = fails(*args)
        assert r.returncode == 2 and phrase in r.stderr, (args, r.stderr)
    for vocab in ["17,,19", "0,59", "-1,60", "17;42", ""]:
        r = fails(vocab=vocab)
        assert r.returncode == 2 and "--head-vocab" in r.stderr, (vocab, r.stderr)
    r = engram(local_dir, "import", "--layers", "--head-vocab", "59")
    assert r.returncode == 2 and "--layers needs --safetensors" in r.stderr
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt)
    assert r.returncode == 2 and "--layers needs --head-vocab" in r.stderr
    r = engram(local_dir, "import", "--head-vocab", "59", "t", "f.npy")
    assert r.returncode == 2 and "go with --layers" in r.stderr
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt, "--head-vocab", "59", "t")
    assert r.returncode == 2 and "unexpected argument 't'" in r.stderr
    r = engram(local_dir, "import")
    assert r.returncode == 2 and "missing arguments" in r.stderr

    # Shapes: a scale whose N differs from its weight, a weight that is 3-D.
    for kw, phrase in [({"s14_rows": N - 1},
                        "tensor 'model.layers.14.engram.scale' has shape [58, 8] F8_E8M0, but "
                        "'model.layers.14.engram.weight' has shape [59, 256] F8_E4M3"),
                       ({"w14_rows": N + 1, "s14_rows": N + 1},
                        "layer 14: the 3 head sizes of --head-vocab add up to 59 rows, but "
                        "'model.layers.14.engram.weight' has 60 (shape [60, 256] F8_E4M3)")]:
        d = tmp_path / f"bad{len(phrase)}"
        d.mkdir()
        r = fails(index=make_checkpoint(str(d), **kw))
        assert r.returncode == 1 and phrase in r.stderr, r.stderr
    d = tmp_path / "three-d"
    d.mkdir()
    w = np.zeros((N, 16, 16), np.uint8)
    write_safetensors(str(d / "m.safetensors"), {
        "model.layers.3.engram.weight": ("F8_E4M3", w, w.shape),
        "model.layers.3.engram.scale": ("F8_E8M0", np.zeros((N, 8), np.uint8), (N, 8))})
    r = fails(index=str(d / "m.safetensors"))
    assert ("tensor 'model.layers.3.engram.weight' has shape [59, 16, 16] F8_E4M3; expected "
            "[N, C]") in r.stderr


@pytest.mark.skipif(not os.path.exists(SHIM), reason=f"no swap_open shim at {SHIM}")
def test_import_layers_rolls_back(tmp_path, ckpt, local_dir):
    """A shard replaced after it was checked (its header now gives layer
    14's weight another shape): layer 1's tables, already published, are
    removed again, and the error says so."""
    d = tmp_path / "other"
    d.mkdir()
    make_checkpoint(str(d), w14_rows=N + 2, s14_rows=N + 2)
    shard2 = os.path.join(os.path.dirname(ckpt), "model-00002-of-00002.safetensors")
    env = {"LD_PRELOAD": SHIM, "ENGRAM_SWAP_PATH": shard2,
           "ENGRAM_SWAP_WITH": str(d / "model-00002-of-00002.safetensors")}
    r = import_layers(local_dir, ckpt, env=env)
    assert r.returncode == 1, r.stdout
    assert "[3/6] engram:l1:h2" in r.stdout       # layer 1 was imported
    assert "changed while it was being imported" in r.stderr
    assert "removed the 3 tables this import had published" in r.stderr
    assert tables(local_dir) == []


def test_inspect(tmp_path, ckpt, local_dir):
    r = engram(local_dir, "inspect", ckpt)
    assert r.returncode == 0, r.stderr
    rows = [line.split() for line in r.stdout.splitlines()]
    assert rows[0] == ["NAME", "DTYPE", "SHAPE", "SHARD"]
    assert rows[-1] == ["5", "tensors"]
    # Natural order: layers.1 before layers.14; shapes as the header says.
    names = [r[0] for r in rows[1:-1]]
    assert names == ["model.embed_tokens.weight", "model.layers.1.engram.scale",
                     "model.layers.1.engram.weight", "model.layers.14.engram.scale",
                     "model.layers.14.engram.weight"]
    assert rows[3] == ["model.layers.1.engram.weight", "F8_E4M3", "[59,", "256]",
                       "model-00001-of-00002.safetensors"]
    r = engram(local_dir, "inspect", ckpt, "--json")
    got = {t["name"]: t for t in json.loads(r.stdout)}
    assert got["model.layers.1.engram.scale"] == {
        "name": "model.layers.1.engram.scale", "dtype": "F8_E8M0", "shape": [N, 8],
        "nbytes": N * 8, "shard": "model-00002-of-00002.safetensors"}
    r = engram(local_dir, "inspect", os.path.join(os.path.dirname(ckpt),
                                                   "model-00001-of-00002.safetensors"))
    assert r.returncode == 0 and r.stdout.splitlines()[-1] == "2 tensors"
    r = engram(local_dir, "inspect", str(tmp_path / "nope.safetensors"))
    assert r.returncode == 1 and "does not exist" in r.stderr


def test_tp_shard_records_its_range(tmp_path, ckpt, local_dir):
    """import --safetensors --rows A:B records [A, B) of N in the table; the
    whole tensor records nothing and stays a version-1 file."""
    w, s = planes(1)
    r = engram(local_dir, "import", "--safetensors", ckpt, "--weight",
               "model.layers.1.engram.weight", "--scale", "model.layers.1.engram.scale",
               "--rows", "20:40", "rank1")
    assert r.returncode == 0, r.stderr
    assert "rows 20..39 of 59: global id = row + 20 (look up with offset 20)" in r.stdout
    r = engram(local_dir, "import", "--safetensors", ckpt, "--weight",
               "model.layers.1.engram.weight", "--rows", "0:", "whole")
    assert r.returncode == 0, r.stderr
    assert "global id" not in r.stdout
    info = json.loads(engram(local_dir, "info", "rank1", "--json").stdout)
    assert (info["num_rows"], info["row_start"], info["total_rows"]) == (20, 20, N)
    info = json.loads(engram(local_dir, "info", "whole", "--json").stdout)
    assert (info["num_rows"], info["row_start"], info["total_rows"]) == (N, 0, 0)
    assert "row_range         - (none recorded)" in engram(local_dir, "info", "whole").stdout

    # The file bytes: version 2 with the range at 208/216, or version 1
    # with zeros there (the layout of docs/format.md).
    def header(name):
        with open(os.path.join(local_dir, "model-x", name), "rb") as f:
            return f.read(512)
    h = header("rank1")
    assert int.from_bytes(h[8:12], "little") == 2 and int.from_bytes(h[60:64], "little") == 1
    assert int.from_bytes(h[208:216], "little") == 20
    assert int.from_bytes(h[216:224], "little") == N
    h = header("whole")
    assert int.from_bytes(h[8:12], "little") == 1 and int.from_bytes(h[60:64], "little") == 0
    assert h[208:504] == bytes(296)

    with engramstore.LocalStore(local_dir, "model-x") as st:
        spec = st.get_table_spec("rank1")
        assert (spec["row_start"], spec["total_rows"]) == (20, N)
        out = np.zeros((2, 1, W + S), np.uint8)
        st.lookup(["rank1"], np.array([[20], [39]], np.int64), out,
                  offsets=np.array([spec["row_start"]], np.int64))
        assert np.array_equal(out[:, 0], np.concatenate([w, s], axis=1)[[20, 39]])
        with pytest.raises(engramstore.BadIdError):   # forgetting the offset is an error
            st.lookup(["rank1"], np.array([[39]], np.int64), out[:1])
        # A checkpoint served without a copy reports its range too.
        st.open_safetensors("served", ckpt, "model.layers.1.engram.weight",
                            "model.layers.1.engram.scale", row_start=10, row_end=30)
        spec = st.get_table_spec("served")
        assert (spec["kind"], spec["row_start"], spec["total_rows"]) == ("safetensors", 10, N)
        assert st.get_table_spec("whole")["total_rows"] == 0
    # A typo in a tensor name gets the closest one.
    r = engram(local_dir, "import", "--safetensors", ckpt, "--weight",
               "model.layers.1.engram.wieght", "t")
    assert r.returncode == 1
    assert "(did you mean 'model.layers.1.engram.weight'?)" in r.stderr
    r = engram(local_dir, "import", "--safetensors", ckpt, "--weight",
               "model.layers.1.engram.weight", "--scale", "model.embed_tokens.weight", "t")
    assert r.returncode == 1
    assert ("tensor 'model.embed_tokens.weight' has shape [2, 3] BF16, but "
            "'model.layers.1.engram.weight' has shape [59, 256] F8_E4M3") in r.stderr


def test_import_layers_one_shard(tmp_path, ckpt, local_dir):
    """--shard S imports only the heads of one rank's shard of the plan,
    with the same names, rows and recorded ranges as a full import."""
    # TP 3 x DP 1: shard 1 holds head 1 (rows 17..35 of each layer).
    r = import_layers(local_dir, ckpt, "--tp", "3", "--shard", "1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == (f"importing 2 layers x heads 1-1 of 3 (shard 1) from {ckpt} into "
                        "namespace 'model-x'")
    assert lines[1] == ("[1/2] engram:l1:h1: 19 rows of 264 bytes, rows 17..35 of layer 1, "
                        "verified")
    assert lines[-1].startswith("imported 2 tables (layers 1, 14; heads engram:l{L}:h1..h1)")
    assert tables(local_dir) == ["engram:l14:h1", "engram:l1:h1"]
    st = engramstore.EngramStore(namespace="model-x", local_dir=local_dir)
    spec = st.get_table_spec("engram:l14:h1")
    assert (spec["row_start"], spec["total_rows"]) == (17, N)
    w, s = planes(14)
    out = np.empty((2, 1, 264), np.uint8)
    st.lookup(["engram:l14:h1"], np.array([[17], [35]], np.int64), out,
              offsets=np.array([17], np.int64))
    assert (out[:, 0, :W] == w[[17, 35]]).all() and (out[:, 0, W:] == s[[17, 35]]).all()
    st.close()
    # TP 2 x DP 2 sharing per TP rank: shard 1 is heads 2.. (ceil(3 / 2) = 2 heads
    # a shard); balanced by reads, shard 0 takes the one hot head alone.
    r = import_layers(local_dir, ckpt, "--tp", "2", "--dp", "2", "--per-tp", "--shard", "1",
                      "--layer-ids", "1")
    assert r.returncode == 0, r.stderr
    assert "heads 2-2 of 3 (shard 1)" in r.stdout
    r = import_layers(local_dir, ckpt, "--tp", "2", "--reads", "900,10,10", "--balanced",
                      "--shard", "0", "--layer-ids", "14")
    assert r.returncode == 0, r.stderr
    assert "heads 0-0 of 3 (shard 0)" in r.stdout
    assert tables(local_dir) == ["engram:l14:h0", "engram:l14:h1", "engram:l1:h1",
                                 "engram:l1:h2"]


@pytest.mark.parametrize("extra,why", [
    (["--tp", "2"], "describe the plan of --shard S"),
    (["--shard", "0"], "--shard needs the topology"),
    (["--tp", "2", "--shard", "2"], "--shard: 2 is outside [0, 1]"),
    (["--tp", "4", "--shard", "0"], "would hold no head"),
    (["--tp", "2", "--balanced", "--shard", "0"], "--balanced needs --reads"),
    (["--tp", "2", "--reads", "1,2", "--shard", "0"], "give 3 read counts"),
])
def test_import_layers_shard_refusals(tmp_path, ckpt, local_dir, extra, why):
    r = import_layers(local_dir, ckpt, *extra)
    assert r.returncode != 0 and why in r.stderr, r.stderr
    assert tables(local_dir) == []


def test_import_layers_from_a_layout(tmp_path, local_dir):
    """--config: each layer's heads are the n-gram layout's columns, with
    that layer's own primes as their rows (they differ between layers),
    and the hasher's ids read the imported rows."""
    cfg = {"text_config": {"engram_layer_ids": [1, 14], "engram_vocab_size": 5,
                           "engram_max_ngram_size": 2, "engram_n_head_per_ngram": 3,
                           "engram_compressed_vocab_size": 11, "engram_pad_id": 0}}
    lay = engramstore.NgramLayout.from_config(cfg)
    assert lay.primes.tolist() == [[5, 7, 11], [13, 17, 19]]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    d = tmp_path / "ckpt"
    d.mkdir()
    data = {}
    for i, l in enumerate(LAYERS):
        rng = np.random.default_rng(2000 + l)
        n = lay.num_rows[i]
        data[l] = (rng.integers(0, 256, (n, W), dtype=np.uint8),
                   rng.integers(0, 256, (n, S), dtype=np.uint8))
    write_safetensors(str(d / "m.safetensors"), {
        f"model.layers.{l}.engram.{k}": (dt, a, a.shape)
        for l in LAYERS for k, dt, a in (("weight", "F8_E4M3", data[l][0]),
                                         ("scale", "F8_E8M0", data[l][1]))})
    ckpt = str(d / "m.safetensors")
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt, "--config", str(path))
    assert r.returncode == 0, r.stderr
    assert "[6/6] engram:l14:h2: 19 rows of 264 bytes, rows 30..48 of layer 14" in r.stdout
    hasher = engramstore.NgramHasher(lay)
    with engramstore.LocalStore(local_dir, "model-x") as st:
        names = [f"engram:l14:h{c}" for c in range(3)]
        assert [st.get_table_spec(n)["num_rows"] for n in names] == [13, 17, 19]
        toks = np.array([3, 10, -1, 4])
        rows = hasher.lookup(st, 14, names, toks)
        gids = hasher.hash(toks, layer=14)
        packed = np.concatenate(data[14], axis=1)
        assert np.array_equal(rows, packed[gids])
    # A checkpoint layer the layout does not have; both or neither head sources.
    cfg["text_config"]["engram_layer_ids"] = [1, 2]
    path.write_text(json.dumps(cfg))
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt,
               "--config", str(path))
    assert r.returncode == 1 and "layer 14" in r.stderr and "not an Engram layer" in r.stderr
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt, "--config", str(path),
               "--head-vocab", "5,7,11")
    assert r.returncode == 2 and "one of them" in r.stderr
    # Sizes that do not add up name the layout.
    cfg["text_config"]["engram_layer_ids"] = [14, 1]
    path.write_text(json.dumps(cfg))
    r = engram(local_dir, "import", "--layers", "--safetensors", ckpt,
               "--config", str(path))
    assert r.returncode == 1 and "head sizes of the layout" in r.stderr, r.stderr
