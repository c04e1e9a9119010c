"""Tables larger than memory through the package: file-backed tables behind
the row cache (file_cache=True) and rows served from a safetensors
checkpoint, checked byte for byte against the memory-resident lookup."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest

import engramstore

R = 264


@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(11)
    rows = {"a": rng.integers(0, 256, (5000, R), np.uint8),
            "b": rng.integers(0, 256, (777, R), np.uint8)}
    with engramstore.EngramStore(namespace="fc", local_dir=str(tmp_path)) as st:
        for name, r in rows.items():
            st.populate(name, r)
    return str(tmp_path), rows


def test_file_cache_matches_memory(stored):
    root, rows = stored
    rng = np.random.default_rng(2)
    ids = np.stack([rng.integers(0, 5000, 3000), rng.integers(0, 777, 3000)], axis=1)
    ids[::7, 0] = 4999  # a repeated row
    ids[5, 1] = -1
    want = np.full((3000, 2, R), 0xCD, np.uint8)
    with engramstore.EngramStore(namespace="fc", local_dir=root) as mem:
        mem.lookup(["a", "b"], ids, want)
    with engramstore.EngramStore(namespace="fc", local_dir=root, file_cache=True,
                                 cache_bytes=1 << 20, queue_depth=32) as st:
        for _ in range(2):  # cold, then partly warm
            got = np.full((3000, 2, R), 0xCD, np.uint8)
            st.lookup(["a", "b"], ids, got)
            np.testing.assert_array_equal(got, want)
        cache = st.stats()["cache"]
        assert cache["tables"] == 2 and cache["queue_depth"] == 32
        assert cache["misses"] > 0 and cache["reads"] > 0 and cache["hits"] > 0
        assert cache["dedup"] > 0  # 4999 repeated within one lookup is read once
        assert 0 < cache["cache_bytes"] <= 1 << 20
        assert cache["read_errors"] == 0


def test_file_cache_bad_id_leaves_out_untouched(stored):
    root, _ = stored
    with engramstore.EngramStore(namespace="fc", local_dir=root, file_cache=True) as st:
        out = np.full((3, 1, R), 0xEE, np.uint8)
        with pytest.raises(engramstore.BadIdError, match=r"ids\[2\]\[0\] = 5000"):
            st.lookup(["a"], np.array([[0], [1], [5000]], np.int64), out)
        assert (out == 0xEE).all()
        assert st.stats()["cache"]["reads"] == 0


def test_memory_store_has_no_cache_tables(stored):
    root, _ = stored
    with engramstore.EngramStore(namespace="fc", local_dir=root) as st:
        st.lookup(["a"], np.zeros((1, 1), np.int64), np.zeros((1, 1, R), np.uint8))
        assert st.stats()["cache"]["tables"] == 0


def write_safetensors(path, tensors):
    """tensors: name -> (dtype string, numpy uint8 array of the raw bytes)."""
    header, blobs, off = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + arr.nbytes]}
        blobs.append(arr.tobytes())
        off += arr.nbytes
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_safetensors_rows(tmp_path):
    rng = np.random.default_rng(5)
    w = rng.integers(0, 256, (300, 256), np.uint8)
    sc = rng.integers(0, 256, (300, 8), np.uint8)
    ck = tmp_path / "model.safetensors"
    write_safetensors(ck, {"engram.weight": ("F8_E4M3", w), "engram.scale": ("F8_E8M0", sc)})
    packed = np.concatenate([w, sc], axis=1)  # the 264-byte rows
    with engramstore.EngramStore(namespace="st", local_dir=str(tmp_path / "root")) as st:
        st.open_safetensors("shard1", str(ck), "engram.weight", "engram.scale",
                            row_start=100, row_end=250)
        spec = st.get_table_spec("shard1")
        assert (spec["num_rows"], spec["row_bytes"], spec["kind"]) == (150, 264, "safetensors")
        ids = np.array([[0], [149], [7], [-1]], np.int64)
        out = np.full((4, 1, 264), 0x11, np.uint8)
        st.lookup(["shard1"], ids, out)
        np.testing.assert_array_equal(out[:3, 0], packed[[100, 249, 107]])
        assert (out[3] == 0x11).all()
        with pytest.raises(engramstore.BadIdError):
            st.lookup(["shard1"], np.array([[150]], np.int64), out[:1])
        with pytest.raises(engramstore.StateError):
            st.remove("shard1")  # served from the checkpoint: not a table file


def test_safetensors_bad_inputs(tmp_path):
    ck = tmp_path / "m.safetensors"
    write_safetensors(ck, {"w": ("F8_E4M3", np.zeros((10, 256), np.uint8))})
    with engramstore.EngramStore(namespace="st", local_dir=str(tmp_path / "root")) as st:
        with pytest.raises(engramstore.EngramError, match="nope"):
            st.open_safetensors("t", str(ck), "nope")
        with pytest.raises(engramstore.EngramError):
            st.open_safetensors("t", str(ck), "w", row_start=5, row_end=20)
        broken = tmp_path / "broken.safetensors"
        broken.write_bytes(struct.pack("<Q", 40) + b'{"w": {"dtype": "F8_E4M3", "shape": [1')
        with pytest.raises(engramstore.CorruptTableError):
            st.open_safetensors("t", str(broken), "w")
        with pytest.raises(TypeError, match="^weight: expected a table name"):
            st.open_safetensors("t", str(ck), 3)
        # A NUL would cut the path or a name short on the C side.
        with pytest.raises(ValueError, match="^path: a path cannot contain NUL"):
            st.open_safetensors("t", str(ck) + "\x00.other", "w")
        with pytest.raises(ValueError, match="^path: a path cannot contain NUL"):
            st.open_safetensors("t", bytes(ck) + b"\x00.other", "w")
        with pytest.raises(TypeError, match="^path: expected a path"):
            st.open_safetensors("t", 3, "w")
        with pytest.raises(ValueError, match="^weight: cannot contain NUL"):
            st.open_safetensors("t", str(ck), "w\x00x")
        with pytest.raises(ValueError, match="^scale: cannot contain NUL"):
            st.open_safetensors("t", str(ck), "w", "s\x00x")
        with pytest.raises(ValueError, match="^name: cannot contain NUL"):
            st.open_safetensors("t\x00x", str(ck), "w")
        assert st.list_tables() == []
        st.open_safetensors("t", str(ck), "w")
        with pytest.raises(engramstore.TableExistsError):
            st.open_safetensors("t", str(ck), "w")
