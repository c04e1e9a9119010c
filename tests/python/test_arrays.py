"""The data contract: arrays are taken as they are (buffer protocol or DLPack),
never converted; a wrong type, dtype, shape or layout raises TypeError or
ValueError naming the argument; device memory is refused."""
from __future__ import annotations

import array
import errno
import gc
import os
import sys

import numpy as np
import pytest

import engramstore
from esutil import (SENTINEL, DLPackOnly, FakeCudaArrayInterface, FakeDLPackDevice,
                    LegacyDLPackOnly, expected, make_rows, sentinel)

NAMES = ["a", "b", "a"]
IDS = np.array([[0, 1, 2], [16, 18, -1], [3, 0, 4]], np.int64)


def readonly(a):
    a = a.copy()
    a.flags.writeable = False
    return a


@pytest.fixture
def layer(config, rows_a, rows_b):
    t = engramstore.EngramStore({1: config([17, 19], 264)}, store=None)
    t.bind_local(1, [rows_a, rows_b])
    yield t
    t.close()


# ---- no implicit conversion ---------------------------------------------

def test_python_sequences_are_refused_for_every_argument(ab, layer, rows_a):
    """Every array argument; offsets, K small ints, are taken as any int
    sequence (test_offsets_of_any_int_sequence)."""
    st, _ = ab
    out = sentinel((3, 3, 264))
    checks = [
        (lambda: st.lookup(NAMES, IDS.tolist(), out), "ids"),
        (lambda: st.lookup(NAMES, tuple(map(tuple, IDS.tolist())), out), "ids"),
        (lambda: st.lookup(NAMES, IDS, out.tolist()), "out"),
        (lambda: st.populate("c", rows_a.tolist()), "rows"),
        (lambda: layer.lookup_into(1, IDS[:, :2].reshape(3, 1, 2).tolist(),
                                   sentinel((3, 1, 2, 264))), "row_ids"),
        (lambda: layer.lookup_into(1, np.zeros((3, 1, 2), np.int64),
                                   sentinel((3, 1, 2, 264)).tolist()), "output"),
    ]
    for call, arg in checks:
        with pytest.raises(TypeError, match=rf"^{arg}: expected an array, got a Python "):
            call()
    assert (out == SENTINEL).all()
    assert "c" not in st.list_tables()


@pytest.mark.parametrize("bad", [None, 3, 2.5, "ids", b"\x00" * 8, object()])
def test_non_arrays_are_refused(ab, bad):
    st, _ = ab
    out = sentinel((3, 3, 264))
    if isinstance(bad, bytes):  # bytes has the buffer protocol: uint8 is the wrong dtype
        with pytest.raises(TypeError, match="^ids: expected int32 or int64, got uint8"):
            st.lookup(NAMES, bad, out)
    else:
        with pytest.raises(TypeError, match="^ids: expected an array"):
            st.lookup(NAMES, bad, out)
    if bad is not None and not isinstance(bad, bytes):
        with pytest.raises(TypeError, match="^out: expected an array"):
            st.lookup(NAMES, IDS, bad)
        with pytest.raises(TypeError, match="^rows: expected an array"):
            st.populate("c", bad)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.uint32, np.uint64, np.float32,
                                   np.float64, np.bool_, "<U1"])
def test_wrong_ids_dtypes(ab, dtype):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(TypeError, match="^ids: expected int32 or int64, got "):
        st.lookup(NAMES, np.zeros((3, 3), dtype), out)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.float32, np.float64,
                                   np.bool_])
def test_wrong_out_dtypes(ab, dtype):
    st, _ = ab
    with pytest.raises(TypeError, match="^out: expected uint8, got "):
        st.lookup(NAMES, IDS, np.zeros((3, 3, 264), dtype))


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16, np.bool_])
def test_wrong_offsets_dtypes(ab, dtype):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(TypeError, match="^offsets: expected integers .*, got "
                                        + np.dtype(dtype).name):
        st.lookup(NAMES, IDS, out, offsets=np.zeros(3, dtype))
    assert (out == SENTINEL).all()


