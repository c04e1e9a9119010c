"""The exception hierarchy, errno codes, corrupt and unsafe table files, and
bad names."""
from __future__ import annotations

import errno
import os
import pathlib
import re

import numpy as np
import pytest

import engramstore
from esutil import SENTINEL, data_offset, make_rows, sentinel, table_path

CLASSES = ["TableExistsError", "TableNotFoundError", "LayoutMismatchError", "BadIdError",
           "SpecError", "LayoutError", "CorruptTableError", "UnsafePathError", "StateError",
           "StoreClosedError", "TableRemovedError", "InDoubtError"]

CODES = {"EBADID": 4001, "ESPEC": 4002, "EMISMATCH": 4003, "ELAYOUT": 4004, "ECORRUPT": 4005,
         "ECHECKSUM": 4006, "EVERSION": 4007, "EUNSAFE": 4008, "EBOUND": 4009,
         "EREMOVED": 4010, "ESTATE": 4011, "EINDOUBT": 4012}


def one(shape_k=1, row_bytes=264):
    return np.zeros((1, shape_k), np.int64), sentinel((1, shape_k, row_bytes))


def test_hierarchy():
    base = engramstore.EngramError
    assert issubclass(base, Exception)
    assert base.__module__ == "engramstore"
    for name in CLASSES:
        cls = getattr(engramstore, name)
        assert issubclass(cls, base), name
        assert cls.__name__ == name
    assert issubclass(engramstore.BadIdError, IndexError)
    for name in ("SpecError", "LayoutMismatchError", "LayoutError"):
        assert issubclass(getattr(engramstore, name), ValueError), name
    assert issubclass(engramstore.StoreClosedError, engramstore.StateError)
    assert len({getattr(engramstore, n) for n in CLASSES}) == len(CLASSES)
    e = engramstore.EngramError("x")
    assert e.errno is None


def test_codes_and_strerror():
    for name, value in CODES.items():
        assert getattr(engramstore, name) == value, name
        text = engramstore.strerror(value)
        assert isinstance(text, str) and text
    assert len({engramstore.strerror(v) for v in CODES.values()}) == len(CODES)


def test_each_error_carries_its_errno(ab, local_dir, rows_a):
    st, _ = ab
    got = {}

    def catch(call):
        with pytest.raises(engramstore.EngramError) as ei:
            call()
        got[type(ei.value).__name__] = ei.value.errno
        return ei.value

    catch(lambda: st.populate("a", rows_a))
    catch(lambda: st.get_table_spec("nope"))
    catch(lambda: engramstore.EngramStore(tables={"a": (18, 264)}, namespace="model-x",
                                          local_dir=local_dir))
    catch(lambda: st.lookup(["a"], np.array([[17]], np.int64), sentinel((1, 1, 264))))
    catch(lambda: st.populate("a/b", rows_a))
    st.populate("s", make_rows(2, 8, 1))
    catch(lambda: st.lookup(["a", "s"], *one(2)))
    mem = engramstore.TableStore(local_dir=None)
    mem.bind("x", rows_a)
    catch(lambda: mem.remove("x"))
    mem.close()
    catch(lambda: mem.list_tables())
    assert got == {"TableExistsError": errno.EEXIST, "TableNotFoundError": errno.ENOENT,
                   "LayoutMismatchError": engramstore.EMISMATCH,
                   "BadIdError": engramstore.EBADID, "SpecError": engramstore.ESPEC,
                   "LayoutError": engramstore.ELAYOUT, "StateError": engramstore.EBOUND,
                   "StoreClosedError": engramstore.ESTATE}
    assert all(isinstance(v, int) and v > 0 for v in got.values())


# ---- corrupt files ----------------------------------------------------------

def flip(path, offset):
    os.chmod(path, 0o600)
    with open(path, "r+b") as f:
        f.seek(offset)
        b = f.read(1)
        f.seek(offset)
        f.write(bytes([b[0] ^ 0xFF]))
    os.chmod(path, 0o400)


