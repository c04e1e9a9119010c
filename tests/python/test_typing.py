"""The package as a type checker and the interactive help see it: mypy
--strict on every ```python block of README.md and docs/*.md (the blocks
test_readme.py runs), mypy's view of each constructor form and of calls
that are wrong, help() and inspect.signature() of the public methods."""
from __future__ import annotations

import inspect
import os
import pathlib
import pydoc
import re
import subprocess
import sys

import pytest

import engramstore
from test_readme import TOP, python_blocks

MYPY_CONFIG = """\
[mypy]
strict = True
# Mooncake's wheel ships no type information.
[mypy-mooncake.*]
ignore_missing_imports = True
"""


def mypy(tmp_path, files):
    """Runs mypy on `files` ({name: code}) against the package's sources
    (python/engramstore, its annotations and stubs); returns (exit status,
    output lines)."""
    pytest.importorskip("mypy", reason="mypy is not installed (scripts/test.sh installs it)")
    for name, code in files.items():
        (tmp_path / name).write_text(code, encoding="utf-8")
    (tmp_path / "mypy.ini").write_text(MYPY_CONFIG, encoding="utf-8")
    env = dict(os.environ, MYPYPATH=str(TOP / "python"))
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--no-error-summary",
         "--cache-dir", str(tmp_path / ".mypy_cache"), *files],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "error: " in proc.stdout or proc.returncode == 0, proc.stdout + proc.stderr
    return proc.returncode, proc.stdout.splitlines()


def test_examples_of_the_readme_and_docs_type_check(tmp_path):
    blocks = python_blocks()
    assert blocks
    files = {f"block{i}.py": code for i, (_, code) in enumerate(blocks)}
    where = {f"block{i}.py": w for i, (w, _) in enumerate(blocks)}
    rc, out = mypy(tmp_path, files)
    # Name each finding by the document and line it comes from.
    found = []
    for line in out:
        m = re.match(r"(block\d+\.py):(\d+): (.*)", line)
        if m:
            doc, first = where[m.group(1)].rsplit(":", 1)
            found.append(f"{doc}:{int(first) + int(m.group(2))}: {m.group(3)}")
        else:
            found.append(line)
    assert rc == 0 and not found, "\n".join(found)


FORMS = '''\
from typing import Any
import numpy as np
import engramstore


class Client:  # what engramstore calls of a Mooncake client
    def get_into_ranges(self, *args: Any) -> Any: ...
    def batch_put_from(self, *args: Any) -> Any: ...
    def batch_is_exist(self, *args: Any) -> Any: ...
    def register_buffer(self, *args: Any) -> Any: ...
    def unregister_buffer(self, *args: Any) -> Any: ...
    def remove(self, *args: Any) -> Any: ...
    def get_size(self, *args: Any) -> Any: ...


cfg = engramstore.EngramStoreConfig([17, 19], 264)
ids = np.zeros((1, 1), np.int64)
out = np.zeros((1, 1, 264), np.uint8)
reveal_type(engramstore.EngramStore({1: cfg}, store=None))  # E: Revealed type is "engramstore._layer.LayerStore"
reveal_type(engramstore.EngramStore({1: cfg}, Client(), cache_bytes=1 << 20))  # E: Revealed type is "engramstore._layer.LayerStore"
reveal_type(engramstore.EngramStore(tables={"a": {"num_rows": 17, "row_bytes": 264}}, namespace="m", local_dir="/tmp"))  # E: Revealed type is "engramstore.TableStore"
reveal_type(engramstore.EngramStore(local_dir=None))  # E: Revealed type is "engramstore.TableStore"
reveal_type(engramstore.EngramStore(namespace="m", local_dir="/tmp", file_cache=True, threads=2))  # E: Revealed type is "engramstore.TableStore"
reveal_type(engramstore.EngramStore(namespace="m", store_client=Client(), cache_bytes=1))  # E: Revealed type is "engramstore._mooncake.MooncakeTableStore"
reveal_type(engramstore.LocalStore("/tmp", "m"))  # E: Revealed type is "engramstore.LocalStore"
with engramstore.EngramStore(namespace="m", local_dir="/tmp") as st:
    reveal_type(st)  # E: Revealed type is "engramstore.TableStore"
    st.lookup(["a"], ids, out)
    st.lookup_into(1, ids, out)  # E: "TableStore" has no attribute "lookup_into"
    reveal_type(st.get_table_spec("a")["num_rows"])  # E: Revealed type is "int"
layers = engramstore.EngramStore({1: cfg}, store=None)
layers.lookup_into(1, ids, out)
layers.lookup(ids)  # E: "LayerStore" has no attribute "lookup"
reveal_type(layers.get_row_bytes(1))  # E: Revealed type is "int"
layers.get_num_heads()  # E: Missing positional argument "layer_id"
engramstore.EngramStore(61, cfg, None)  # E: No overload variant of "EngramStore" matches
engramstore.EngramStore(namespace="m", local_dir="/tmp", prefetch=True)  # E: No overload variant of "EngramStore" matches
cfg.embedding_dim = 66  # E: "EngramStoreConfig" has no attribute "embedding_dim"
'''


