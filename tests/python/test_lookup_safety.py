"""Regression tests from a review of the extension: layouts that must never
reach the library, the table-name memo and cache under concurrent changes,
close() re-entered from inside a call, and hostile DLPack producers."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from numpy.lib.stride_tricks import as_strided

import engramstore
from esutil import SENTINEL, expected, make_rows, sentinel

R = 264


# ---- all-zero strides: the library reads (0, 0) as "contiguous" ----------

@pytest.mark.parametrize("shape", [(4, 1, R), (2, 2, R), (3, 2, R)])
def test_out_with_all_zero_strides_is_a_layout_error(ab, shape):
    st, _ = ab
    T, K, _ = shape
    guard = np.full(R * 16, SENTINEL, np.uint8)
    out = as_strided(guard[:R], shape=shape, strides=(0, 0, 1), writeable=True)
    with pytest.raises(engramstore.LayoutError, match="^out: "):
        st.lookup(["a"] * K, np.zeros((T, K), np.int64), out)
    assert (guard == SENTINEL).all()  # nothing written, in or past the one row


def test_layer_output_with_all_zero_strides_is_a_layout_error(config, rows_a, rows_b):
    with engramstore.EngramStore({1: config([17, 19], R)}, store=None) as t:
        t.bind_local(1, [rows_a, rows_b])
        guard = np.full(R * 16, SENTINEL, np.uint8)
        out = as_strided(guard[:R], shape=(2, 2, 2, R), strides=(0, 0, 0, 1), writeable=True)
        with pytest.raises(engramstore.LayoutError, match="^output: "):
            t.lookup_into(1, np.zeros((2, 2, 2), np.int64), out)
        assert (guard == SENTINEL).all()


def test_ids_with_all_zero_strides(ab):
    st, tabs = ab
    # One column or one token: the stride of the other dimension is unused.
    for T, K in ((4, 1), (1, 3), (1, 1)):
        ids = np.broadcast_to(np.int64(5), (T, K))
        assert ids.strides == (0, 0)
        out = sentinel((T, K, R))
        st.lookup(["b"] * K, ids, out)
        np.testing.assert_array_equal(out, expected(tabs, ["b"] * K, np.full((T, K), 5)))
    # Several of both cannot be described to the library without a copy.
    out = sentinel((4, 2, R))
    with pytest.raises(ValueError, match="^ids: "):
        st.lookup(["a", "b"], np.broadcast_to(np.int64(5), (4, 2)), out)
    assert (out == SENTINEL).all()


# ---- ids and offsets at the ends of int64 ---------------------------------

I64_MIN, I64_MAX = -2 ** 63, 2 ** 63 - 1
I32_MIN, I32_MAX = -2 ** 31, 2 ** 31 - 1


@pytest.mark.parametrize("offset,bad", [
    (I64_MAX, I64_MIN),         # id - offset = -2^64 + 1, which is 1 modulo 2^64
    (I64_MAX, I64_MIN + 15),    # ... 16 modulo 2^64
    (I64_MAX - 5, I64_MIN),     # ... 6 modulo 2^64
    (I64_MAX - 17, I64_MAX),    # id - offset = num_rows
    (I64_MIN, I64_MAX),         # 2^64 - 1
    (I64_MIN, I64_MIN + 17),    # num_rows
    (-1, I64_MAX),              # 2^63
])
def test_id_minus_offset_is_exact(ab, offset, bad):
    """An id is a row when 0 <= id - offset < num_rows as integers: a
    difference beyond int64 never wraps onto a row."""
    st, tabs = ab
    offsets = np.array([offset], np.int64)
    # Table a has 17 rows: ids offset .. offset + 16, as far as int64 goes
    # (-1 is dead, whatever the offset).
    good = [i for i in range(offset, offset + 17) if i <= I64_MAX and i != -1]
    out = sentinel((len(good), 1, R))
    st.lookup(["a"], np.array([[i] for i in good], np.int64), out, offsets=offsets)
    for t, i in enumerate(good):
        np.testing.assert_array_equal(out[t, 0], tabs["a"][i - offset])
    out = sentinel((2, 1, R))
    with pytest.raises(engramstore.BadIdError, match=rf"^ids\[1\]\[0\] = {bad} ") as ei:
        st.lookup(["a"], np.array([[good[0]], [bad]], np.int64), out, offsets=offsets)
    assert (ei.value.position, ei.value.id) == ((1, 0), bad)
    assert (out == SENTINEL).all()


def test_int32_ids_with_offsets_beyond_int32(ab):
    st, tabs = ab
    out = sentinel((2, 1, R))
    st.lookup(["a"], np.array([[I32_MIN], [I32_MIN + 16]], np.int32), out,
              offsets=np.array([I32_MIN], np.int64))
    np.testing.assert_array_equal(out[:, 0], tabs["a"][[0, 16]])
    for offset, bad in ((I64_MAX, I32_MIN), (I64_MIN, I32_MAX), (I32_MAX - 16, I32_MIN),
                        (I32_MIN - 17, I32_MIN)):
        out = sentinel((1, 1, R))
        with pytest.raises(engramstore.BadIdError) as ei:
            st.lookup(["a"], np.array([[bad]], np.int32), out,
                      offsets=np.array([offset], np.int64))
        assert ei.value.id == bad
        assert (out == SENTINEL).all()


# ---- the name memo and the table cache ------------------------------------

class HookedName(str):
    """A table name whose hash runs a hook on its n-th call.  The extension
    used to probe its caches with the names as given, so the hook ran in
    the middle of name resolution, as another thread would while the GIL is
    released there; it now probes with exact str copies, and the hook may
    not run at all.  Either way the outcome must be right."""

    def __new__(cls, value, at, hook):
        self = super().__new__(cls, value)
        self.at, self.hook, self.calls = at, hook, 0
        return self

    def __hash__(self):
        self.calls += 1
        if self.calls == self.at:
            self.hook()
        return str.__hash__(self)


def test_memo_is_not_poisoned_by_a_list_changed_during_resolution(ab):
    st, tabs = ab
    ids = np.array([[1, 2], [3, 4]], np.int64)
    names = ["a", None]
    names[1] = HookedName("b", 1, lambda: names.__setitem__(0, "".join(["b"])))
    try:
        st.lookup(names, ids, sentinel((2, 2, R)))
    except RuntimeError:
        pass  # the list changed under the lookup
    names[0] = "".join(["b"])  # (if the hook did not run)
    out = sentinel((2, 2, R))
    st.lookup(names, ids, out)  # the very same name objects: the memo path
    np.testing.assert_array_equal(out, expected(tabs, ["b", "b"], ids))


def test_remove_during_resolution_leaves_no_stale_memo(ab):
    st, _ = ab
    ids = np.array([[1, 2]], np.int64)
    a = "".join(["a"])
    names = [a, HookedName("b", 1, lambda: st.remove("a"))]
    try:
        st.lookup(names, ids, sentinel((1, 2, R)))
    except engramstore.TableRemovedError:
        pass
    if "a" in st.list_tables():  # (if the hook did not run)
        st.remove("a")
    new_a = make_rows(17, R, seed=99)
    st.populate("a", new_a)
    out = sentinel((1, 2, R))
    st.lookup(names, ids, out)  # same objects: must not reuse the removed table's id
    np.testing.assert_array_equal(out[0, 0], new_a[1])


def test_remove_during_resolution_leaves_no_stale_cache(ab):
    st, _ = ab
    ids = np.array([[3]], np.int64)
    # Hash calls of a first resolution: the table cache probe, then the
    # declared-spec probe once the table is open (the GIL was released).
    name = HookedName("a", 2, lambda: st.remove("a"))
    try:
        st.lookup([name], ids, sentinel((1, 1, R)))
    except engramstore.TableRemovedError:
        pass
    if "a" in st.list_tables():  # (if the hook did not run)
        st.remove("a")
    new_a = make_rows(17, R, seed=98)
    st.populate("a", new_a)
    out = sentinel((1, 1, R))
    st.lookup(["a"], ids, out)
    np.testing.assert_array_equal(out[0, 0], new_a[3])


# ---- close() from inside a call on the same thread -------------------------

REENTRANT_CLOSE = textwrap.dedent("""
    import sys, numpy as np, engramstore
    root = sys.argv[1]
    st = engramstore.EngramStore(namespace="ns", local_dir=root)
    st.populate("a", np.zeros((4, 8), np.uint8))
    st.lookup(["a"], np.zeros((1, 1), np.int64), np.zeros((1, 1, 8), np.uint8))

    class ClosingIds:
        # No buffer protocol: taken through DLPack, which runs this code.
        def __init__(self, a):
            self.a = a
        def __dlpack_device__(self):
            return self.a.__dlpack_device__()
        def __dlpack__(self, **kw):
            st.close()
            return self.a.__dlpack__(**kw)

    try:
        st.lookup(["a"], ClosingIds(np.zeros((1, 1), np.int64)), np.zeros((1, 1, 8), np.uint8))
    except engramstore.StoreClosedError:
        print("closed")
    print(st.closed)
