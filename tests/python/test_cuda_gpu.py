"""GPU lookups through the Python package, compared byte for byte with the
CPU lookup.  They need a CUDA build of the package and a GPU; device
buffers are made with the CUDA runtime through ctypes, so neither torch nor
cupy is needed.  Elsewhere they are skipped with the reason.

With ENGRAM_TEST_CUDA_EMU=1 the package on the path is the build over the
emulated runtime (tests/cuda_emu, see scripts/test.sh): no GPU is needed,
and the runtime calls below go to the emulation inside its GPU module
(engramstore._engram_cuda)."""
from __future__ import annotations

import ctypes
import ctypes.util
import os

import numpy as np
import pytest

import engramstore

EMU = os.environ.get("ENGRAM_TEST_CUDA_EMU") == "1"
pytestmark = [
    pytest.mark.skipif(not engramstore.HAVE_CUDA, reason="engramstore built without CUDA"),
    pytest.mark.skipif(not EMU and not os.path.exists("/dev/nvidia0"),
                       reason="no GPU on this machine"),
]

H2D, D2H = 1, 2


def runtime():
    if EMU:
        # The emulated runtime is inside the GPU module (which the first
        # GPU lookup would import anyway).
        import engramstore._engram_cuda
        return ctypes.CDLL(engramstore._engram_cuda.__file__)
    for name in ("libcudart.so.13", "libcudart.so", ctypes.util.find_library("cudart")):
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                pass
    pytest.skip("the CUDA runtime library cannot be loaded")


class DeviceArray:
    """A device copy of a numpy array, announced with __cuda_array_interface__
    (optionally as a strided view: shape/strides given in bytes)."""

    def __init__(self, rt, host: np.ndarray, shape=None, strides=None):
        self.rt, self.nbytes, self.dtype = rt, host.nbytes, host.dtype
        self.ptr = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(self.ptr), ctypes.c_size_t(max(1, host.nbytes))) == 0
        host = np.ascontiguousarray(host)
        assert rt.cudaMemcpy(self.ptr, host.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(host.nbytes), H2D) == 0
        # From pageable memory, cudaMemcpy may return before the bytes land,
        # and lookups on non-blocking streams do not wait for it.
        assert rt.cudaDeviceSynchronize() == 0
        self.base_shape = host.shape
        self.__cuda_array_interface__ = {
            "shape": tuple(shape or host.shape), "typestr": host.dtype.str,
            "data": (self.ptr.value, False), "strides": strides, "version": 3}

    def numpy(self) -> np.ndarray:
        out = np.empty(self.base_shape, self.dtype)
        assert self.rt.cudaMemcpy(out.ctypes.data_as(ctypes.c_void_p), self.ptr,
                                  ctypes.c_size_t(self.nbytes), D2H) == 0
        return out

    def free(self):
        self.rt.cudaFree(self.ptr)


@pytest.fixture
def rt():
    return runtime()


@pytest.fixture
def gst(tmp_path):
    rng = np.random.default_rng(7)
    rows = {"a": rng.integers(0, 256, (1000, 264), np.uint8),
            "b": rng.integers(0, 256, (333, 264), np.uint8)}
    st = engramstore.EngramStore(tables={n: {"num_rows": r.shape[0], "row_bytes": 264}
                                         for n, r in rows.items()},
                                 namespace="gpu", local_dir=str(tmp_path))
    for n, r in rows.items():
        st.populate(n, r)
    yield st, rows
    st.close()


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_gpu_matches_cpu(rt, gst, dtype):
    st, rows = gst
    rng = np.random.default_rng(1)
    names = ["a", "b", "a"]
    offsets = np.array([0, 1000, 5], np.int64)
    ids = np.stack([rng.integers(0, 1000, 257), rng.integers(1000, 1333, 257),
                    rng.integers(5, 1005, 257)], axis=1).astype(dtype)
    ids[3, 1] = -1
    want = np.full((257, 3, 264), 0xAB, np.uint8)
    st.lookup(names, ids, want, offsets=offsets)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.full((257, 3, 264), 0xAB, np.uint8))
    st.lookup(names, d_ids, d_out, offsets=offsets)
    np.testing.assert_array_equal(d_out.numpy(), want)
    assert st.cuda_check() is None
    d_ids.free(), d_out.free()


def test_gpu_head_major_zero_dead_and_stream(rt, gst):
    st, rows = gst
    ids = np.array([[0, 5], [-1, 332], [999, -1]], np.int64)
    want_km = np.full((2, 3, 264), 0x11, np.uint8)
    st.lookup(["a", "b"], ids, want_km.transpose(1, 0, 2), zero_dead=True)
    d_ids = DeviceArray(rt, ids)
    # out: a [K, T, R] buffer seen as [T, K, R] through strides.
    d_out = DeviceArray(rt, np.full((2, 3, 264), 0x11, np.uint8), shape=(3, 2, 264),
                        strides=(264, 3 * 264, 1))
    stream = ctypes.c_void_p()
    assert rt.cudaStreamCreate(ctypes.byref(stream)) == 0
    st.lookup(["a", "b"], d_ids, d_out, stream=stream.value or 0, zero_dead=True)
    assert rt.cudaStreamSynchronize(stream) == 0
    np.testing.assert_array_equal(d_out.numpy(), want_km)
    rt.cudaStreamDestroy(stream)
    d_ids.free(), d_out.free()