def test_mypy_sees_each_constructor_form_and_the_wrong_calls(tmp_path):
    """Each `# E: text` line must get a finding containing text, and no
    other line any."""
    rc, out = mypy(tmp_path, {"forms.py": FORMS})
    want = {i + 1: m.group(1) for i, line in enumerate(FORMS.splitlines())
            if (m := re.search(r"# E: (.*)$", line))}
    got = {}
    for line in out:
        m = re.match(r"forms\.py:(\d+): (?:error|note): (.*?)(?:  \[[a-z-]+\])?$", line)
        if m and not m.group(2).startswith(("Possible overload", "    ", "See ")):
            got.setdefault(int(m.group(1)), []).append(m.group(2))
    problems = [f"line {n}: expected {text!r}, mypy said {got.get(n)}"
                for n, text in want.items() if not any(text in g for g in got.get(n, []))]
    problems += [f"line {n}: unexpected {g}" for n, g in got.items() if n not in want]
    assert rc == 1 and not problems, "\n".join(problems + [""] + out)


# ---- help() and inspect.signature() ---------------------------------------------

def public_methods(cls):
    """The public methods of cls (Mooncake's older calls, kept only to
    raise a pointer to their replacement, are not part of the API)."""
    return sorted(n for n, v in inspect.getmembers(cls)
                  if not n.startswith("_") and callable(v)
                  and not getattr(v, "_old_mooncake", False))


def test_help_of_engramstore_names_every_method_of_what_it_returns():
    text = pydoc.render_doc(engramstore.EngramStore, renderer=pydoc.plaintext)
    for cls in (engramstore.TableStore, engramstore.MooncakeTableStore,
                engramstore.LayerStore):
        names = public_methods(cls)
        assert names
        missing = [n for n in names if f"``{n}``" not in text]
        assert not missing, f"help(EngramStore) does not name {cls.__name__}.{missing}"


TABLE_SIGNATURES = {
    "define": "(name, num_rows, row_bytes, row_pitch=0)",
    "populate": "(name, rows)",
    "populate_shared": "(name, rows, *, timeout=600.0)",
    "wait_for": "(name, timeout=None)",
    "usage": "(name, /)",
    "placement": "(name, /)",
    "numa_copy": "(name, node)",
    "pull": "(source: 'Any', name: 'str', *, namespace: 'str | None' = None, "
            "progress: 'Callable[[int, int], object] | None' = None) -> 'bool'",
    "check_origin": "(source: 'Any', name: 'str', *, namespace: 'str | None' = None) "
                    "-> \"Literal['current', 'republished', 'changed', 'gone']\"",
    "bind": "(name, rows)",
    "open_safetensors": "(name, path, weight, scale=None, row_start=0, row_end=0)",
    "add_source": "(name: 'str', spec: 'TableSpecArg', read_rows: 'Callable[..., object]', *, "
                  "cache_bytes: 'int' = 0, group: 'Hashable | None' = None) -> 'int | None'",
    "lookup": "(tables, ids, out=None, offsets=None, stream=None, *, zero_dead=False)",
    "lookup_async": "(tables, ids, out=None, offsets=None, *, zero_dead=False)",
    "cuda_check": "()",
    "get_table_spec": "(name, /)",
    "list_tables": "()",
    "remove": "(name, /)",
    "verify": "(name, /)",
    "stats": "()",
    "close": "()",
}


def test_every_public_method_has_a_signature(local_dir):
    with engramstore.EngramStore(namespace="sig", local_dir=local_dir) as st:
        assert public_methods(type(st)) == sorted(TABLE_SIGNATURES)
        for name, want in TABLE_SIGNATURES.items():
            assert str(inspect.signature(getattr(st, name))) == want, name
        assert str(inspect.signature(st.__exit__)) == "(*exc_info)"
    for cls in (engramstore.LayerStore, engramstore.MooncakeTableStore):
        for name in public_methods(cls):
            sig = inspect.signature(getattr(cls, name))
            assert list(sig.parameters)[0] == "self", (cls, name, sig)
    assert str(inspect.signature(engramstore.TableStore)).startswith(
        "(tables: 'Mapping[str, TableSpecArg] | None' = None, namespace: 'str | None' = None")
    assert str(inspect.signature(engramstore._engram.Store)) == (
        "(namespace=None, local_dir=None, *, create=True, prefault=False, random=False, "
        "huge_pages=False, mlock=False, verify=False, timing=False, group=False, threads=0, "
        "file_cache=False, cache_bytes=0, queue_depth=0, redis=None, redis_user=None, "
        "redis_password=None, redis_tagged=False, redis_chunk_bytes=0, redis_timeout_ms=0, "
        "numa_node=None, numa_gpu=None, numa_interleave=None, numa_local=False, "
        "cache_keep_all=False, redis_local_dir=None)")
    assert str(inspect.signature(engramstore.strerror)) == "(errno, /)"
    assert str(inspect.signature(engramstore.default_root)) == "()"
    assert str(inspect.signature(engramstore._engram.check_capacity)) == "(dir, specs, /)"
    assert str(inspect.signature(engramstore._engram.shard_plan)) == (
        "(num_heads, reads, tp, dp, flags, /)")
    assert str(inspect.signature(engramstore.LayerStore.lookup_into)) == (
        "(self, layer_id: 'int', row_ids: 'ArrayArg', output: 'ArrayArg | None' = None) -> 'Any'")