""")


def test_close_from_inside_a_lookup_does_not_deadlock(tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    script = tmp_path / "reenter.py"
    script.write_text(REENTRANT_CLOSE)
    try:
        proc = subprocess.run([sys.executable, str(script), str(root)], capture_output=True,
                              text=True, timeout=30, env=dict(os.environ))
    except subprocess.TimeoutExpired:
        pytest.fail("close() called from inside lookup() deadlocked")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["closed", "True"]


# ---- hostile DLPack producers ------------------------------------------------

_GetPointer = ctypes.pythonapi.PyCapsule_GetPointer
_GetPointer.restype = ctypes.c_void_p
_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


class TamperedDLPack:
    """A legacy DLPack producer whose capsule reports another shape (or
    strides) than the memory it points to has."""

    def __init__(self, a, shape=None, strides=None):
        self._a, self._shape, self._strides = a, shape, strides

    def __dlpack__(self, stream=None):
        cap = self._a.__dlpack__(stream=stream)
        mt = _GetPointer(cap, b"dltensor")
        # DLTensor: data, device (2 x int32), ndim, dtype, shape*, strides*, byte_offset
        shape_p = ctypes.c_void_p.from_address(mt + 24).value
        strides_p = ctypes.c_void_p.from_address(mt + 32).value
        if self._shape is not None:
            (ctypes.c_int64 * len(self._shape)).from_address(shape_p)[:] = self._shape
        if self._strides is not None:
            (ctypes.c_int64 * len(self._strides)).from_address(strides_p)[:] = self._strides
        return cap

    def __dlpack_device__(self):
        return self._a.__dlpack_device__()


def test_dlpack_negative_shape_is_refused(ab):
    st, _ = ab
    ids = np.zeros((2, 1), np.int64)
    out = sentinel((2, 1, R))
    with pytest.raises(ValueError, match="^ids: "):
        st.lookup(["a"], TamperedDLPack(ids, shape=[-2, 1]), out)
    with pytest.raises(ValueError, match="^out: "):
        st.lookup(["a"], ids, TamperedDLPack(out, shape=[2, 1, -R]))
    assert (out == SENTINEL).all()


def test_dlpack_extent_overflow_is_refused(ab):
    st, _ = ab
    ids = np.zeros((2, 1), np.int64)
    out = sentinel((2, 1, R))
    with pytest.raises(ValueError, match="^out: "):
        st.lookup(["a"], np.zeros((3, 1), np.int64),
                  TamperedDLPack(out, shape=[3, 1, R], strides=[2 ** 62, R, 1]))
    with pytest.raises(ValueError, match="^ids: "):
        st.lookup(["a"], TamperedDLPack(ids, strides=[2 ** 61, 1]), out)  # 2**64 bytes
    assert (out == SENTINEL).all()