class TorchLikeStream:
    """What torch.cuda.Stream offers: the handle as `cuda_stream`."""

    def __init__(self, handle):
        self.cuda_stream = handle


class ProtocolStream:
    """The CUDA stream protocol: __cuda_stream__() -> (version, handle)."""

    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


@pytest.mark.parametrize("kind", ["int", "torch", "protocol"])
def test_gpu_lookup_goes_on_the_given_stream(rt, gst, kind):
    st, rows = gst
    ids = np.array([[3], [4], [999]], np.int64)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((3, 1, 264), np.uint8))
    stream = ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0  # non-blocking
    arg = {"int": stream.value, "torch": TorchLikeStream(stream.value),
           "protocol": ProtocolStream(stream.value)}[kind]
    st.lookup(["a"], d_ids, d_out, stream=arg)
    assert rt.cudaStreamSynchronize(stream) == 0
    want = rows["a"][[3, 4, 999]]
    if EMU:
        # The emulation runs a stream's work only when something waits for
        # it, and its device memory is host memory: right after waiting for
        # this stream alone, the rows are there only if the lookup was
        # enqueued on it (not on the legacy stream, say).
        got = np.frombuffer(ctypes.string_at(d_out.ptr.value, want.nbytes), np.uint8)
        np.testing.assert_array_equal(got.reshape(want.shape), want)
    np.testing.assert_array_equal(d_out.numpy()[:, 0], want)
    rt.cudaStreamDestroy(stream)
    d_ids.free(), d_out.free()


@pytest.mark.parametrize("announce", [True, False])
def test_gpu_lookup_waits_for_the_cai_stream_of_its_arrays(rt, gst, announce):
    """__cuda_array_interface__ v3 names the stream the producer wrote on;
    the lookup, on another stream, must wait for it.  (announce=False is
    the control, meaningful on the emulation only: there the copy has not
    run when only the lookup's stream is waited for.)"""
    if not announce and not EMU:
        pytest.skip("the control needs the emulation's deferred streams")
    st, rows = gst
    producer, consumer = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(producer), 1) == 0
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(consumer), 1) == 0
    host_ids = np.array([[5], [6], [7]], np.int64)
    d_ids = DeviceArray(rt, np.zeros((3, 1), np.int64))
    d_out = DeviceArray(rt, np.zeros((3, 1, 264), np.uint8))
    # The producer writes the ids on its own stream.
    assert rt.cudaMemcpyAsync(d_ids.ptr, host_ids.ctypes.data_as(ctypes.c_void_p),
                              ctypes.c_size_t(host_ids.nbytes), H2D, producer) == 0
    if announce:
        d_ids.__cuda_array_interface__["stream"] = producer.value
    st.lookup(["a"], d_ids, d_out, stream=consumer.value)
    assert rt.cudaStreamSynchronize(consumer) == 0
    want = rows["a"][[5, 6, 7]]
    if EMU:
        got = np.frombuffer(ctypes.string_at(d_out.ptr.value, want.nbytes), np.uint8)
        assert np.array_equal(got.reshape(want.shape), want) == announce
    if announce:
        np.testing.assert_array_equal(d_out.numpy()[:, 0], want)
    assert rt.cudaStreamSynchronize(producer) == 0
    rt.cudaStreamDestroy(producer), rt.cudaStreamDestroy(consumer)
    d_ids.free(), d_out.free()


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


class DLPackDevice:
    """A device array that speaks only DLPack, as a pre-1.0 producer
    (legacy "dltensor" capsules, no max_version), on CUDA device 0.
    Records the stream of each __dlpack__ call."""

    def __init__(self, d: DeviceArray):
        self.d, self.streams, self.keep = d, [], []

    def __dlpack_device__(self):
        return (2, 0)

    def capsule(self, m, name: bytes):
        """Describes the device array in m.dl_tensor and wraps m in a capsule
        named `name` (m and the shape are kept alive by self)."""
        shape = (ctypes.c_int64 * len(self.d.base_shape))(*self.d.base_shape)
        m.dl_tensor.data = self.d.ptr.value
        m.dl_tensor.device = DLDevice(2, 0)
        m.dl_tensor.ndim = len(self.d.base_shape)
        kind = {"i": 0, "u": 1}[self.d.dtype.kind]
        m.dl_tensor.dtype = DLDataType(kind, self.d.dtype.itemsize * 8, 1)
        m.dl_tensor.shape = shape
        self.keep.append((m, shape))
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p,
                                                       ctypes.c_void_p]
        return new(ctypes.addressof(m), name, None)

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.capsule(DLManagedTensor(), b"dltensor")


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64),
                ("dl_tensor", DLTensor)]