def test_flipped_data_byte_fails_verify(ab, local_dir):
    st, tabs = ab
    st.verify("a")  # intact
    path = table_path(st, "a")
    flip(path, data_offset(path, 17 * 264) + 5 * 264 + 100)
    with pytest.raises(engramstore.CorruptTableError, match="checksum") as ei:
        st.verify("a")
    assert ei.value.errno == engramstore.ECHECKSUM
    st.verify("b")  # the other table is fine
    # a store that verifies on open refuses it, and writes nothing
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir, verify=True) as v:
        out = sentinel((1, 1, 264))
        with pytest.raises(engramstore.CorruptTableError, match=r"^tables\[0\]: ") as ei:
            v.lookup(["a"], np.zeros((1, 1), np.int64), out)
        assert ei.value.errno == engramstore.ECHECKSUM
        assert (out == SENTINEL).all()
        v.lookup(["b"], np.zeros((1, 1), np.int64), out)
        np.testing.assert_array_equal(out[0, 0], tabs["b"][0])


def test_flipped_header_byte_is_corrupt(ab, local_dir):
    st, _ = ab
    path = table_path(st, "b")
    flip(path, 0)
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as s2:
        for call in (lambda: s2.get_table_spec("b"), lambda: s2.verify("b"),
                     lambda: s2.lookup(["b"], *one())):
            with pytest.raises(engramstore.CorruptTableError) as ei:
                call()
            assert ei.value.errno == engramstore.ECORRUPT


@pytest.mark.parametrize("delta", [-1, -264, +1, +4096])
def test_truncated_or_extended_file_is_corrupt(ab, local_dir, delta):
    st, _ = ab
    path = table_path(st, "a")
    size = os.path.getsize(path)
    os.chmod(path, 0o600)
    os.truncate(path, size + delta)
    os.chmod(path, 0o400)
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as s2:
        out = sentinel((1, 1, 264))
        with pytest.raises(engramstore.CorruptTableError) as ei:
            s2.lookup(["a"], np.zeros((1, 1), np.int64), out)
        assert ei.value.errno == engramstore.ECORRUPT
        assert (out == SENTINEL).all()
        with pytest.raises(engramstore.CorruptTableError):
            s2.get_table_spec("a")
        with pytest.raises(engramstore.CorruptTableError):
            s2.verify("a")


def test_truncated_to_nothing_and_foreign_files(store, local_dir):
    for name, content in [("empty", b""), ("junk", b"not an engram table" * 1000),
                          ("short", b"\x00" * 7)]:
        p = os.path.join(store.path, name)
        with open(p, "wb") as f:
            f.write(content)
        os.chmod(p, 0o400)
        with pytest.raises(engramstore.CorruptTableError):
            store.lookup([name], *one())
        with pytest.raises(engramstore.CorruptTableError):
            store.get_table_spec(name)


# ---- unsafe paths ------------------------------------------------------------

def test_symlink_in_place_of_a_table(ab, local_dir, tmp_path):
    st, _ = ab
    path = table_path(st, "a")
    real = tmp_path / "elsewhere"
    os.rename(path, real)
    os.symlink(real, path)
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as s2:
        out = sentinel((1, 1, 264))
        with pytest.raises(engramstore.UnsafePathError, match="link") as ei:
            s2.lookup(["a"], np.zeros((1, 1), np.int64), out)
        assert ei.value.errno == engramstore.EUNSAFE
        assert (out == SENTINEL).all()
        with pytest.raises(engramstore.UnsafePathError):
            s2.get_table_spec("a")
        assert "a" not in s2.list_tables()
        s2.lookup(["b"], np.zeros((1, 1), np.int64), out)  # the rest still serves
        # and populate does not write through the link
        with pytest.raises(engramstore.EngramError):
            s2.populate("a", make_rows(17, 264, 5))
    assert os.path.islink(path)


def test_symlinked_namespace_is_refused(ab, local_dir):
    os.symlink(os.path.join(local_dir, "model-x"), os.path.join(local_dir, "alias"))
    with pytest.raises(engramstore.UnsafePathError) as ei:
        engramstore.EngramStore(namespace="alias", local_dir=local_dir)
    assert ei.value.errno == engramstore.EUNSAFE


def test_world_writable_namespace_is_refused(ab, local_dir):
    st, _ = ab
    os.chmod(st.path, 0o777)
    try:
        with pytest.raises(engramstore.UnsafePathError, match="writable"):
            engramstore.EngramStore(namespace="model-x", local_dir=local_dir)
    finally:
        os.chmod(st.path, 0o700)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_table_owned_by_another_user_is_refused(ab, local_dir):
    st, _ = ab
    os.chown(table_path(st, "b"), 65534, 65534)
    with engramstore.EngramStore(namespace="model-x", local_dir=local_dir) as s2:
        with pytest.raises(engramstore.UnsafePathError, match="owned"):
            s2.lookup(["b"], *one())


