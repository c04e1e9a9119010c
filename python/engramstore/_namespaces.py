"""The namespaces of a root: who uses them, removal and garbage collection
(the thin layer over engram_namespace_usage/remove/gc)."""
from __future__ import annotations

import math
import os
from typing import NamedTuple

from . import _engram
from ._types import PathArg

_REMOVE_TABLES, _REMOVE_IN_USE = 0x1, 0x2
_MAX_AGE = 2**64 - 1  # seconds: engram_namespace_gc()'s uint64_t


class NamespaceUsage(NamedTuple):
    """Who uses a namespace (:func:`namespace_usage`).  Every store holds a
    lease on its namespace from its first table open until it is closed (a
    locked file, so it ends with its process however that ends)."""

    users: int
    """Live leases: processes with tables of the namespace open."""
    stale_leases: int
    """Leases of processes that died with their store open."""
    last_used: float
    """When it was last used (seconds since the epoch, as ``time.time()``):
    the latest modification of the directory or a lease."""
    first_user: str
    """What one live lease's process wrote: ``"pid P start S command C"``
    (empty without users)."""


class GcResult(NamedTuple):
    """What :func:`gc` did with one namespace."""

    namespace: str
    action: str
    """``"removed"``, ``"would_remove"`` (dry run), ``"kept"`` (in use, or
    used recently) or ``"failed"`` (not ours to remove: another user's, a
    table being written, an entry that is not a table)."""
    reason: str


def _root(local_dir: PathArg | None) -> str | bytes:
    if local_dir is None:
        return _engram.default_root()
    return os.fspath(local_dir)


def namespaces(local_dir: PathArg | None = None) -> list[str]:
    """The namespaces under ``local_dir`` (default: the default root),
    sorted: its subdirectories with valid names, whoever owns them."""
    return list(_engram.namespace_list(_root(local_dir)))


def namespace_usage(namespace: str, local_dir: PathArg | None = None) -> NamespaceUsage:
    """Who uses ``namespace`` under ``local_dir`` (default: the default
    root) and when it was last used::

        u = engramstore.namespace_usage("model-a")
        print(u.users, u.first_user)
    """
    users, stale, last_ns, first = _engram.namespace_usage(_root(local_dir), namespace)
    return NamespaceUsage(users, stale, last_ns / 1e9, first)


def remove_namespace(namespace: str, local_dir: PathArg | None = None, *,
                     tables: bool = False, in_use: bool = False) -> None:
    """Removes ``namespace``: with ``tables=True`` its tables too (else a
    namespace that holds tables is refused: EngramError, errno ENOTEMPTY); a
    namespace another process uses is refused (EBUSY) unless ``in_use=True`` (that
    process keeps reading the tables it opened).  Entries that are not
    tables and tables being written stop it, with nothing removed."""
    flags = (_REMOVE_TABLES if tables else 0) | (_REMOVE_IN_USE if in_use else 0)
    _engram.namespace_remove(_root(local_dir), namespace, flags)


def gc(older_than: float = 86400.0, local_dir: PathArg | None = None, *,
       dry_run: bool = False) -> list[GcResult]:
    """Removes, with their tables, the namespaces under ``local_dir``
    (default: the default root) that no live process uses and that were
    last used at least ``older_than`` seconds ago, so that a crashed job
    never leaks its tables for good.  Returns what was done with each
    namespace; ``dry_run=True`` removes nothing.  An age too large for 64
    bits (``math.inf``) keeps everything::

        for r in engramstore.gc(older_than=3600, dry_run=True):
            print(r.namespace, r.action, r.reason)
    """
    if isinstance(older_than, float) and math.isnan(older_than):
        raise ValueError("older_than: nan is not an age")
    if older_than < 0:
        raise ValueError(f"older_than: {older_than} is negative")
    # Rounded up (never younger than asked), and an age past what the C
    # call takes (inf included) is the longest it takes: never.
    idle = _MAX_AGE if older_than >= _MAX_AGE else math.ceil(older_than)
    out = []
    for ns, code, detail in _engram.namespace_gc(_root(local_dir), idle, dry_run):
        action = ("would_remove" if dry_run else "removed") if code == 0 else \
            "kept" if code == 1 else "failed"
        out.append(GcResult(ns, action, detail))
    return out