class DLPackDeviceV1(DLPackDevice):
    """A DLPack 1.0 producer on CUDA device 0: "dltensor_versioned" capsules,
    optionally flagged read-only."""

    def __init__(self, d: DeviceArray, read_only=False):
        super().__init__(d)
        self.read_only, self.versions = read_only, []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.streams.append(stream)
        self.versions.append(max_version)
        m = DLManagedTensorVersioned()
        m.version = DLPackVersion(1, 0)
        m.flags = 1 if self.read_only else 0  # DLPACK_FLAG_BITMASK_READ_ONLY
        return self.capsule(m, b"dltensor_versioned")


def test_gpu_lookup_takes_versioned_dlpack_and_honours_read_only(rt, gst):
    st, rows = gst
    ids = np.array([[7], [8]], np.int64)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((2, 1, 264), np.uint8))
    dl_ids = DLPackDeviceV1(d_ids, read_only=True)  # ids may be read-only
    st.lookup(["a"], dl_ids, DLPackDeviceV1(d_out))
    assert dl_ids.versions == [(1, 0)] and dl_ids.streams == [1]
    assert rt.cudaDeviceSynchronize() == 0
    np.testing.assert_array_equal(d_out.numpy()[:, 0], rows["a"][[7, 8]])
    with pytest.raises(ValueError, match="^out: the array is read-only"):
        st.lookup(["a"], dl_ids, DLPackDeviceV1(d_out, read_only=True))
    d_ids.free(), d_out.free()


def test_gpu_lookup_takes_dlpack_device_arrays_and_passes_its_stream(rt, gst):
    st, rows = gst
    ids = np.array([[1, 2], [3, -1]], np.int64)
    want = np.zeros((2, 2, 264), np.uint8)
    st.lookup(["a", "b"], ids, want)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((2, 2, 264), np.uint8))
    dl_ids, dl_out = DLPackDevice(d_ids), DLPackDevice(d_out)
    stream = ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(stream), 1) == 0
    st.lookup(["a", "b"], dl_ids, dl_out, stream=stream.value)
    # The consumer's stream goes to the producer, which orders its writes
    # before it (DLPack's handshake).
    assert dl_ids.streams == [stream.value] and dl_out.streams == [stream.value]
    assert rt.cudaStreamSynchronize(stream) == 0
    np.testing.assert_array_equal(d_out.numpy(), want)
    st.lookup(["a", "b"], dl_ids, dl_out)  # the legacy default stream is 1
    assert dl_ids.streams[-1] == 1 and dl_out.streams[-1] == 1
    assert rt.cudaDeviceSynchronize() == 0
    rt.cudaStreamDestroy(stream)
    d_ids.free(), d_out.free()


def device_count(rt) -> int:
    n = ctypes.c_int()
    assert rt.cudaGetDeviceCount(ctypes.byref(n)) == 0
    return n.value


def current_device(rt) -> int:
    d = ctypes.c_int()
    assert rt.cudaGetDevice(ctypes.byref(d)) == 0
    return d.value


def test_gpu_lookup_runs_on_the_gpu_of_its_arrays(rt, gst):
    """Arrays on GPU 1 while GPU 0 is current (torch does not switch for a
    cuda:1 tensor): the lookup must run on GPU 1, where the pointers are,
    and leave GPU 0 current; later arrays on another GPU are refused."""
    if device_count(rt) < 2:
        pytest.skip("needs two GPUs (the emulation has two with ENGRAM_EMU_DEVICES=2)")
    st, rows = gst
    ids = np.array([[1], [2]], np.int64)
    assert rt.cudaSetDevice(1) == 0
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((2, 1, 264), np.uint8))
    assert rt.cudaSetDevice(0) == 0
    st.lookup(["a"], d_ids, d_out)
    assert current_device(rt) == 0
    assert rt.cudaSetDevice(1) == 0
    np.testing.assert_array_equal(d_out.numpy()[:, 0], rows["a"][[1, 2]])
    assert rt.cudaSetDevice(0) == 0
    e_ids, e_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((2, 1, 264), np.uint8))
    with pytest.raises(ValueError, match="on GPU 0, but this store's GPU lookups run on GPU 1"):
        st.lookup(["a"], e_ids, e_out)
    with pytest.raises(ValueError, match="ids are on GPU 0 but out is on GPU 1"):
        st.lookup(["a"], e_ids, d_out)
    e_ids.free(), e_out.free()
    assert rt.cudaSetDevice(1) == 0
    d_ids.free(), d_out.free()
    assert rt.cudaSetDevice(0) == 0