OFFSETS = [100, 0, 1000]


@pytest.mark.parametrize("offsets", [
    OFFSETS, tuple(OFFSETS),
    np.array(OFFSETS, np.int16), np.array(OFFSETS, np.int32), np.array(OFFSETS, np.uint16),
    np.array(OFFSETS, np.uint64), [np.int32(100), np.uint8(0), 1000]],
    ids=["list", "tuple", "int16", "int32", "uint16", "uint64", "numpy-scalars"])
def test_offsets_of_any_int_sequence(ab, offsets):
    """offsets had to be an int64 array; any K ints do now."""
    st, tabs = ab
    ids = np.array([[100, 0, 1016], [116, 18, 1000]], np.int64)
    out = sentinel((2, 3, 264))
    st.lookup(NAMES, ids, out, offsets)
    np.testing.assert_array_equal(
        out, expected(tabs, NAMES, ids, np.array(OFFSETS, np.int64)))


def test_offsets_as_a_range(ab):
    st, tabs = ab
    ids = np.array([[1, 2, 3]], np.int64)
    out = st.lookup(NAMES, ids, offsets=range(1, 4))
    np.testing.assert_array_equal(out, expected(tabs, NAMES, np.zeros((1, 3), np.int64)))


@pytest.mark.parametrize("offsets, exc, msg", [
    ([100, 0.0, 1000], TypeError, r"^offsets\[1\]: expected an int, got float"),
    ([100, 0, True], TypeError, r"^offsets\[2\]: expected an int, got bool"),
    ([np.True_, 0, 0], TypeError, r"^offsets\[0\]: expected an int, got numpy\.bool"),
    ([np.float64(1), 0, 0], TypeError, r"^offsets\[0\]: expected an int, got numpy\.float64"),
    (["1", 0, 0], TypeError, r"^offsets\[0\]: expected an int, got str"),
    ([100, 0], ValueError, r"^offsets: expected 3 values \(one per table\), got 2"),
    ([0, 0, 2**63], ValueError, r"^offsets\[2\]: 9223372036854775808 is outside int64"),
    (np.array([0, 0, 2**63], np.uint64), ValueError, r"^offsets\[2\]: .* is outside int64"),
    (np.zeros((3, 1), np.int32), ValueError, r"^offsets: expected shape \(3,\)"),
    (3, TypeError, "^offsets: "),
])
def test_bad_offsets_are_refused_and_named(ab, offsets, exc, msg):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(exc, match=msg):
        st.lookup(NAMES, IDS, out, offsets=offsets)
    assert (out == SENTINEL).all()


@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.float32])
def test_wrong_rows_dtypes(store, dtype):
    with pytest.raises(TypeError, match="^rows: expected uint8, got "):
        store.populate("a", np.zeros((17, 264), dtype))
    assert store.list_tables() == []


def test_big_endian_is_refused(ab):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(TypeError, match="^ids: big-endian"):
        st.lookup(NAMES, IDS.astype(">i8"), out)
    with pytest.raises(TypeError, match="^offsets: big-endian"):
        st.lookup(NAMES, IDS, out, offsets=np.zeros(3, ">i8"))
    assert (out == SENTINEL).all()


