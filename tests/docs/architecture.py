#!/usr/bin/env python3
"""architecture.py - checks that docs/architecture.md names every source
file of src/, src/redis/, cuda/ and python/src/, and no file they lack.

Each directory has its section of the page (its heading below, up to the
next heading); a file counts as named when its name is a `code` span of
that section, or one word of such a span (`error.c`, `spec.c`, ...).  A
bare file name of a section that is a file of none of these directories
(one renamed or removed) is an error too, so the map cannot drift from
the tree.

Usage: architecture.py [--src DIR]   (DIR: the source tree; default: the
tree this script is in).  Exit 0 when the page matches the tree, 1 with
one line per difference otherwise.  Python 3's standard library only.
"""
import argparse
import os
import re
import sys

# directory -> the heading of its section
SECTIONS = {
    "src": "## Modules",
    "src/redis": "### `src/redis/`",
    "cuda": "### `cuda/`",
    "python/src": "### `python/src/`",
}
SOURCE = re.compile(r"\.(c|h|cu)$")
NAME = re.compile(r"[\w./-]+\.(?:c|h|cu)\b")


def section(lines, heading):
    """The lines under the heading that starts with `heading`, up to the
    next heading; None where there is no such heading."""
    for i, line in enumerate(lines):
        if line.startswith(heading):
            body = []
            for rest in lines[i + 1:]:
                if rest.startswith("#"):
                    break
                body.append(rest)
            return body
    return None


def named(body):
    """The file names in the code spans of a section's lines."""
    names = set()
    for line in body:
        for span in re.findall(r"`([^`]*)`", line):
            names.update(NAME.findall(span))
    return names


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", default=os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))))
    args = ap.parse_args()
    doc = os.path.join(args.src, "docs", "architecture.md")
    with open(doc, encoding="utf-8") as f:
        lines = f.read().split("\n")
    errors = []
    tree = {d: sorted(n for n in os.listdir(os.path.join(args.src, d))
                      if SOURCE.search(n) and os.path.isfile(os.path.join(args.src, d, n)))
            for d in SECTIONS}
    known = {n for files in tree.values() for n in files}
    for d, heading in SECTIONS.items():
        files = tree[d]
        body = section(lines, heading)
        if body is None:
            errors.append(f"docs/architecture.md: no section '{heading}' for {d}/")
            continue
        names = named(body)
        for n in files:
            if n not in names:
                errors.append(f"docs/architecture.md: {d}/{n} is not named under '{heading}'")
        for n in sorted(names):
            if "/" not in n and n not in known:
                errors.append(f"docs/architecture.md: '{heading}' names {n}, a file of none of "
                              f"{', '.join(d + '/' for d in SECTIONS)}")
    for e in errors:
        print(e)
    if not errors:
        print(f"docs/architecture.md names every source file of "
              f"{', '.join(d + '/' for d in SECTIONS)}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