def test_gpu_lookup_in_a_captured_graph(rt, gst):
    """A lookup captured into a CUDA graph and replayed with new ids in the
    same buffer; the first lookup of a store or of new tables cannot be
    captured (it registers and uploads), which is refused clearly."""
    st, rows = gst
    ids = np.array([[1, 2]], np.int64)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((1, 2, 264), np.uint8))
    s, graph, exe = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    assert rt.cudaStreamBeginCapture(s, 0) == 0  # cudaStreamCaptureModeGlobal
    with pytest.raises(engramstore.StateError, match="runs before any capture"):
        st.lookup(["a", "b"], d_ids, d_out, stream=s.value)
    assert rt.cudaStreamEndCapture(s, ctypes.byref(graph)) == 0
    rt.cudaGraphDestroy(graph)
    st.lookup(["a", "b"], d_ids, d_out, stream=s.value)  # the warm-up
    assert rt.cudaStreamSynchronize(s) == 0
    assert rt.cudaStreamBeginCapture(s, 0) == 0
    st.lookup(["a", "b"], d_ids, d_out, stream=s.value)
    assert rt.cudaStreamEndCapture(s, ctypes.byref(graph)) == 0
    assert rt.cudaGraphInstantiate(ctypes.byref(exe), graph, ctypes.c_ulonglong(0)) == 0
    for new in ([[7, 8]], [[999, 332]]):
        new = np.array(new, np.int64)
        assert rt.cudaMemcpy(d_ids.ptr, new.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(new.nbytes), H2D) == 0
        assert rt.cudaDeviceSynchronize() == 0
        assert rt.cudaGraphLaunch(exe, s) == 0
        assert rt.cudaStreamSynchronize(s) == 0
        got = d_out.numpy()
        np.testing.assert_array_equal(got[0, 0], rows["a"][new[0, 0]])
        np.testing.assert_array_equal(got[0, 1], rows["b"][new[0, 1]])
    rt.cudaGraphExecDestroy(exe), rt.cudaGraphDestroy(graph), rt.cudaStreamDestroy(s)
    d_ids.free(), d_out.free()


def test_gpu_stats_say_how_tables_are_read(rt, gst):
    st, rows = gst
    assert st.stats()["cuda"] is None  # no GPU lookup yet
    ids = np.array([[1, 2]], np.int64)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((1, 2, 264), np.uint8))
    st.lookup(["a", "b"], d_ids, d_out)
    st.lookup(["a", "b"], d_ids, d_out)
    assert rt.cudaDeviceSynchronize() == 0
    cuda = st.stats()["cuda"]
    assert cuda["device"] == current_device(rt)
    assert cuda["tables_mapped"] + cuda["tables_copied"] == 2 and cuda["tables_host"] == 0
    assert cuda["mapped_bytes"] + cuda["copied_bytes"] >= (1000 + 333) * 264
    assert (cuda["plans"], cuda["lookups"], cuda["host_gathers"]) == (1, 2, 0)
    d_ids.free(), d_out.free()


def test_gpu_lookup_of_file_backed_tables_has_a_plan_per_stream(rt, gst, tmp_path):
    """File-backed tables (no base address) go through the host path, whose
    staging serves one stream: a lookup on a second stream gets its own
    plan, and both read the right rows."""
    st, rows = gst
    fc = engramstore.EngramStore(namespace="gpu", local_dir=str(tmp_path), file_cache=True)
    ids = np.array([[1, 2], [999, 332]], np.int64)
    outs, streams = [], []
    for _ in range(2):
        s = ctypes.c_void_p()
        assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
        streams.append(s)
    d_ids = DeviceArray(rt, ids)
    for s in streams + streams:  # two lookups per stream
        d_out = DeviceArray(rt, np.zeros((2, 2, 264), np.uint8))
        fc.lookup(["a", "b"], d_ids, d_out, stream=s.value)
        outs.append(d_out)
    assert rt.cudaDeviceSynchronize() == 0
    for d_out in outs:
        got = d_out.numpy()
        np.testing.assert_array_equal(got[:, 0], rows["a"][[1, 999]])
        np.testing.assert_array_equal(got[:, 1], rows["b"][[2, 332]])
        d_out.free()
    cuda = fc.stats()["cuda"]
    assert (cuda["tables_host"], cuda["plans"], cuda["host_gathers"]) == (2, 2, 4)
    fc.close()
    for s in streams:
        rt.cudaStreamDestroy(s)
    d_ids.free()