def test_wrong_shapes(ab):
    st, _ = ab
    out = sentinel((3, 3, 264))
    cases = [
        (lambda: st.lookup(NAMES, IDS[0], out), "^ids: expected a 2-D array"),
        (lambda: st.lookup(NAMES, IDS[None], out), "^ids: expected a 2-D array"),
        (lambda: st.lookup(NAMES, np.int64(3), out), "^ids: expected a 2-D array"),
        (lambda: st.lookup(NAMES, IDS[:, :2], out), "^ids: shape .* 2 columns but 3 tables"),
        (lambda: st.lookup(NAMES, IDS, out[:2]), r"^out: expected shape \(3, 3, 264\)"),
        (lambda: st.lookup(NAMES, IDS, out[:, :, :263]), r"^out: expected shape"),
        (lambda: st.lookup(NAMES, IDS, out.reshape(9, 264)), r"^out: expected shape"),
        (lambda: st.lookup(NAMES, IDS, out[None]), r"^out: expected shape"),
        (lambda: st.lookup(NAMES, IDS, out, offsets=np.zeros(2, np.int64)),
         r"^offsets: expected shape \(3,\)"),
        (lambda: st.lookup(NAMES, IDS, out, offsets=np.zeros((1, 3), np.int64)),
         r"^offsets: expected shape \(3,\)"),
        (lambda: st.populate("a", make_rows(17, 264, 1)[:, :100]),
         r"^rows: expected shape \(17, 264\)"),
        (lambda: st.populate("c", np.zeros(264, np.uint8)), "^rows: expected a 2-D array"),
        (lambda: st.populate("c", np.zeros((0, 264), np.uint8)), "^rows: shape"),
        (lambda: st.populate("c", np.zeros((4, 0), np.uint8)), "^rows: shape"),
        (lambda: st.populate("c", np.zeros((2, 2, 2), np.uint8)), "^rows: expected a 2-D"),
    ]
    for call, msg in cases:
        with pytest.raises(ValueError, match=msg):
            call()
    assert (out == SENTINEL).all()
    assert st.list_tables() == ["a", "b"]


def test_rows_layouts(store):
    # row bytes must be contiguous, rows must not overlap
    with pytest.raises(ValueError, match="^rows: rows must be stored one after another"):
        store.populate("c", np.zeros((4, 16), np.uint8)[:, ::2])
    with pytest.raises(ValueError, match="^rows: rows must be stored one after another"):
        store.populate("c", np.zeros((16, 4), np.uint8).T)
    with pytest.raises(ValueError, match="^rows: rows must be stored one after another"):
        store.populate("c", np.broadcast_to(np.zeros(8, np.uint8), (4, 8)))
    assert store.list_tables() == []


# ---- read-only outputs ----------------------------------------------------

def test_read_only_outputs_are_refused(ab, layer, tmp_path):
    st, _ = ab
    path = tmp_path / "out.bin"
    np.zeros((3, 3, 264), np.uint8).tofile(path)
    mm_ro = np.memmap(path, np.uint8, mode="r", shape=(3, 3, 264))
    outs = [readonly(sentinel((3, 3, 264))), memoryview(bytes(3 * 3 * 264)).cast("B", (3, 3, 264)),
            memoryview(sentinel((3, 3, 264))).toreadonly(), mm_ro,
            np.broadcast_to(sentinel((3, 264))[:, None], (3, 3, 264))]
    for o in outs:
        with pytest.raises(ValueError, match="^out: the array is read-only"):
            st.lookup(NAMES, IDS, o)
    with pytest.raises(ValueError, match="^output: the array is read-only"):
        layer.lookup_into(1, np.zeros((3, 1, 2), np.int64), readonly(sentinel((3, 1, 2, 264))))
    assert (np.asarray(mm_ro) == 0).all()


def test_read_only_inputs_are_fine(ab, rows_a):
    st, tabs = ab
    out = sentinel((3, 3, 264))
    st.lookup(NAMES, readonly(IDS), out, offsets=readonly(np.zeros(3, np.int64)))
    np.testing.assert_array_equal(out, expected(tabs, NAMES, IDS))
    st.populate("c", readonly(rows_a))
    st.populate("d", bytes(rows_a.tobytes()) and memoryview(rows_a.tobytes()).cast("B", (17, 264)))
    assert st.get_table_spec("d")["checksum"] == st.get_table_spec("a")["checksum"]


def test_overlapping_output_rows_are_a_layout_error(ab):
    st, _ = ab
    base = sentinel((3, 3, 264))
    for strides in [(264, 264, 1), (0, 264, 1), (3 * 264, 100, 1)]:
        o = np.lib.stride_tricks.as_strided(base, shape=(3, 3, 264), strides=strides)
        with pytest.raises(engramstore.LayoutError) as ei:
            st.lookup(NAMES, IDS, o)
        assert ei.value.errno == engramstore.ELAYOUT
    assert (base == SENTINEL).all()