# ---- bad names ---------------------------------------------------------------

BAD_NAMES = ["../x", "", "a/b", ".hidden", "a b", "x" * 129, "é", "/abs", "..", "a\\b"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_table_names(store, local_dir, name, rows_a):
    with pytest.raises(engramstore.SpecError) as ei:
        store.populate(name, rows_a)
    assert ei.value.errno == engramstore.ESPEC
    assert isinstance(ei.value, ValueError)
    with pytest.raises(engramstore.SpecError):
        store.define(name, 17, 264)
    with pytest.raises(engramstore.SpecError):
        engramstore.EngramStore(tables={name: (17, 264)}, namespace="n2", local_dir=local_dir)
    with pytest.raises(engramstore.SpecError):
        store.lookup([name], *one())
    with pytest.raises(engramstore.SpecError):
        engramstore.EngramStore(namespace=name, local_dir=local_dir)
    assert store.list_tables() == []
    assert sorted(os.listdir(local_dir)) in (["model-x"], ["model-x", "n2"])
    assert os.listdir(store.path) == []


def test_good_names(store):
    rows = make_rows(2, 8, 3)
    names = ["engram:l1:h0", "A-Z_0.9", "x" * 128, "a.b"]
    for n in names:
        store.populate(n, rows)
    assert store.list_tables() == sorted(names)


def test_name_with_nul_or_wrong_type(store, rows_a):
    with pytest.raises(ValueError, match="NUL"):
        store.populate("a\0b", rows_a)
    with pytest.raises(TypeError, match="^name:"):
        store.populate(b"a", rows_a)
    with pytest.raises(TypeError, match="^name:"):
        store.remove(None)


def test_namespace_with_nul_is_refused_not_cut(local_dir, rows_a):
    # C would read "prod\0-staging" as "prod": the store must not open
    # (and remove from) another namespace than the one named.
    with engramstore.EngramStore(namespace="prod", local_dir=local_dir) as prod:
        prod.populate("w", rows_a)
    with pytest.raises(ValueError, match="^namespace: cannot contain NUL"):
        engramstore.EngramStore(namespace="prod\x00-staging", local_dir=local_dir).remove("w")
    with pytest.raises(ValueError, match="^namespace: cannot contain NUL"):
        engramstore.LocalStore(local_dir, "prod\x00-staging")
    with engramstore.EngramStore(namespace="prod", local_dir=local_dir) as prod:
        assert prod.list_tables() == ["w"]
    assert os.listdir(local_dir) == ["prod"]


@pytest.mark.parametrize("kind", [str, bytes, pathlib.Path])
def test_local_dir_with_nul_is_refused(local_dir, kind):
    bad = local_dir + "\x00/elsewhere"
    arg = bad.encode() if kind is bytes else kind(bad)
    with pytest.raises(ValueError, match="^local_dir: a path cannot contain NUL"):
        engramstore.EngramStore(namespace="n", local_dir=arg)
    with pytest.raises(ValueError, match="^local_dir: a path cannot contain NUL"):
        engramstore.LocalStore(arg, "n")
    assert os.listdir(local_dir) == []
    # The same path without the NUL part works, as str, bytes or a path.
    good = local_dir.encode() if kind is bytes else kind(local_dir)
    with engramstore.EngramStore(namespace="n", local_dir=good) as st:
        assert st.list_tables() == []
    with pytest.raises(TypeError, match="^local_dir: expected a path"):
        engramstore.EngramStore(namespace="n", local_dir=5)


def test_source_name_with_nul_is_refused(store):
    def read_rows(rows, out):
        out[:] = 1
    with pytest.raises(ValueError, match="^name: cannot contain NUL"):
        store.add_source("s\x00x", {"num_rows": 4, "row_bytes": 8}, read_rows)
    assert store.list_tables() == []
    store.add_source("s", {"num_rows": 4, "row_bytes": 8}, read_rows)
    assert store.list_tables() == ["s"]


def test_removed_table_while_open_is_gone_or_removed(ab):
    # After remove() this store's lookups of the name fail: the name
    # resolves afresh (TableNotFoundError), never to stale or wrong rows.
    st, tabs = ab
    out = sentinel((1, 1, 264))
    st.lookup(["b"], np.array([[4]], np.int64), out)
    st.remove("b")
    out[:] = SENTINEL
    with pytest.raises((engramstore.TableNotFoundError, engramstore.TableRemovedError)):
        st.lookup(["b"], np.array([[4]], np.int64), out)
    assert (out == SENTINEL).all()


# ---- messages in the package's terms -------------------------------------------
# The library's messages name its C API (ENGRAM_OPEN_CREATE, engram_bind());
# a Python caller gets the names it uses (create=True, bind()).

def assert_python_terms(e, *terms):
    msg = str(e.value)
    assert not re.search(r"ENGRAM_|engram_|\bStore\(", msg), msg
    for t in terms:
        assert t in msg, msg


def test_missing_namespace_says_create_true(local_dir):
    with pytest.raises(engramstore.TableNotFoundError) as e:
        engramstore.EngramStore(namespace="absent", local_dir=local_dir, create=False)
    assert_python_terms(e, f"namespace {local_dir}/absent does not exist",
                        "(open with create=True)")
    assert e.value.errno == errno.ENOENT


def test_conflicting_options_are_named_as_keywords(local_dir):
    with pytest.raises(engramstore.EngramError) as e:
        engramstore.EngramStore(namespace="n", local_dir=local_dir, file_cache=True,
                                huge_pages=True)
    assert_python_terms(e, "file_cache=True reads rows on demand and huge_pages=True copies "
                           "whole tables into memory: choose one")


def test_memory_store_points_to_bind_and_sources_to_add_source(rows_a):
    st = engramstore.EngramStore(local_dir=None)
    with pytest.raises(engramstore.StateError) as e:
        st.populate("a", rows_a)
    assert_python_terms(e, "a memory store has no directory to write 'a' to; use bind()")
    st.add_source("s", (4, 8), lambda rows, out: None)
    with pytest.raises(engramstore.StateError) as e:
        st.remove("s")
    assert_python_terms(e, "served by a source (add_source)")
    st.close()


def test_lookup_inside_read_rows_is_named_as_lookup():
    st = engramstore.EngramStore(local_dir=None)
    ids, out = np.zeros((1, 1), np.int64), np.zeros((1, 1, 8), np.uint8)

    def read_rows(rows, dst):
        st.lookup(["s"], ids, out)
    st.add_source("s", (4, 8), read_rows)
    with pytest.raises(engramstore.EngramError) as e:
        st.lookup(["s"], ids, out)
    assert_python_terms(e, "read_rows raised StateError: lookup() called from inside a "
                           "source's read_rows")
    st.close()


def test_argument_errors_of_the_constructor_name_engramstore(local_dir):
    with pytest.raises(TypeError) as e:
        engramstore.EngramStore(namespace="n", local_dir=local_dir, prefetch=True)
    assert_python_terms(e, "'prefetch' is an invalid keyword argument for EngramStore()")
    with engramstore.EngramStore(namespace="n", local_dir=local_dir) as st:
        with pytest.raises(RuntimeError) as e:
            st.__init__(namespace="n", local_dir=local_dir)
        assert_python_terms(e, "EngramStore.__init__ called twice")


def test_python_terms_leave_names_alone(local_dir):
    # Names may look like the library's C names: only the library's own
    # phrases are reworded, and names are quoted as they are.
    st = engramstore.EngramStore(local_dir=None)
    with pytest.raises(engramstore.StateError) as e:
        st.populate("ENGRAM_OPEN_CREATE", np.zeros((2, 8), np.uint8))
    assert str(e.value) == ("a memory store has no directory to write 'ENGRAM_OPEN_CREATE' "
                            "to; use bind()")
    st.close()
    with pytest.raises(engramstore.TableNotFoundError) as e:
        engramstore.EngramStore(namespace="ENGRAM_OPEN_CREATE", local_dir=local_dir,
                                create=False)
    assert str(e.value) == (f"open: namespace {local_dir}/ENGRAM_OPEN_CREATE does not exist "
                            "(open with create=True)")
