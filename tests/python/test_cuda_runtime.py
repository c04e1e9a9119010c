"""A CUDA build of the package where the CUDA runtime is missing: `import
engramstore` and lookups into host memory work, nothing loads the runtime
before the first GPU lookup, and a GPU lookup that cannot load it raises
ImportError naming the library, where it was looked for and how to get it.

Each case runs in a child interpreter, whose loaded libraries are its own
(/proc/self/maps says whether libcudart is among them).  The runtime is
hidden through ENGRAMSTORE_CUDART naming a path that does not exist: the
package then looks nowhere else, which is the path a machine without the
runtime takes too (there the loader's own search fails as well).  The GPU
lookups pass arrays of zero tokens, so that a machine with a GPU only
opens a context and reads no memory."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import engramstore

pytestmark = [
    pytest.mark.skipif(not engramstore.HAVE_CUDA, reason="engramstore built without CUDA"),
    pytest.mark.skipif(os.environ.get("ENGRAM_TEST_CUDA_EMU") == "1",
                       reason="the emulated runtime is inside the GPU module: nothing to load"),
]

CHILD = r"""
import json, os, sys
import numpy as np

def cudart_loaded():
    with open("/proc/self/maps") as f:
        return "libcudart" in f.read()

import engramstore
r = {"after_import": cudart_loaded()}

st = engramstore.EngramStore(local_dir=None)
st.bind("a", np.arange(32, dtype=np.uint8).reshape(4, 8))

def host_lookup():
    out = np.zeros((2, 1, 8), np.uint8)
    st.lookup(["a"], np.array([[3], [1]], np.int64), out)
    return out[:, 0, 0].tolist()

class Device:  # GPU memory as __cuda_array_interface__ announces it
    def __init__(self, shape, typestr):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0, False),
                                         "strides": None, "version": 3}

def gpu_lookup():
    try:
        st.lookup(["a"], Device((0, 1), "<i8"), Device((0, 1, 8), "|u1"))
        return {"raised": None}
    except Exception as e:
        return {"raised": type(e).__name__, "msg": str(e), "errno": getattr(e, "errno", None),
                "cause": repr(e.__cause__)}

r["host"] = host_lookup()
r["after_host"] = cudart_loaded()
r["gpu"] = gpu_lookup()
r["after_gpu"] = cudart_loaded()
r["host_again"] = host_lookup()
r["stats_cuda"] = st.stats()["cuda"]
if len(sys.argv) > 1:  # then the default search, in the same process: nothing was cached
    os.environ.pop("ENGRAMSTORE_CUDART")
    r["gpu_default"] = gpu_lookup()
    r["after_gpu_default"] = cudart_loaded()
st.close()
print(json.dumps(r))
"""


def run_child(env_cudart, *args):
    env = dict(os.environ)
    env.pop("ENGRAMSTORE_CUDART", None)
    if env_cudart is not None:
        env["ENGRAMSTORE_CUDART"] = env_cudart
    proc = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def assert_past_loading(gpu):
    """The runtime was loaded and the lookup went on: without a GPU (or
    driver) it raises ENODEV; with one, zero tokens are a no-op."""
    if gpu["raised"] is not None:
        import errno
        assert gpu["raised"] == "EngramError", gpu
        assert gpu["errno"] == errno.ENODEV and "no CUDA device" in gpu["msg"], gpu


def test_host_lookups_never_load_the_runtime_and_a_gpu_lookup_does(tmp_path):
    r = run_child(None)
    assert r["after_import"] is False, "import engramstore loaded libcudart"
    assert r["host"] == [24, 8] and r["after_host"] is False
    assert r["after_gpu"] is True, r
    assert_past_loading(r["gpu"])
    assert r["host_again"] == [24, 8]


def test_missing_runtime_raises_a_clear_import_error_and_host_lookups_go_on(tmp_path):
    missing = str(tmp_path / "no-such-dir" / "libcudart.so.13")
    r = run_child(missing, "then-default")
    assert r["after_import"] is False and r["host"] == [24, 8]
    gpu = r["gpu"]
    assert gpu["raised"] == "ImportError", gpu
    msg = gpu["msg"]
    # What is missing, where it was looked for, and how to get it.
    assert msg.startswith("GPU lookups need the CUDA runtime libcudart.so."), msg
    assert f"ENGRAMSTORE_CUDART={missing} could not be loaded: {missing}: cannot open shared " \
           f"object file" in msg, msg
    assert "Install the CUDA" in msg and "pip install nvidia-cuda-runtime" in msg, msg
    assert "LD_LIBRARY_PATH" in msg and "Lookups into host memory do not need it" in msg, msg
    assert r["after_gpu"] is False
    # The store is intact: host lookups go on, and no GPU context was made.
    assert r["host_again"] == [24, 8] and r["stats_cuda"] is None
    # A failure is not remembered: with the variable gone, the runtime is
    # found where the package looks by default (the loader's path, then
    # the toolkit it was built with), as on any machine that has it.
    assert r["after_gpu_default"] is True, r
    assert_past_loading(r["gpu_default"])


def test_a_wrong_library_is_refused_by_name(tmp_path):
    # A file that is not a shared object: dlopen's own reason is passed on.
    bogus = tmp_path / "libcudart.so.13"
    bogus.write_bytes(b"not an ELF file")
    r = run_child(str(bogus))
    gpu = r["gpu"]
    assert gpu["raised"] == "ImportError", gpu
    assert f"ENGRAMSTORE_CUDART={bogus} could not be loaded: {bogus}: " in gpu["msg"], gpu
    assert r["after_gpu"] is False and r["host_again"] == [24, 8]