def test_row_bytes_of_out_must_be_contiguous(ab):
    st, _ = ab
    big = sentinel((3, 3, 528))
    with pytest.raises(ValueError, match="^out: the bytes of each row must be contiguous"):
        st.lookup(NAMES, IDS, big[:, :, ::2])
    assert (big == SENTINEL).all()


# ---- the buffer protocol ----------------------------------------------------

def test_memoryview_bytearray_and_array_module(ab):
    st, tabs = ab
    want = expected(tabs, NAMES, IDS)
    buf = bytearray(b"\xa5" * (3 * 3 * 264))
    st.lookup(NAMES, memoryview(IDS), memoryview(buf).cast("B", (3, 3, 264)))
    np.testing.assert_array_equal(np.frombuffer(buf, np.uint8).reshape(3, 3, 264), want)
    ids32 = array.array("i", IDS.astype(np.int32).ravel())
    buf2 = bytearray(b"\xa5" * (3 * 3 * 264))
    st.lookup(NAMES, memoryview(ids32).cast("B").cast("i", (3, 3)),
              memoryview(buf2).cast("B", (3, 3, 264)),
              offsets=memoryview(array.array("q", [0, 0, 0])))
    assert buf2 == buf
    # a flat bytearray has the wrong shape: no reshaping behind the caller's back
    with pytest.raises(ValueError, match="^out: expected shape"):
        st.lookup(NAMES, IDS, bytearray(3 * 3 * 264))


def test_bytearray_rows_via_memoryview(store, rows_a):
    store.populate("a", memoryview(bytearray(rows_a.tobytes())).cast("B", (17, 264)))
    out = sentinel((17, 1, 264))
    store.lookup(["a"], np.arange(17).reshape(-1, 1), out)
    np.testing.assert_array_equal(out[:, 0], rows_a)


def test_memmap_everywhere(store, rows_a, tmp_path):
    rows_path, out_path, ids_path = tmp_path / "rows", tmp_path / "out", tmp_path / "ids"
    rows_a.tofile(rows_path)
    rows_mm = np.memmap(rows_path, np.uint8, mode="r", shape=(17, 264))
    store.populate("a", rows_mm)
    ids = np.memmap(ids_path, np.int64, mode="w+", shape=(17, 1))
    ids[:, 0] = np.arange(17)[::-1]
    out = np.memmap(out_path, np.uint8, mode="w+", shape=(17, 1, 264))
    store.lookup(["a"], ids, out)
    out.flush()
    np.testing.assert_array_equal(np.fromfile(out_path, np.uint8).reshape(17, 264),
                                  rows_a[::-1])


# ---- DLPack -----------------------------------------------------------------

def test_dlpack_only_objects(ab, rows_a):
    st, tabs = ab
    ids, out, offs = DLPackOnly(IDS), DLPackOnly(sentinel((3, 3, 264))), DLPackOnly(
        np.zeros(3, np.int64))
    with pytest.raises(TypeError):
        memoryview(ids)  # really no buffer protocol
    st.lookup(NAMES, ids, out, offsets=offs)
    np.testing.assert_array_equal(out._a, expected(tabs, NAMES, IDS))
    for w in (ids, out, offs):
        assert len(w.calls) == 1 and w.calls[0]["max_version"] == (1, 0)
    st.populate("c", DLPackOnly(rows_a))
    assert st.get_table_spec("c")["checksum"] == st.get_table_spec("a")["checksum"]


def test_dlpack_strided_views(ab):
    st, tabs = ab
    out_km = sentinel((3, 3, 264))
    st.lookup(NAMES, DLPackOnly(IDS[::-1].astype(np.int32)), DLPackOnly(out_km.transpose(1, 0, 2)))
    np.testing.assert_array_equal(out_km.transpose(1, 0, 2), expected(tabs, NAMES, IDS[::-1]))


