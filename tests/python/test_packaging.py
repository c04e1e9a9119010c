"""The package's metadata as pip installs it (its license and the LICENSE
file in the wheel), and the release notes of its version."""
from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re

import pytest

import engramstore

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _header_version() -> str:
    text = (ROOT / "include" / "engram.h").read_text()
    parts = [re.search(rf"^#define ENGRAM_VERSION_{p} (\d+)$", text, re.M).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


def _installed_dist():
    """The distribution engramstore was imported from; skips where the
    package comes from a build directory (scripts/test.sh's runs against
    the sanitizer build), which has no metadata of its own.  With
    ENGRAM_REQUIRE_INSTALLED=1 (scripts/test.sh's runs against `pip
    install .` and the wheel) that is a failure: those runs must test the
    installed package, not a copy found on the path."""
    skip = pytest.fail if os.environ.get("ENGRAM_REQUIRE_INSTALLED") == "1" else pytest.skip
    try:
        dist = importlib.metadata.distribution("engramstore")
    except importlib.metadata.PackageNotFoundError:
        skip("engramstore is not installed: imported from a build directory")
    imported = pathlib.Path(engramstore.__file__).resolve()
    if pathlib.Path(dist.locate_file("engramstore/__init__.py")).resolve() != imported:
        skip(f"the installed engramstore is not the one imported ({imported})")
    return dist


def test_license_metadata():
    dist = _installed_dist()
    assert dist.metadata["License"] == "MIT"
    assert "License :: OSI Approved :: MIT License" in dist.metadata.get_all("Classifier", [])
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert len(licenses) == 1, f"LICENSE files in the distribution: {licenses}"
    assert licenses[0].read_text() == (ROOT / "LICENSE").read_text()


def test_index_metadata():
    """What an index shows of the package: the summary, the README as its
    description, the keywords, the classifiers (the Python versions from
    Requires-Python's minimum on, Linux, C), and no project URL, since
    the project has no public address."""
    dist = _installed_dist()
    meta = dist.metadata
    assert meta["Summary"] and "\n" not in meta["Summary"]
    assert meta["Requires-Python"] == ">=3.10"
    assert meta["Description-Content-Type"] == "text/markdown"
    assert meta.get_payload().strip() == (ROOT / "README.md").read_text().strip()
    keywords = (meta["Keywords"] or "").split(",")
    assert "engram" in keywords and "embedding" in keywords, keywords
    classifiers = meta.get_all("Classifier", [])
    for c in ("Operating System :: POSIX :: Linux", "Programming Language :: C",
              "Programming Language :: Python :: 3 :: Only", "Typing :: Typed"):
        assert c in classifiers, (c, classifiers)
    versions = [tuple(map(int, c.rsplit(" ", 1)[1].split(".")))
                for c in classifiers if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)]
    assert versions == [(3, minor) for minor in range(10, 10 + len(versions))], versions
    assert any(c.startswith("Topic :: ") for c in classifiers), classifiers
    assert meta.get_all("Project-URL") is None and meta["Home-page"] is None
    try:
        from trove_classifiers import classifiers as known
    except ImportError:
        known = None
    if known is not None:
        assert [c for c in classifiers if c not in known] == []


def test_engram_command():
    """The package carries the CLI: pip writes the console script `engram`
    into the environment's scripts directory, and it runs the binary the
    wheel holds (engramstore/_bin/engram) with the arguments as given, its
    output and exit status passed through."""
    import subprocess
    import sys
    import sysconfig
    dist = _installed_dist()
    scripts = [(e.name, e.value) for e in dist.entry_points if e.group == "console_scripts"]
    assert scripts == [("engram", "engramstore._cli:main")]
    binary = pathlib.Path(engramstore.__file__).parent / "_bin" / "engram"
    assert binary.is_file() and os.access(binary, os.X_OK), binary
    # The installer's scripts directory: where the interpreter running the
    # tests has its bin/ (pip installs into that environment).
    command = pathlib.Path(sysconfig.get_path("scripts")) / "engram"
    assert command.is_file(), f"no console script {command}"
    proc = subprocess.run([str(command), "--version"], capture_output=True, text=True,
                          timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (
        0, f"engram {engramstore.library_version}\n", "")
    proc = subprocess.run([str(command), "no-such-command", "x"], capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "engram: unknown command 'no-such-command'\nTry 'engram --help'.\n"
    # The same through the module the script imports, from any interpreter
    # of that environment.
    proc = subprocess.run([sys.executable, "-c", "import engramstore._cli as c; c.main()",
                           "--version"], capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (0, f"engram {engramstore.library_version}\n")


def test_license_file():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("MIT License\n")
    assert re.search(r"^Copyright \(c\) \d{4} The engram authors$", text, re.M)


def test_changelog_has_this_version():
    version = _header_version()
    assert engramstore.library_version == version
    changelog = (ROOT / "CHANGELOG.md").read_text()
    # Keep a Changelog: the newest release first, "## [X.Y.Z] - date".
    releases = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2}|Unreleased)$",
                          changelog, re.M)
    assert releases, "CHANGELOG.md has no '## [X.Y.Z] - YYYY-MM-DD' entry"
    assert releases[0][0] == version, (
        f"the newest CHANGELOG.md entry is {releases[0][0]}, engram.h says {version}")


