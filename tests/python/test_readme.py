"""Runs every ```python block of README.md and of docs/*.md, each in its own
interpreter with a scratch directory as the working directory, so the
README and the docs cannot drift from the package."""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import pytest

TOP = pathlib.Path(__file__).resolve().parents[2]
DOCS = [TOP / "README.md"] + sorted((TOP / "docs").glob("*.md"))
FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
# A README line `print(...)  # -> TEXT` promises that the block prints TEXT.
PROMISE = re.compile(r"^\s*print\(.*#\s*->\s*(.*?)\s*$", re.M)


def python_blocks():
    blocks = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        blocks += [(f"{doc.relative_to(TOP)}:{text.count(chr(10), 0, m.start()) + 1}", m.group(1))
                   for m in FENCE.finditer(text)]
    return blocks


def test_fence_pattern_finds_blocks():
    sample = "x\n```python\nprint(1)\n```\n```sh\nls\n```\n```python\nprint(2)\n```\n"
    assert [m.group(1) for m in FENCE.finditer(sample)] == ["print(1)\n", "print(2)\n"]


BLOCKS = python_blocks()


@pytest.mark.skipif(not BLOCKS, reason="README.md has no ```python block yet")
@pytest.mark.parametrize("line,code", BLOCKS, ids=[where for where, _ in BLOCKS])
def test_readme_python_block(tmp_path, line, code):
    if "from mooncake" in code:
        # A Mooncake example needs Mooncake's wheel (tests/python/mcserver.py).
        import mcserver
        why = mcserver.mooncake_missing()
        if why and os.environ.get("ENGRAM_REQUIRE_MOONCAKE") != "1":
            pytest.skip(why)
    cluster = None
    if "redis=\"127.0.0.1:7000" in code:
        # A Redis example runs on a cluster of its own: its nodes replace
        # the example's addresses (tests/python/rdserver.py).
        from rdserver import RedisCluster, require_redis
        require_redis()
        cluster = RedisCluster(str(tmp_path / "redis"), masters=3)
        os.mkdir(cluster.dir)
        cluster.start()
        code = re.sub(r"127\.0\.0\.1:7000(,127\.0\.0\.1:700\d)*", cluster.nodes, code)
    script = tmp_path / "example.py"
    script.write_text(code, encoding="utf-8")
    # The examples' default root is a scratch one, on a tmpfs as the real
    # default is (NUMA placement needs one): nothing is left in the
    # machine's /dev/shm/engram.
    root = tempfile.mkdtemp(prefix="engram-readme-",
                            dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    env = dict(os.environ, TMPDIR=str(tmp_path), ENGRAM_ROOT=root)
    try:
        proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if cluster is not None:
            cluster.stop()
    assert proc.returncode == 0, (
        f"block at {line} failed (exit {proc.returncode}):\n"
        f"--- code ---\n{code}--- stdout ---\n{proc.stdout}--- stderr ---\n{proc.stderr}")
    promised = PROMISE.findall(code)
    assert proc.stdout.splitlines() == promised, (
        f"block at {line} printed\n{proc.stdout}but its comments promise\n"
        + "\n".join(promised))