def test_legacy_dlpack_producer(ab, rows_a):
    st, tabs = ab
    ids, out = LegacyDLPackOnly(IDS), LegacyDLPackOnly(sentinel((3, 3, 264)))
    st.lookup(NAMES, ids, out)
    np.testing.assert_array_equal(out._a, expected(tabs, NAMES, IDS))
    assert ids.calls == 1 and out.calls == 1
    st.populate("c", LegacyDLPackOnly(rows_a))
    assert st.list_tables() == ["a", "b", "c"]


def test_dlpack_dtype_shape_and_readonly_checks(ab):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(TypeError, match="^ids: expected int32 or int64, got"):
        st.lookup(NAMES, DLPackOnly(IDS.astype(np.float64)), out)
    with pytest.raises(TypeError, match="^out: expected uint8"):
        st.lookup(NAMES, IDS, DLPackOnly(out.view(np.int8)))
    with pytest.raises(ValueError, match="^out: expected shape"):
        st.lookup(NAMES, IDS, DLPackOnly(out[:2]))
    for wrap in (DLPackOnly, LegacyDLPackOnly):
        with pytest.raises(ValueError, match="^out: "):
            st.lookup(NAMES, IDS, wrap(readonly(out)))
    assert (out == SENTINEL).all()


def test_dlpack_releases_what_it_takes(ab, layer, rows_a):
    st, _ = ab
    ids, out = IDS.copy(), sentinel((3, 3, 264))
    gc.collect()
    before = (sys.getrefcount(ids), sys.getrefcount(out))
    for i in range(200):
        st.lookup(NAMES, DLPackOnly(ids), DLPackOnly(out))
        st.lookup(NAMES, LegacyDLPackOnly(ids), LegacyDLPackOnly(out))
        with pytest.raises(engramstore.BadIdError):
            st.lookup(NAMES, DLPackOnly(ids + 100), DLPackOnly(out))
        with pytest.raises(ValueError):
            st.lookup(NAMES, DLPackOnly(ids), DLPackOnly(out[:1]))
    gc.collect()
    assert (sys.getrefcount(ids), sys.getrefcount(out)) == before


def test_dlpack_bind_local_holds_until_close(config, rows_a, rows_b):
    before = (sys.getrefcount(rows_a), sys.getrefcount(rows_b))
    t = engramstore.EngramStore({1: config([17, 19], 264)}, store=None)
    t.bind_local(1, [DLPackOnly(rows_a), LegacyDLPackOnly(rows_b)])
    gc.collect()
    assert sys.getrefcount(rows_a) > before[0] and sys.getrefcount(rows_b) > before[1]
    out = sentinel((1, 1, 2, 264))
    t.lookup_into(1, np.array([[[16, 18]]], np.int64), out)
    np.testing.assert_array_equal(out[0, 0, 0], rows_a[16])
    np.testing.assert_array_equal(out[0, 0, 1], rows_b[18])
    t.close()
    gc.collect()
    assert (sys.getrefcount(rows_a), sys.getrefcount(rows_b)) == before


# ---- device memory and streams ----------------------------------------------

NO_GPU = not os.path.exists("/dev/nvidia0")
cuda_build = pytest.mark.skipif(not engramstore.HAVE_CUDA, reason="built without CUDA")
no_cuda_build = pytest.mark.skipif(engramstore.HAVE_CUDA, reason="built with CUDA")


def assert_device_refused(calls, exc, reason):
    """Each (argument, call) of `calls`, given a device array of each kind
    (__cuda_array_interface__, DLPack on CUDA, DLPack on another device),
    raises `exc` naming the argument and matching `reason`, without taking
    the DLPack capsule."""
    fakes = [FakeCudaArrayInterface, lambda: FakeDLPackDevice(2), lambda: FakeDLPackDevice(13)]
    for make in fakes:
        for arg, call in calls:
            fake = make()
            with pytest.raises(exc, match=rf"^{arg}: {reason}"):
                call(fake)
            assert not getattr(fake, "dlpack_called", False)