# ---- a machine without the C libraries ----------------------------------

# (the cache variables of each library CMakeLists.txt requires, the Debian
# package, a word of the message's name for it)
REQUIRED_LIBS = {
    "xxhash": (("XXHASH_INCLUDE_DIR", "XXHASH_LIBRARY"), "libxxhash-dev", "libxxhash"),
    "uring": (("URING_INCLUDE_DIR", "URING_LIBRARY"), "liburing-dev", "liburing"),
    "cjson": (("CJSON_INCLUDE_DIR", "CJSON_LIBRARY"), "libcjson-dev", "cJSON"),
}


def _configure_without(tmp_path, hidden):
    """Configures the project as `pip install .` does (the Python module
    only), with the libraries in `hidden` absent: every find_* searches an
    empty root (CMAKE_FIND_ROOT_PATH in ONLY mode), and the other required
    libraries are given as found.  Returns the exit status and output."""
    import shutil
    import subprocess
    cmake = shutil.which("cmake")
    if cmake is None:
        pytest.skip("cmake is not installed")
    root = tmp_path / "empty-root"
    root.mkdir()
    args = [cmake, "-S", str(ROOT), "-B", str(tmp_path / "build"), "-DBUILD_TESTING=OFF",
            "-DENGRAM_PYTHON=ON", "-DENGRAM_REDIS=AUTO", "-DENGRAM_NUMA=AUTO",
            "-DENGRAM_CUDA=OFF", f"-DCMAKE_FIND_ROOT_PATH={root}",
            "-DCMAKE_FIND_ROOT_PATH_MODE_INCLUDE=ONLY", "-DCMAKE_FIND_ROOT_PATH_MODE_LIBRARY=ONLY",
            "-DCMAKE_FIND_ROOT_PATH_MODE_PACKAGE=ONLY"]
    for name, (variables, _, _) in REQUIRED_LIBS.items():
        if name not in hidden:
            # Found elsewhere: configure stops before anything reads them.
            args += [f"-D{v}=/found/elsewhere/{v}" for v in variables]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("hidden", [("xxhash",), ("uring",), ("cjson",),
                                    ("xxhash", "uring", "cjson")])
def test_configure_without_a_required_library_names_it_once(tmp_path, hidden):
    """A machine without libxxhash, liburing or cJSON got a CMake error per
    find_* call (`Could not find XXHASH_INCLUDE_DIR using the following
    files: xxhash.h`); it gets one error naming each missing library, its
    Debian package and scripts/setup.sh, and nothing else."""
    rc, out = _configure_without(tmp_path, hidden)
    assert rc != 0, out
    assert out.count("CMake Error") == 1, out
    assert "Call Stack" not in out and "Could not find" not in out, out
    msg = out[out.index("CMake Error"):]
    assert "engram: required libraries are not installed" in msg, out
    assert "scripts/setup.sh" in msg, out
    for name, (_, deb, word) in REQUIRED_LIBS.items():
        assert (deb in msg) == (name in hidden), (name, out)
        assert (word in msg) == (name in hidden), (name, out)
    assert f"sudo apt-get install {' '.join(REQUIRED_LIBS[n][1] for n in hidden)}" in \
        " ".join(msg.split()), out