def test_first_gpu_lookup_while_another_stream_captures(rt, gst):
    """Stream A is being captured (a torch graph, say); the store's first
    lookup goes to stream B.  Its setup (registration, allocation) runs in
    relaxed capture mode: the lookup works and A's capture stays valid."""
    st, rows = gst
    d_ids = DeviceArray(rt, np.array([[1]], np.int64))
    d_out = DeviceArray(rt, np.zeros((1, 1, 264), np.uint8))
    a, b, g = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(a), 1) == 0
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(b), 1) == 0
    assert rt.cudaStreamBeginCapture(a, 0) == 0  # global mode
    st.lookup(["a"], d_ids, d_out, stream=b.value)
    assert rt.cudaStreamEndCapture(a, ctypes.byref(g)) == 0  # not invalidated
    rt.cudaGraphDestroy(g)
    assert rt.cudaStreamSynchronize(b) == 0
    np.testing.assert_array_equal(d_out.numpy()[0, 0], rows["a"][1])
    rt.cudaStreamDestroy(a), rt.cudaStreamDestroy(b)
    d_ids.free(), d_out.free()


def test_gpu_lookup_refuses_to_join_its_producers_capture(rt, gst):
    """The ids' producer stream is being captured but the lookup's stream is
    not: waiting for it would pull the lookup into that graph.  Refused,
    and the capture stays valid."""
    st, rows = gst
    d_ids = DeviceArray(rt, np.array([[1]], np.int64))
    d_out = DeviceArray(rt, np.zeros((1, 1, 264), np.uint8))
    st.lookup(["a"], d_ids, d_out)  # the warm-up
    assert rt.cudaDeviceSynchronize() == 0
    p, g = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(p), 1) == 0
    d_ids.__cuda_array_interface__["stream"] = p.value
    assert rt.cudaStreamBeginCapture(p, 0) == 0
    with pytest.raises(engramstore.StateError, match="look up on the captured stream"):
        st.lookup(["a"], d_ids, d_out)
    assert rt.cudaStreamEndCapture(p, ctypes.byref(g)) == 0
    rt.cudaGraphDestroy(g), rt.cudaStreamDestroy(p)
    d_ids.free(), d_out.free()