@no_cuda_build
def test_device_memory_is_not_supported_yet(ab, layer):
    st, _ = ab
    out = sentinel((3, 3, 264))
    assert_device_refused([
        ("ids", lambda f: st.lookup(NAMES, f, out)),
        ("out", lambda f: st.lookup(NAMES, IDS, f)),
        ("offsets", lambda f: st.lookup(NAMES, IDS, out, offsets=f)),
        ("rows", lambda f: st.populate("c", f)),
        ("row_ids", lambda f: layer.lookup_into(1, f, sentinel((1, 1, 2, 264)))),
        ("output", lambda f: layer.lookup_into(1, np.zeros((1, 1, 2), np.int64), f)),
        (r"embedding_buffers\[0\]", lambda f: layer.bind_local(1, [f, f])),
    ], NotImplementedError, ".*not supported yet")
    assert (out == SENTINEL).all()
    assert st.list_tables() == ["a", "b"]


@no_cuda_build
@pytest.mark.parametrize("stream", [0, 1, object(), "cuda"])
def test_stream_is_not_supported_yet(ab, stream):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(NotImplementedError, match="^stream: .*not supported yet"):
        st.lookup(NAMES, IDS, out, stream=stream)
    with pytest.raises(NotImplementedError, match="^stream:"):
        st.lookup(NAMES, IDS, out, None, stream)
    assert (out == SENTINEL).all()


@cuda_build
def test_device_memory_refused_where_host_memory_is_needed(ab, layer):
    st, _ = ab
    out = sentinel((3, 3, 264))
    assert_device_refused([
        ("offsets", lambda f: st.lookup(NAMES, IDS, out, offsets=f)),
        ("rows", lambda f: st.populate("c", f)),
        (r"embedding_buffers\[0\]", lambda f: layer.bind_local(1, [f, f])),
    ], TypeError, "CUDA device memory .*not accepted")
    assert (out == SENTINEL).all()
    assert st.list_tables() == ["a", "b"]


@cuda_build
def test_device_and_host_arrays_do_not_mix(ab, layer):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(ValueError, match="^ids and out: both must be host arrays or both GPU"):
        st.lookup(NAMES, FakeCudaArrayInterface((3, 3), "<i8"), out)
    with pytest.raises(ValueError, match="^ids and out: both must be host arrays or both GPU"):
        st.lookup(NAMES, IDS, FakeCudaArrayInterface((3, 3, 264), "|u1"))
    with pytest.raises(ValueError, match="^row_ids and output: both must"):
        layer.lookup_into(1, np.zeros((1, 1, 2), np.int64), FakeCudaArrayInterface((1, 1, 2, 264), "|u1"))
    assert (out == SENTINEL).all()


@cuda_build
@pytest.mark.parametrize("stream", [0, 1, object(), "cuda"])
def test_stream_with_host_arrays_is_an_error(ab, stream):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(ValueError, match="^stream: a CUDA stream orders GPU lookups only"):
        st.lookup(NAMES, IDS, out, stream=stream)
    assert (out == SENTINEL).all()