ENGRAMSTORE_SIGNATURE = (
    "(tables: 'Mapping[str, TableSpecArg] | None' = None, namespace: 'str | None' = None, "
    "local_dir: 'PathArg | None' = default_root(), *, "
    "layers: 'Mapping[int, EngramStoreConfig] | None' = None, "
    "store: 'TableStore | MooncakeClient | None' = None, "
    "store_client: 'MooncakeClient | None' = None, **options: 'Any') "
    "-> 'TableStore | LayerStore | MooncakeTableStore'")


def test_engramstore_signature_lists_the_parameters_of_its_forms(local_dir):
    """inspect.signature(EngramStore) was (*args, **kwargs), its __new__'s
    dispatch; it lists what the forms take, and each keyword it names picks
    the form docs/python.md says."""
    sig = inspect.signature(engramstore.EngramStore)
    assert str(sig) == ENGRAMSTORE_SIGNATURE
    assert "EngramStore(tables: " in pydoc.render_doc(engramstore.EngramStore,
                                                      renderer=pydoc.plaintext)
    cfg = engramstore.EngramStoreConfig([4, 5], row_bytes=8)
    with engramstore.EngramStore(**sig.bind(tables=None, namespace="sig-forms",
                                            local_dir=local_dir).arguments) as st:
        assert type(st) is engramstore.TableStore
    layer = engramstore.EngramStore(**sig.bind(layers={0: cfg}, store=None).kwargs)
    assert type(layer) is engramstore.LayerStore
    layer.close()
    # The classes it returns keep the signatures of their own forms.
    assert "layers: 'Mapping[int, EngramStoreConfig]'" in str(
        inspect.signature(engramstore.LayerStore))
    assert "store_client" not in str(inspect.signature(engramstore.TableStore))
    assert "store_client: 'MooncakeClient'" in str(
        inspect.signature(engramstore.MooncakeTableStore))
    assert str(inspect.signature(engramstore.LocalStore)).startswith(
        "(local_dir: 'PathArg' = default_root(), namespace")


def test_local_dir_default_reads_as_the_default_root():
    """local_dir's default showed as <object object at 0x...>; it reads as
    what it means, default_root() (read when the store is made)."""
    for fn in (engramstore.TableStore, engramstore.LocalStore, engramstore.can_share):
        default = inspect.signature(fn).parameters["local_dir"].default
        assert repr(default) == "default_root()", fn
    assert "local_dir: 'PathArg | None' = default_root()" in pydoc.render_doc(
        engramstore.TableStore, renderer=pydoc.plaintext)


def test_signatures_name_the_keywords_the_methods_take(local_dir):
    """A text signature is written by hand: calls made with its keyword
    names must work, and its positional-only names must be refused."""
    import numpy as np
    with engramstore.EngramStore(namespace="kw", local_dir=local_dir) as st:
        st.define(name="t", num_rows=4, row_bytes=8, row_pitch=0)
        st.populate(name="t", rows=np.arange(32, dtype=np.uint8).reshape(4, 8))
        assert st.populate_shared(name="t", rows=np.arange(32, dtype=np.uint8).reshape(4, 8),
                                  timeout=0) is False
        st.wait_for(name="t", timeout=0)
        out = np.zeros((1, 1, 8), np.uint8)
        st.lookup(tables=["t"], ids=np.array([[2]], np.int64), out=out, offsets=None,
                  stream=None, zero_dead=False)
        assert out[0, 0, 0] == 16
        with pytest.raises(TypeError):
            st.get_table_spec(name="t")
        m = engramstore.EngramStore(local_dir=None)
        m.bind(name="b", rows=np.zeros((2, 8), np.uint8))
        assert m._add_source(name="s", num_rows=2, row_bytes=8, read_rows=lambda r, o: None,
                             cache_bytes=0) is None
        m.close()


def test_help_of_a_store_shows_each_method_with_its_signature(local_dir):
    text = pydoc.render_doc(engramstore.TableStore, renderer=pydoc.plaintext)
    assert ("lookup(self, /, tables, ids, out=None, offsets=None, stream=None, *, "
            "zero_dead=False)") in text
    assert "get_table_spec(self, name, /)" in text
    text = pydoc.render_doc(engramstore.LayerStore, renderer=pydoc.plaintext)
    assert ("lookup_into(self, layer_id: 'int', row_ids: 'ArrayArg', "
            "output: 'ArrayArg | None' = None)") in text