def test_two_threads_first_lookups_on_two_gpus(rt, tmp_path):
    """Threads with arrays on GPU 0 and GPU 1 race for a store's first GPU
    lookup: one wins, the other is refused with 'use one store per GPU',
    never run on the winner's context from the wrong GPU."""
    if device_count(rt) < 2:
        pytest.skip("needs two GPUs (the emulation has two with ENGRAM_EMU_DEVICES=2)")
    import sys
    import threading
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    ids = np.array([[1]], np.int64)
    arrs = {}
    for dev in (0, 1):
        assert rt.cudaSetDevice(dev) == 0
        arrs[dev] = (DeviceArray(rt, ids), DeviceArray(rt, np.zeros((1, 1, 264), np.uint8)))
    assert rt.cudaSetDevice(0) == 0
    try:
        for i in range(30):
            st = engramstore.EngramStore(tables={"a": {"num_rows": 10, "row_bytes": 264}},
                                         namespace=f"r{i}", local_dir=str(tmp_path))
            st.populate("a", np.full((10, 264), 7, np.uint8))
            st.lookup(["a"], ids, np.zeros((1, 1, 264), np.uint8))  # names resolved
            bar, errs = threading.Barrier(2), {}

            def run(dev):
                bar.wait()
                try:
                    st.lookup(["a"], *arrs[dev])
                except Exception as e:  # noqa: BLE001 (any failure is examined below)
                    errs[dev] = e

            threads = [threading.Thread(target=run, args=(d,)) for d in (0, 1)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
            assert len(errs) == 1, errs  # exactly one of the two GPUs serves the store
            for e in errs.values():
                assert isinstance(e, ValueError) and "use one store per GPU" in str(e), e
            assert rt.cudaDeviceSynchronize() == 0
            st.close()
    finally:
        sys.setswitchinterval(switch)
        for dev, (a, b) in arrs.items():
            assert rt.cudaSetDevice(dev) == 0
            a.free(), b.free()
        assert rt.cudaSetDevice(0) == 0


def test_file_backed_plans_refuse_the_per_thread_stream_and_are_bounded(rt, gst, tmp_path):
    """cudaStreamPerThread (handle 2) is another stream in each thread, so
    per-stream staging cannot serve it: refused.  One (tables, offsets)
    gets plans for at most 16 streams."""
    st, rows = gst
    fc = engramstore.EngramStore(namespace="gpu", local_dir=str(tmp_path), file_cache=True)
    d_ids = DeviceArray(rt, np.array([[1, 2]], np.int64))
    d_out = DeviceArray(rt, np.zeros((1, 2, 264), np.uint8))
    with pytest.raises(ValueError, match="cudaStreamPerThread is another stream in each thread"):
        fc.lookup(["a", "b"], d_ids, d_out, stream=2)
    streams = []
    with pytest.raises(engramstore.StateError, match="plans for 16 streams"):
        for _ in range(20):
            s = ctypes.c_void_p()
            assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
            streams.append(s)
            fc.lookup(["a", "b"], d_ids, d_out, stream=s.value)
    assert len(streams) == 17  # 16 plans, then refused
    assert rt.cudaDeviceSynchronize() == 0
    np.testing.assert_array_equal(d_out.numpy()[0, 0], rows["a"][1])
    assert fc.stats()["cuda"]["plans"] == 16
    fc.close()
    for s in streams:
        rt.cudaStreamDestroy(s)
    d_ids.free(), d_out.free()


def test_file_backed_plan_grows_for_a_larger_lookup(rt, gst, tmp_path):
    """The staging of a file-backed plan is sized by its first lookup (16384
    tokens at least); a larger lookup later gets a larger plan in its place
    (at least twice as large), not an error."""
    st, rows = gst
    fc = engramstore.EngramStore(namespace="gpu", local_dir=str(tmp_path), file_cache=True)
    rng = np.random.default_rng(3)
    for T in (1, 20000, 5, 50000):
        ids = rng.integers(0, 1000, (T, 1)).astype(np.int64)
        d_ids = DeviceArray(rt, ids)
        d_out = DeviceArray(rt, np.zeros((T, 1, 264), np.uint8))
        fc.lookup(["a"], d_ids, d_out)
        assert rt.cudaDeviceSynchronize() == 0
        np.testing.assert_array_equal(d_out.numpy()[:, 0], rows["a"][ids[:, 0]])
        d_ids.free(), d_out.free()
    # 16384 tokens, then 32768 for 20000, then 65536 for 50000; the two
    # replaced plans are kept until close (a thread may still be using one).
    assert fc.stats()["cuda"]["plans"] == 3
    # Growing allocates: not while the stream is being captured.
    T = 70000
    s, g = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    one_id = DeviceArray(rt, np.zeros((1, 1), np.int64))
    one_row = DeviceArray(rt, np.zeros((1, 1, 264), np.uint8))
    fc.lookup(["a"], one_id, one_row, stream=s.value)  # the stream's plan
    one_id.free(), one_row.free()
    d_ids = DeviceArray(rt, np.zeros((T, 1), np.int64))
    d_out = DeviceArray(rt, np.zeros((T, 1, 264), np.uint8))
    assert rt.cudaStreamSynchronize(s) == 0
    assert rt.cudaStreamBeginCapture(s, 0) == 0
    with pytest.raises(engramstore.StateError, match="grows its staging"):
        fc.lookup(["a"], d_ids, d_out, stream=s.value)
    assert rt.cudaStreamEndCapture(s, ctypes.byref(g)) == 0
    rt.cudaGraphDestroy(g), rt.cudaStreamDestroy(s)
    d_ids.free(), d_out.free()
    fc.close()


def test_file_backed_lookups_from_two_threads_on_one_stream(rt, tmp_path):
    """Two threads enqueue lookups of one file-backed plan on one stream: the
    host path's five operations (pack ids, copy out, host gather, copy in,
    kernel) of one lookup must not interleave with the other's, or one
    copies out the other's staging."""
    import threading
    rows = np.arange(64, dtype=np.uint8)[:, None].repeat(8, 1)  # row r is all r
    with engramstore.EngramStore(tables={"t": {"num_rows": 64, "row_bytes": 8}},
                                 namespace="s2", local_dir=str(tmp_path)) as w:
        w.populate("t", rows)
    fc = engramstore.EngramStore(namespace="s2", local_dir=str(tmp_path), file_cache=True)
    s = ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1) == 0
    T, N = 4, 400
    ids = [DeviceArray(rt, np.full((T, 1), v, np.int64)) for v in (1, 2)]
    outs = [[DeviceArray(rt, np.zeros((T, 1, 8), np.uint8)) for _ in range(N)] for _ in range(2)]
    fc.lookup(["t"], ids[0], outs[0][0], stream=s.value)  # the plan, made once
    assert rt.cudaStreamSynchronize(s) == 0
    bar = threading.Barrier(2)

    def run(i):
        bar.wait()
        for o in outs[i]:
            fc.lookup(["t"], ids[i], o, stream=s.value)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert rt.cudaStreamSynchronize(s) == 0
    wrong = [sum(not (o.numpy() == i + 1).all() for o in outs[i]) for i in range(2)]
    assert wrong == [0, 0]
    fc.close()
    rt.cudaStreamDestroy(s)
    for d in ids + outs[0] + outs[1]:
        d.free()


