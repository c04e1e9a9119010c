"""The `engram` command of an installed package: the console script that
pip writes into the environment's bin/ calls main(), which replaces the
Python process with the CLI binary the wheel carries (engramstore/_bin/
engram, built from tools/ with the package).  Nothing of the CLI is
reimplemented here; the binary gets the arguments, the environment and
the standard streams as they are, and its exit status is the command's."""
from __future__ import annotations

import os
import sys

__all__ = ["main"]


def binary() -> str:
    """The path of the bundled `engram` binary."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "_bin", "engram")


def main() -> None:
    path = binary()
    if not os.access(path, os.X_OK):
        # A package imported from a source or build tree carries no binary.
        sys.exit(f"engram: the CLI binary is not in this installation of engramstore "
                 f"({path} is missing); build it from the source tree (scripts/demo.sh)")
    # argv[0] stays "engram" whatever the script's path, as the CLI's own
    # messages ("Try 'engram --help'.") name it.  execv does not return.
    os.execv(path, ["engram", *sys.argv[1:]])
