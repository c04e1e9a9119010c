"""Helpers shared by the engramstore tests (importable from spawned children,
so this module stays light: numpy, engramstore and the standard library)."""
from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Iterator

import numpy as np

import engramstore

SENTINEL = 0xA5


@contextlib.contextmanager
def shm_root(prefix: str = "engram-py-") -> Iterator[str]:
    """A directory of its own under /dev/shm (a tmpfs), removed after;
    pytest.skip() where there is none."""
    if not os.path.isdir("/dev/shm"):
        import pytest
        pytest.skip("no /dev/shm (a tmpfs) on this machine")
    d = tempfile.mkdtemp(dir="/dev/shm", prefix=prefix)
    try:
        yield d
    finally:
        shutil.rmtree(d, ignore_errors=True)


def make_rows(num_rows: int, row_bytes: int, seed: int) -> np.ndarray:
    """Deterministic random table contents, C-contiguous uint8 [N, R]."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (num_rows, row_bytes), dtype=np.uint8)


def expected(tables: dict, names, ids, offsets=None, out=None) -> np.ndarray:
    """The lookup result computed with numpy (np.take): out[t, k] =
    tables[names[k]][ids[t, k] - offsets[k]]; dead ids (-1) keep `out`'s
    row (or the sentinel if out is None)."""
    ids = np.asarray(ids)
    T, K = ids.shape
    R = tables[names[0]].shape[1] if K else 0
    res = np.full((T, K, R), SENTINEL, np.uint8) if out is None else np.array(out, copy=True)
    off = np.zeros(K, np.int64) if offsets is None else np.asarray(offsets)
    for k, name in enumerate(names):
        col = ids[:, k].astype(np.int64)
        live = col != -1
        res[live, k] = np.take(tables[name], col[live] - off[k], axis=0)
    return res


def sentinel(shape) -> np.ndarray:
    return np.full(shape, SENTINEL, np.uint8)


def run_in_threads(work, n: int = 4) -> list:
    """Runs work(i) for i in range(n), each in its own thread, and returns
    the exceptions they raised."""
    errors = []

    def run(i):
        try:
            work(i)
        except Exception as e:  # noqa: BLE001 - returned to the test
            errors.append(e)

    ths = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return errors


def table_path(store, name: str) -> str:
    return os.path.join(store.path, name)


def data_offset(path: str, data_size: int) -> int:
    """Byte offset of row 0 in a table file: the data is the file's tail."""
    return os.path.getsize(path) - data_size


# ---- array wrappers that only speak one protocol -------------------------

class DLPackOnly:
    """Exposes a numpy array through DLPack only (no buffer protocol), the
    way a torch CPU tensor does.  Records the keyword arguments of each
    __dlpack__ call."""

    def __init__(self, a):
        self._a = a
        self.calls = []

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        self.calls.append({"stream": stream, "max_version": max_version})
        kw = {} if max_version is None else {"max_version": max_version}
        return self._a.__dlpack__(stream=stream, **kw)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class LegacyDLPackOnly:
    """A pre-1.0 DLPack producer: __dlpack__ takes no max_version and returns
    a legacy "dltensor" capsule."""

    def __init__(self, a):
        self._a = a
        self.calls = 0

    def __dlpack__(self, stream=None):
        self.calls += 1
        return self._a.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


class FakeCudaArrayInterface:
    """Device memory announced through __cuda_array_interface__."""

    def __init__(self, shape=(4, 3), typestr="<i8"):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (0x7F0000000000, False),
            "version": 3, "strides": None}


class FakeDLPackDevice:
    """A DLPack producer whose __dlpack_device__ names a device (default
    kDLCUDA = 2); __dlpack__ must never be called for it."""

    def __init__(self, device_type=2):
        self.device_type = device_type
        self.dlpack_called = False

    def __dlpack__(self, **kw):
        self.dlpack_called = True
        raise AssertionError("__dlpack__ called on a device array")

    def __dlpack_device__(self):
        return (self.device_type, 0)


# ---- children for multiprocessing tests (module level: picklable) --------

def smaps_entries(path: str) -> list[dict]:
    """The /proc/self/smaps records of the mappings of file `path`."""
    entries, cur = [], None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split(None, 5)
            if head and "-" in head[0] and len(head) >= 5 and ":" in head[3]:
                cur = None
                if len(head) == 6 and head[5].strip() == path:
                    cur = {"range": head[0], "offset": int(head[2], 16)}
                    entries.append(cur)
            elif cur is not None and line.rstrip().endswith(" kB"):
                key, val = line.split(":", 1)
                cur[key] = int(val.split()[0]) * 1024
    return entries


def child_lookup_all_and_smaps(local_dir: str, namespace: str, name: str, num_rows: int,
                               row_bytes: int, seed: int) -> dict:
    """Opens the namespace, looks up every row of `name`, checks the rows,
    and returns the smaps records of the table file's mappings."""
    rows = make_rows(num_rows, row_bytes, seed)
    with engramstore.EngramStore(tables={name: {"num_rows": num_rows, "row_bytes": row_bytes}},
                                 namespace=namespace, local_dir=local_dir) as st:
        out = np.zeros((num_rows, 1, row_bytes), np.uint8)
        st.lookup([name], np.arange(num_rows, dtype=np.int64).reshape(-1, 1), out)
        ok = bool(np.array_equal(out[:, 0], rows))
        path = table_path(st, name)
        return {"ok": ok, "smaps": smaps_entries(path), "pid": os.getpid()}


def child_populate(local_dir: str, namespace: str, name: str, num_rows: int, row_bytes: int,
                   seed: int) -> str:
    """Populates `name` in a fresh store and returns 'ok' or the error's
    class name (TableExistsError when another process won)."""
    st = engramstore.EngramStore(namespace=namespace, local_dir=local_dir)
    try:
        st.populate(name, make_rows(num_rows, row_bytes, seed))
        return "ok"
    except engramstore.EngramError as e:
        return type(e).__name__
    finally:
        st.close()


def child_lookup_with(store, name: str, ids, rows) -> bool:
    """Looks up with a store object inherited through fork."""
    out = np.zeros((len(ids), 1, rows.shape[1]), np.uint8)
    store.lookup([name], ids.reshape(-1, 1), out)
    return bool(np.array_equal(out[:, 0], np.take(rows, ids, axis=0)))