def test_threads_racing_to_make_plans(rt, tmp_path):
    """Sixteen threads make plans at once (four on one key, twelve on new
    keys, past the plan table's first capacity): a thread that loses a race
    must not read the table after another has moved it (ASan, in the
    emulated run, sees such a read)."""
    import threading
    names = [f"t{i}" for i in range(20)]
    with engramstore.EngramStore(tables={n: {"num_rows": 64, "row_bytes": 264} for n in names},
                                 namespace="race", local_dir=str(tmp_path)) as w:
        for n in names:
            w.populate(n, np.full((64, 264), 7, np.uint8))
    d_ids = DeviceArray(rt, np.array([[1]], np.int64))
    d_out = DeviceArray(rt, np.zeros((1, 1, 264), np.uint8))
    for _ in range(10):
        s = engramstore.EngramStore(namespace="race", local_dir=str(tmp_path))
        for n in names[:7]:  # 7 plans: the table's first capacity is 8
            s.lookup([n], d_ids, d_out)
        keys = [names[7]] * 4 + names[8:20]
        bar, errs = threading.Barrier(len(keys)), []

        def run(n):
            bar.wait()
            try:
                s.lookup([n], d_ids, d_out)
            except Exception as e:  # noqa: BLE001 (collected and shown below)
                errs.append(e)

        threads = [threading.Thread(target=run, args=(n,)) for n in keys]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert not errs, errs
        assert rt.cudaDeviceSynchronize() == 0
        assert s.stats()["cuda"]["plans"] == 20  # the 4 racers on one key made one
        s.close()
    d_ids.free(), d_out.free()


def test_gpu_lookup_refuses_to_wait_for_the_legacy_stream_during_a_capture(rt, gst):
    """The ids name the legacy stream as their producer while a blocking
    stream is being captured: the legacy stream cannot be used then, so the
    lookup on a stream that is not captured cannot be ordered after it."""
    st, rows = gst
    d_ids = DeviceArray(rt, np.array([[1]], np.int64))
    d_out = DeviceArray(rt, np.zeros((1, 1, 264), np.uint8))
    st.lookup(["a"], d_ids, d_out)  # the warm-up
    assert rt.cudaDeviceSynchronize() == 0
    blocking, other, g = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(blocking), 0) == 0
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(other), 1) == 0
    d_ids.__cuda_array_interface__["stream"] = 1
    assert rt.cudaStreamBeginCapture(blocking, 2) == 0  # relaxed: only the rule under test
    with pytest.raises(engramstore.StateError, match="legacy default stream"):
        st.lookup(["a"], d_ids, d_out, stream=other.value)
    assert rt.cudaStreamEndCapture(blocking, ctypes.byref(g)) == 0
    rt.cudaGraphDestroy(g), rt.cudaStreamDestroy(blocking), rt.cudaStreamDestroy(other)
    d_ids.free(), d_out.free()


def test_gpu_bad_id_is_skipped_and_reported(rt, gst):
    st, rows = gst
    ids = np.array([[0], [1000], [7]], np.int64)  # 1000 is outside 'a'
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.full((3, 1, 264), 0x5A, np.uint8))
    st.lookup(["a"], d_ids, d_out)
    got = d_out.numpy()  # synchronises (legacy default stream)
    np.testing.assert_array_equal(got[0, 0], rows["a"][0])
    assert (got[1, 0] == 0x5A).all()  # skipped: untouched
    np.testing.assert_array_equal(got[2, 0], rows["a"][7])
    with pytest.raises(engramstore.BadIdError, match="1000") as ei:
        st.cuda_check()
    assert (ei.value.position, ei.value.id) == ((1, 0), 1000)
    assert st.cuda_check() is None  # read and cleared
    d_ids.free(), d_out.free()


def test_gpu_id_minus_offset_is_exact(rt, gst):
    """id - offset is an exact integer on the GPU too: INT64_MIN + r is
    2^64 - 1 - r below the offset INT64_MAX, not row 1 + r of 'a'."""
    st, rows = gst
    i64_min, i64_max = -2 ** 63, 2 ** 63 - 1
    ids = np.array([[i64_max], [i64_min], [i64_min + 998], [-1]], np.int64)
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.full((4, 1, 264), 0x5A, np.uint8))
    st.lookup(["a"], d_ids, d_out, offsets=np.array([i64_max], np.int64))
    got = d_out.numpy()
    np.testing.assert_array_equal(got[0, 0], rows["a"][0])
    assert (got[1:, 0] == 0x5A).all()  # skipped (and the dead one kept)
    with pytest.raises(engramstore.BadIdError) as ei:
        st.cuda_check()
    assert (ei.value.position, ei.value.id) == ((1, 0), i64_min)
    assert st.cuda_check() is None
    d_ids.free(), d_out.free()


def test_gpu_layer_api(rt, tmp_path):
    cfg = engramstore.EngramStoreConfig([17, 19], 264)
    heads = [np.full((n, 264), h + 1, np.uint8) for h, n in enumerate([17, 19])]
    t = engramstore.EngramStore({3: cfg}, store=None)
    t.bind_local(3, heads)
    row_ids = np.array([[[16, 18], [0, -1]]], np.int64)
    d_ids = DeviceArray(rt, row_ids)
    d_out = DeviceArray(rt, np.zeros((1, 2, 2, 264), np.uint8))
    t.lookup_into(3, d_ids, d_out)
    got = d_out.numpy()
    assert (got[0, 0, 0] == 1).all() and (got[0, 0, 1] == 2).all() and (got[0, 1, 1] == 0).all()
    t.close()
    d_ids.free(), d_out.free()


