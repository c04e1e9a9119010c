"""The package's metadata as pip installs it (its license and the LICENSE
file in the wheel), and the release notes of its version."""
from __future__ import annotations

import importlib.metadata
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
    the sanitizer build), which has no metadata of its own."""
    try:
        dist = importlib.metadata.distribution("engramstore")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("engramstore is not installed: imported from a build directory")
    imported = pathlib.Path(engramstore.__file__).resolve()
    if pathlib.Path(dist.locate_file("engramstore/__init__.py")).resolve() != imported:
        pytest.skip(f"the installed engramstore is not the one imported ({imported})")
    return dist


def test_license_metadata():
    dist = _installed_dist()
    assert dist.metadata["License"] == "MIT"
    assert "License :: OSI Approved :: MIT License" in dist.metadata.get_all("Classifier", [])
    licenses = [f for f in dist.files or [] if f.name == "LICENSE"]
    assert len(licenses) == 1, f"LICENSE files in the distribution: {licenses}"
    assert licenses[0].read_text() == (ROOT / "LICENSE").read_text()


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