@cuda_build
def test_device_arrays_are_checked_before_the_gpu_is_used(ab):
    st, _ = ab
    dev = FakeCudaArrayInterface
    with pytest.raises(TypeError, match="^ids: expected int32 or int64"):
        st.lookup(NAMES, dev((3, 3), "<f8"), dev((3, 3, 264), "|u1"))
    with pytest.raises(TypeError, match="^out: expected uint8"):
        st.lookup(NAMES, dev((3, 3), "<i8"), dev((3, 3, 264), "<i2"))
    with pytest.raises(ValueError, match=r"^out: expected shape \(3, 3, 264\)"):
        st.lookup(NAMES, dev((3, 3), "<i8"), dev((3, 3, 263), "|u1"))
    ro = dev((3, 3, 264), "|u1")
    ro.__cuda_array_interface__["data"] = (0x7F0000000000, True)
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        st.lookup(NAMES, dev((3, 3), "<i8"), ro)
    with pytest.raises(TypeError, match="^stream: expected None, an int stream handle"):
        st.lookup(NAMES, dev((3, 3), "<i8"), dev((3, 3, 264), "|u1"), stream="cuda")
    zero = dev((3, 3), "<i8")
    zero.__cuda_array_interface__["stream"] = 0
    with pytest.raises(ValueError, match="^ids: __cuda_array_interface__ stream 0 is disallowed"):
        st.lookup(NAMES, zero, dev((3, 3, 264), "|u1"))
    for stream in ("1", -1, 2**64, 1.0):  # not a stream handle
        odd = dev((3, 3, 264), "|u1")
        odd.__cuda_array_interface__["stream"] = stream
        with pytest.raises(TypeError, match="^out: malformed __cuda_array_interface__"):
            st.lookup(NAMES, dev((3, 3), "<i8"), odd)
    bad = dev((3, 3), "<i8")
    del bad.__cuda_array_interface__["data"]
    with pytest.raises(TypeError, match="^ids: malformed __cuda_array_interface__"):
        st.lookup(NAMES, bad, dev((3, 3, 264), "|u1"))


@cuda_build
@pytest.mark.skipif(not NO_GPU, reason="a GPU is present: the fake device pointer must not be used")
def test_gpu_lookup_without_a_gpu_says_so(ab):
    st, _ = ab
    dev = FakeCudaArrayInterface
    with pytest.raises(engramstore.EngramError, match="no CUDA device") as ei:
        st.lookup(NAMES, dev((3, 3), "<i8"), dev((3, 3, 264), "|u1"))
    assert ei.value.errno == errno.ENODEV
    assert st.cuda_check() is None  # no context: nothing to report
    out = sentinel((3, 3, 264))
    st.lookup(NAMES, IDS, out)  # the store still serves host lookups
    assert not (out == SENTINEL).all()


def test_stream_none_positional(ab):
    st, tabs = ab
    out = sentinel((3, 3, 264))
    st.lookup(NAMES, IDS, out, None, None)
    np.testing.assert_array_equal(out, expected(tabs, NAMES, IDS))


def test_lookup_argument_parsing(ab):
    st, _ = ab
    out = sentinel((3, 3, 264))
    with pytest.raises(TypeError, match="missing required argument 'ids'"):
        st.lookup(NAMES)
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        st.lookup(NAMES, IDS, out, bogus=1)
    with pytest.raises(TypeError, match="multiple values for argument 'ids'"):
        st.lookup(NAMES, IDS, out, ids=IDS)
    with pytest.raises(TypeError, match="at most 5 positional"):
        st.lookup(NAMES, IDS, out, None, None, True)
    assert (out == SENTINEL).all()


# ---- torch (optional) ---------------------------------------------------------

def test_torch_cpu_tensors_via_dlpack(ab, rows_a):
    torch = pytest.importorskip("torch")
    st, tabs = ab
    ids = torch.from_numpy(IDS.copy())
    out = torch.full((3, 3, 264), SENTINEL, dtype=torch.uint8)
    st.lookup(NAMES, ids, out)
    np.testing.assert_array_equal(out.numpy(), expected(tabs, NAMES, IDS))
    out_km = torch.full((3, 3, 264), SENTINEL, dtype=torch.uint8)
    st.lookup(NAMES, ids.to(torch.int32), out_km.transpose(0, 1))
    np.testing.assert_array_equal(out_km.transpose(0, 1).numpy(), expected(tabs, NAMES, IDS))
    st.populate("c", torch.from_numpy(rows_a.copy()))
    assert st.get_table_spec("c")["checksum"] == st.get_table_spec("a")["checksum"]
    with pytest.raises(TypeError, match="^ids:"):
        st.lookup(NAMES, ids.to(torch.float32), out)
    with pytest.raises(TypeError, match="^out:"):
        st.lookup(NAMES, ids, out.to(torch.int16))