FINALIZER_SCRIPT = r"""
import gc, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
import engramstore
import test_cuda_gpu as t

rt = t.runtime()


class Closer:
    # A reference cycle: only the garbage collector frees it, at whatever
    # allocation comes next, and its finalizer closes the store.
    def __init__(self, st):
        self.st, self.me = st, self

    def __del__(self):
        self.st.close()


class Trap:
    # A device array whose interface, when the lookup reads it, leaves a
    # Closer behind as garbage.
    def __init__(self, inner, st):
        self.inner, self.st = inner, st

    @property
    def __cuda_array_interface__(self):
        Closer(self.st)
        return self.inner.__cuda_array_interface__


d_ids = t.DeviceArray(rt, np.array([[1], [2]], np.int64))
d_out = t.DeviceArray(rt, np.zeros((2, 1, 264), np.uint8))
outcomes = {"closed": 0, "done": 0}
for i in range(40):
    st = engramstore.EngramStore(tables={"a": {"num_rows": 10, "row_bytes": 264}},
                                 namespace=f"fin{i}", local_dir=sys.argv[2])
    st.populate("a", np.full((10, 264), 7, np.uint8))
    gc.collect()
    gc.set_threshold(1)
    try:
        st.lookup(["a"], Trap(d_ids, st), Trap(d_out, st))
        outcomes["done"] += 1
    except engramstore.StoreClosedError:
        outcomes["closed"] += 1
    finally:
        gc.set_threshold(700)
    gc.collect()
    st.close()
d_ids.free(), d_out.free()
print("finished", outcomes)
"""


def test_gpu_lookup_survives_a_finalizer_that_closes_the_store(rt, tmp_path):
    """A finalizer run by the garbage collector may close the store while
    a GPU lookup is between its argument checks and its return.  The
    lookup must never wait for itself: it creates no Python object while
    it holds the store.  Run in a child, so a hang is a timeout, not a
    stuck suite."""
    import subprocess
    import sys
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", FINALIZER_SCRIPT, here, str(tmp_path)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "finished" in r.stdout, r.stdout


@pytest.mark.skipif(not EMU, reason="needs the emulation's fault injection")
def test_gpu_lookup_fails_cleanly_at_every_runtime_call(rt, gst, tmp_path):
    """The first GPU lookup of a store (context, event, plan, the wait for
    the ids' producer stream, the launch) with the n-th runtime call that
    can fail failing, for every n: an exception with a message, or exact
    rows, and nothing left behind either way."""
    _, rows = gst
    rt.emu_fail_nth_call.argtypes = [ctypes.c_long]
    rt.emu_live_objects.restype = ctypes.c_long
    ids = np.array([[3, 4], [5, -1]], np.int64)
    want = np.zeros((2, 2, 264), np.uint8)
    want[:, 0] = rows["a"][[3, 5]]
    want[0, 1] = rows["b"][4]
    producer, consumer = ctypes.c_void_p(), ctypes.c_void_p()
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(producer), 1) == 0
    assert rt.cudaStreamCreateWithFlags(ctypes.byref(consumer), 1) == 0
    d_ids, d_out = DeviceArray(rt, ids), DeviceArray(rt, np.zeros((2, 2, 264), np.uint8))
    d_ids.__cuda_array_interface__["stream"] = producer.value
    base, errors = rt.emu_live_objects(), 0
    for n in range(1, 1000):
        st = engramstore.EngramStore(namespace="gpu", local_dir=str(tmp_path))
        assert rt.cudaMemset(d_out.ptr, 0, ctypes.c_size_t(d_out.nbytes)) == 0
        assert rt.cudaDeviceSynchronize() == 0
        rt.emu_fail_nth_call(n)
        try:
            st.lookup(["a", "b"], d_ids, d_out, stream=consumer.value)
            ok = True
        except (engramstore.EngramError, MemoryError) as e:
            assert str(e)
            ok, errors = False, errors + 1
        finally:
            failed = rt.emu_failed()
            rt.emu_fail_nth_call(0)
        if ok:
            assert rt.cudaStreamSynchronize(consumer) == 0
            np.testing.assert_array_equal(d_out.numpy(), want)
        else:
            assert failed  # no error without a cause
        st.close()
        assert rt.emu_live_objects() == base, f"call {n} failing left objects behind"
        if not failed:
            break
    else:
        raise AssertionError("the lookup never ran without a failure")
    print(f"{n - 1} runtime calls failed in turn: {errors} errors")
    assert errors > 10
    rt.cudaStreamDestroy(producer), rt.cudaStreamDestroy(consumer)
    d_ids.free(), d_out.free()
