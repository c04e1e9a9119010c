"""A Mooncake Store namespace as the key-value store of the publication
protocol (src/kv.h, src/publish.c): ``MooncakeKV(client, namespace)`` is the
``kv`` object ``_engram._Publication`` runs the protocol over.

Mooncake Store has no compare-and-swap, no expiry and no listing of keys,
and its objects are in effect create-only (a put to a key that exists
answers success without writing).  So a namespace
``ns`` is these objects:

``{ns}/.rec/{name}/{v}``   version v = 0, 1, 2, ... of record `name`: one
                           tag byte (b"V" a value, b"D" deleted), 8
                           random bytes (its writer's nonce), the value.
                           The record holds what its highest version says
                           (no version, or a D: it does not exist)
``{ns}/.rec/{name}/w{k}``  the digest of window k of its versions (below)
``{ns}/.names/{k}``        entry k = 0, 1, ... of the names index: a
                           record's name, written before its first
                           version, once per name ever; gapless: entry
                           k is written only by a writer that saw k - 1
``{ns}/.chunk/{name}/{epoch:016x}/{index}``  a piece, written once (its
                           epoch is random, so its key is new)

**A compare-and-swap** reads the record's highest version v and its value,
compares, and writes version v + 1 create-only, then reads it back
(_landed).  Its own nonce there means the step took effect, atomically: a
version is written only by a party that saw the one before it, so v was
the highest when v + 1 appeared.  Another party's version there means
another step came first: the record is read again and the rules applied
to what it holds then.  (A put of a key whose put by another client is
still under way also answers success without writing: the read-back waits
for the other's object to show.)

**Finding the highest version.**  A probe asks (one batch_is_exist) for a
window of W versions and the next MILESTONES multiples of W above it,
starting at the version last seen of the name (cached: versions only ever
grow).  Every multiple of W (a milestone) is kept for good, so a probe
steps from milestone to milestone to the window of the highest version.

**Old versions.**  After a delete (a D version at d), the versions of the
whole windows below d's go (forced, best effort), milestones excepted;
the newest is kept, so numbering never goes back, and so are the
versions of d's own window.  Before a window's versions go, their nonces
are written to the window's digest (create-only, kept for good), so that a writer that finds its version gone (others wrote on past
its window, and deleted) still learns whether the version was its own;
and a put that lands after its key was removed (a writer that stalled
between its read and its put) makes the key again, which the digest
tells from the version that was there.

**Reads are exact**: a read gives a value the record held at one moment
of the call.  It takes the probe's highest version N, reads it, checks
that N + 1 and the milestone above N do not exist, and then that N still
does.  A version above N, ever written, would leave one of those two (a
version goes only once the milestone above it exists), so at the first
check N was the highest; and as N was there from before its read until
after it, the bytes read are N's (a key removed and made again by a late
put has that milestone above it).

**Removals are forced** (remove(force=True)): every read, even an
existence check, gives the object a lease of Mooncake's (10 s by
default), which a plain remove would wait out.  A read still running
while its object is removed may then get the bytes of whatever took over
its memory; so every read here is confirmed afterwards by the object
still existing (records, the index, digests), and get_ranges checks the
pieces' sizes after reading them (and the protocol every chunk against
its manifest's checksum).

What this store cannot give, beyond kv.h:

* **Eviction.**  The records are the namespace's state, and the pieces of
  a published table its data: Mooncake must not evict them.  Pass
  ``config=`` a ReplicateConfig with ``with_hard_pin = True`` (used for
  every put), or give the store room.
* **Clocks.**  ``now_ms`` is this host's clock, so gc measures a push's
  age on the clock of the host that runs it: the hosts' clocks must agree
  to well within ttl_ms.
* **Expiry.**  Pieces never expire: those of a push that died go only
  when a gc settles its open record (after ttl_ms); a piece written after
  that (a put delivered late) stays for good.
* **Sync.**  A put returns once the object and its replicas are written:
  there is nothing to wait for.
* **A put that never ends.**  A client that dies within a put leaves the
  key taken until Mooncake's master discards the put
  (put_start_discard_timeout_sec, 30 s by default): a swap that needs that
  version fails meanwhile (MooncakeError: whether it took effect unknown).
* The names index only grows (one small object per name ever used), and
  a record's milestones and digests stay (two per W versions).
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any

from ._mooncake import (_TRANSIENT, MAX_KEYS, OBJECT_ALREADY_EXISTS, OBJECT_NOT_FOUND,
                        READ_DEADLINE, MooncakeError, _Client, check_name)

W = 16               # versions per probe window; every W-th version is a milestone, kept
MILESTONES = 16      # milestones probed above the window, in the same call
NAMES_PROBE = 64     # names index entries probed per call
EXIST_KEYS = 4096    # keys per batch_is_exist or batch_remove call
TRIES = 64           # rounds of a read or a swap racing other writers before it gives up
NONCE = 8
VALUE, DELETED = b"V", b"D"

# kv.h's answers of rec_cas.
DONE, ABSENT, PRESENT, DIFFERS = 1, 0, 2, -1


class MooncakeKV:
    """The kv.h store of namespace `namespace` on a Mooncake Store client
    (``mooncake.store.MooncakeDistributedStore``, set up by the caller).
    Every method may be called from any thread; a failure raises
    MooncakeError (an EngramError, errno EIO) unless said otherwise."""

    def __init__(self, store_client: Any, namespace: str, *, config: object = None,
                 read_deadline: float = READ_DEADLINE) -> None:
        self.c = _Client(store_client, read_deadline=read_deadline)
        self.mc: Any = self.c.mc
        self.ns = check_name(namespace, "namespace")
        self.config = config  # every put's ReplicateConfig (None: Mooncake's default)
        self.lock = threading.Lock()
        self.seen: dict[str, int] = {}   # name -> its highest version seen (a hint)
        self.names: set[str] = set()     # names of the index read so far
        self.next_name = 0               # the first index entry not known to exist

    def __repr__(self) -> str:
        return f"MooncakeKV(namespace={self.ns!r})"

    def close(self) -> None:
        """Hands the staging buffer back (no call into the client)."""
        self.c.close()

    # -- keys and calls --------------------------------------------------------

    def _rkey(self, name: str, v: int) -> str:
        return f"{self.ns}/.rec/{name}/{v}"

    def _wkey(self, name: str, k: int) -> str:
        return f"{self.ns}/.rec/{name}/w{k}"

    def _nkey(self, k: int) -> str:
        return f"{self.ns}/.names/{k}"

    def piece_key(self, name: str, epoch: int, index: int) -> str:
        """The object of piece `index` of publication `epoch` of `name`."""
        return f"{self.ns}/.chunk/{name}/{epoch:016x}/{index}"

    def _exist(self, keys: list[str]) -> list[bool]:
        out: list[bool] = []
        for i in range(0, len(keys), EXIST_KEYS):
            part = keys[i:i + EXIST_KEYS]
            have = self.c.exist(part)
            out += [have[k] for k in part]
        return out

    def _get(self, keys: list[str]) -> list[bytes]:
        """The bytes of each key (b"": missing, or the read failed), unconfirmed."""
        raws = self.mc.get_batch(keys) if len(keys) > 1 else [self.mc.get(keys[0])]
        if len(raws) != len(keys):
            raise MooncakeError(keys[0], f"get_batch answered {len(raws)} of {len(keys)} keys")
        return [bytes(r) for r in raws]

    def _read(self, keys: list[str], appear: bool = False) -> list[bytes | None]:
        """The bytes of each object, None where it does not exist: each read
        confirmed by the object existing after it (see the module doc).
        With appear, one that does not exist yet is waited for until the
        read deadline: a put of a key whose put by another client is still
        under way answers success without writing, and the other's object
        shows only once its put ends."""
        out: list[bytes | None] = [None] * len(keys)
        todo = list(range(len(keys)))
        deadline, delay = time.monotonic() + self.c.read_deadline, 0.001
        while todo:
            raws = self._get([keys[i] for i in todo])
            have = self._exist([keys[i] for i in todo])
            again = []
            for i, raw, h in zip(todo, raws, have):
                if h and raw:
                    out[i] = raw
                elif h or appear:
                    again.append(i)  # there but its read failed, or not there yet
            todo = again
            if todo and time.monotonic() + delay > deadline:
                if appear:
                    return out
                raise MooncakeError(keys[todo[0]], "exists, but reading it kept failing for "
                                    f"{self.c.read_deadline:g} s")
            if todo:
                time.sleep(delay)
                delay = min(delay * 2, 0.1)
        return out

    def _put(self, key: str, value: bytes) -> int:
        """A put of a small object (create-only in effect): Mooncake's code."""
        rc: int = self.mc.put(key, value) if self.config is None else \
            self.mc.put(key, value, self.config)
        return rc

    def _remove(self, keys: list[str]) -> None:
        """Removes the objects (forced: see the module doc); missing ones
        are no failure.  Tries them all, then raises the first failure."""
        first: MooncakeError | None = None
        for i in range(0, len(keys), EXIST_KEYS):
            part = keys[i:i + EXIST_KEYS]
            if hasattr(self.mc, "batch_remove"):
                res = list(self.mc.batch_remove(part, True))
            else:
                res = [self.mc.remove(k, True) for k in part]
            if len(res) != len(part):
                res = (res + [-1] * len(part))[:len(part)]
            for k, rc in zip(part, res):
                if rc not in (0, OBJECT_NOT_FOUND) and first is None:
                    first = MooncakeError(k, "remove failed", rc)
        if first is not None:
            raise first

    # -- records ---------------------------------------------------------------

    def _probe(self, names: list[str], start: dict[str, int]) -> dict[str, int]:
        """{name: its highest version (-1: none)} by probing from start[name]
        (a hint: a version that existed), from milestone to milestone.  Not
        exact by itself: _tops confirms it."""
        base = {n: start[n] - start[n] % W for n in names}
        top: dict[str, int] = {}
        todo = list(names)
        offsets = [*range(W), *range(W, W * (MILESTONES + 1), W)]  # the window, the milestones
        span = len(offsets)
        for _ in range(TRIES):
            if not todo:
                return top
            have = self._exist([self._rkey(n, base[n] + o) for n in todo for o in offsets])
            again = []
            for i, n in enumerate(todo):
                h = have[i * span:(i + 1) * span]
                ms = [j for j in range(MILESTONES) if h[W + j]]
                found = [j for j in range(W) if h[j]]
                if ms:
                    base[n] += W * (max(ms) + 1)
                    again.append(n)
                elif found:
                    top[n] = base[n] + max(found)
                elif base[n]:
                    base[n] = 0  # none where one was: the objects were lost; from the start
                    again.append(n)
                else:
                    top[n] = -1
            todo = again
        raise MooncakeError(self._rkey(todo[0], base[todo[0]]),
                            f"no end of the record's versions after {TRIES} probes")

    def _tops(self, names: list[str]) -> dict[str, tuple[int, bytes | None]]:
        """{name: (v, value)}: each record's highest version (-1: none) and
        its value (None: the record does not exist), as it was at one moment
        of the call (see the module doc)."""
        out: dict[str, tuple[int, bytes | None]] = {}
        with self.lock:
            start = {n: self.seen.get(n, 0) for n in names}
        todo = list(names)
        for _ in range(TRIES):
            tops = self._probe(todo, start)
            live = [n for n in todo if tops[n] >= 0]
            out.update((n, (-1, None)) for n in todo if tops[n] < 0)
            if not live:
                return out
            keys = [self._rkey(n, tops[n]) for n in live]
            raws = self._get(keys)
            above = self._exist([self._rkey(n, v) for n in live
                                 for v in (tops[n] + 1, tops[n] - tops[n] % W + W)])
            still = self._exist(keys)
            todo = []
            for i, n in enumerate(live):
                if above[2 * i] or above[2 * i + 1] or not still[i] or not raws[i]:
                    start[n] = tops[n]  # moved on meanwhile (or its read failed): again
                    todo.append(n)
                    continue
                out[n] = (tops[n], self._value(keys[i], raws[i]))
                with self.lock:
                    self.seen[n] = tops[n]
            if not todo:
                return out
        raise MooncakeError(self._rkey(todo[0], start[todo[0]]),
                            f"the record kept changing over {TRIES} reads")

    @staticmethod
    def _value(key: str, raw: bytes) -> bytes | None:
        tag = raw[:1]
        if len(raw) < 1 + NONCE or tag not in (VALUE, DELETED):
            raise MooncakeError(key, f"not a record version ({len(raw)} bytes, tag {tag!r})")
        return raw[1 + NONCE:] if tag == VALUE else None

    def rec_get(self, name: str) -> bytes | None:
        """Record `name`'s value, None if it does not exist: a value it held
        at one moment of the call."""
        return self._tops([name])[name][1]

    def rec_cas(self, name: str, expect: bytes | None, val: bytes | None) -> int:
        """One atomic step on record `name` (kv.h): if it holds exactly
        `expect` (None: if it does not exist), it then holds `val` (None:
        deleted).  Returns 1 done, 0 absent (something was expected), 2
        present (put-if-absent found something), -1 differs.  Expecting the
        very bytes it puts writes them again (a new version).  A failure
        raised after the version was written says so: whether the step took
        effect is then unknown."""
        blob = (DELETED if val is None else VALUE) + os.urandom(NONCE) + \
            (b"" if val is None else bytes(val))
        want = None if expect is None else bytes(expect)
        for _ in range(TRIES):
            v, cur = self._tops([name])[name]
            if want is None and cur is not None:
                return PRESENT
            if want is not None and cur is None:
                return ABSENT
            if want is not None and cur != want:
                return DIFFERS
            if val is None and cur is None:
                return DONE  # nothing to delete
            if cur is None:
                self._add_name(name)
            key = self._rkey(name, v + 1)
            rc = self._put(key, blob)
            ours = self._landed(name, v + 1, blob)
            if ours:
                with self.lock:
                    self.seen[name] = v + 1
                if val is None:
                    self._drop_below(name, v + 1)
                return DONE
            if ours is None:
                raise MooncakeError(key, "the record's new version did not show within "
                                    f"{self.c.read_deadline:g} s of its upload: whether the "
                                    "change took effect is unknown",
                                    rc if rc not in (0, OBJECT_ALREADY_EXISTS) else None)
            # Another party's version: its step came first; read again.
        raise MooncakeError(self._rkey(name, 0), f"the record kept changing over {TRIES} swaps")

    def _landed(self, name: str, v: int, blob: bytes) -> bool | None:
        """Whether version v of `name` is the one this writer uploaded
        (blob), read back.  One not there yet is waited for: a put of a key
        whose put by another client is under way answers success without
        writing, and the other's object shows once its put ends.  One whose
        window was removed meanwhile (others wrote on, and deleted) is
        looked up in the window's digest, as is one whose window was
        removed before it landed.  None if neither shows within the read
        deadline."""
        key = self._rkey(name, v)
        wkey = self._wkey(name, v // W) if v % W else None
        deadline, delay = time.monotonic() + self.c.read_deadline, 0.001
        while True:
            got = self._read([key])[0]
            # The digest is asked after the version: a version read back may
            # be a put that landed after its window was removed (a writer
            # that stalled between its read and its put), which the digest,
            # written before any removal, tells apart.
            dig = self._read([wkey])[0] if wkey is not None else None
            if dig is not None:
                j = (v % W - 1) * NONCE
                return dig[j:j + NONCE] == blob[1:1 + NONCE]
            if got is not None:
                return got == blob
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 0.1)

    def _drop_below(self, name: str, d: int) -> None:
        """Removes the versions of the whole windows below version d's,
        milestones excepted, window by window downwards until one has none
        left; best effort (what stays costs only memory).  Before a window's
        versions go, their nonces go into its digest (create-only, kept for
        good), so that a writer that finds its version gone can still tell
        whether it was its own (_landed)."""
        k = d // W - 1
        try:
            while k >= 0:
                keys = [self._rkey(name, v) for v in range(k * W + 1, (k + 1) * W)]
                have = self._exist(keys)
                if not any(have):
                    return
                wkey = self._wkey(name, k)
                if not self._exist([wkey])[0]:
                    # All there (none goes before the digest is): their nonces.
                    raws = self._read(keys)
                    if any(r is None for r in raws):
                        return  # another cleaner's digest is there now, or they were lost
                    self._put(wkey, b"".join(r[1:1 + NONCE] for r in raws if r))
                    if self._read([wkey], appear=True)[0] is None:
                        return
                self._remove([key for key, h in zip(keys, have) if h])
                k -= 1
        except Exception:  # noqa: BLE001 - housekeeping; the swap itself is done
            pass

    def rec_list(self) -> list[tuple[str, bytes]]:
        """(name, value) of every record that exists, each as it was at one
        moment of the call; the names from the index."""
        names = sorted(self._scan_names())
        tops = self._tops(names) if names else {}
        return [(n, val) for n in names if (val := tops[n][1]) is not None]

    def _scan_names(self) -> set[str]:
        """Reads the names index entries written since the last scan;
        returns every name."""
        with self.lock:
            k = self.next_name
        while True:
            keys = [self._nkey(i) for i in range(k, k + NAMES_PROBE)]
            found = [key for key, h in zip(keys, self._exist(keys)) if h]
            if not found:
                with self.lock:
                    return set(self.names)
            raws = self._read(found)
            with self.lock:
                for key, raw in zip(found, raws):
                    if raw is not None:
                        self.names.add(raw.decode("utf-8", "replace"))
                    self.next_name = max(self.next_name, int(key.rsplit("/", 1)[1]) + 1)
                k = self.next_name

    def _add_name(self, name: str) -> None:
        """Puts `name` in the names index unless it is there: at the first
        free entry, create-only, read back (another name there: scanned
        again, and the next one tried)."""
        entry = name.encode()
        with self.lock:
            if name in self.names:
                return
        if name in self._scan_names():
            return
        for _ in range(TRIES):
            with self.lock:
                k = self.next_name
            key = self._nkey(k)
            rc = self._put(key, entry)
            got = self._read([key], appear=True)[0]
            if got is None:
                raise MooncakeError(key, "names index entry upload failed",
                                    rc if rc not in (0, OBJECT_ALREADY_EXISTS) else None)
            with self.lock:
                self.names.add(got.decode("utf-8", "replace"))
                self.next_name = max(self.next_name, k + 1)
            if got == entry or name in self._scan_names():
                return
        raise MooncakeError(self._nkey(k), f"no free names index entry after {TRIES} tries")

    def now_ms(self) -> int:
        """This host's clock (ms since the Unix epoch): Mooncake has none of
        its own to offer, so gc measures a push's age on the clock of the
        host that runs it."""
        return time.time_ns() // 1_000_000

    def sync(self) -> None:
        """Nothing to wait for: a put returns once its replicas are written."""

    # -- pieces ----------------------------------------------------------------

    def piece_put(self, name: str, epoch: int, layout: int, index: int, data: Any,
                  ttl_ms: int) -> None:
        """Writes piece `index` (a new key: its epoch is random).  It never
        expires (ttl_ms is not kept): a dead push's pieces are deleted by
        the gc that settles its open record.  layout: Mooncake places
        objects itself, so every layout is the same."""
        key = self.piece_key(name, epoch, index)
        np = self.c.np
        rc = self.c.put([key], [np.frombuffer(data, np.uint8)], self.config)[0]
        if rc not in (0, OBJECT_ALREADY_EXISTS):  # there already: a copy of this very write
            raise MooncakeError(key, "chunk upload failed", rc)

    def piece_expire(self, name: str, epoch: int, layout: int, index: int, ttl_ms: int) -> bool:
        """Whether piece `index` still exists: Mooncake objects do not
        expire, so there is no expiry to set."""
        key = self.piece_key(name, epoch, index)
        return self._exist([key])[0]

    def piece_del(self, name: str, epoch: int, layout: int, n: int) -> None:
        """Removes pieces [0, n), in order (forced: see the module doc);
        missing ones are no failure."""
        self._remove([self.piece_key(name, epoch, i) for i in range(n)])

    def get_ranges(self, name: str, epoch: int, layout: int,
                   ranges: list[tuple[int, int, int, bool]], out: Any) -> None:
        """Reads each range (index, start, length, whole) of the pieces,
        back to back, into `out` (a writable buffer; no view of it is kept
        past the call): whole pieces straight into it (_read_whole), other
        ranges through the staging buffer in calls of ranges of one length.  Then checks (one call)
        that every piece still exists with a length the range fits (whole:
        exactly its end), which also proves the bytes read were its own (see
        the module doc).  A missing piece or one of another length raises
        LookupError."""
        np = self.c.np
        dst = np.frombuffer(out, np.uint8)
        keys = [self.piece_key(name, epoch, r[0]) for r in ranges]
        failed: MooncakeError | None = None
        try:
            if all(start == 0 and whole for _, start, _, whole in ranges) and \
                    len(set(keys)) == len(keys):
                self._read_whole(keys, [r[2] for r in ranges], dst)
            else:
                self._read_ranges(keys, ranges, dst)
        except MooncakeError as e:
            # A missing piece or a range past its end: the sizes tell.  Its
            # traceback goes: its frames hold views of out, and none may
            # outlive the call (_Publication(direct=True)).
            failed = e.with_traceback(None)
        del dst
        sizes = self.c.sizes(sorted(set(keys))) if keys else {}
        for key, (_, start, length, whole) in zip(keys, ranges):
            got, end = sizes[key], start + length
            if not got:
                raise LookupError(f"{key}: not in the Mooncake store")
            if len(got) > 1 or (whole and got != {end}) or min(got) < end:
                raise LookupError(f"{key}: {'/'.join(map(str, sorted(got)))} bytes, where the "
                                  f"read needs {'exactly ' if whole else 'at least '}{end}")
        if failed is not None:
            raise failed

    def _read_whole(self, keys: list[str], lengths: list[int], dst: Any) -> None:
        """Whole pieces, back to back, straight into dst: registered for
        the call (about a millisecond for 256 MiB here, where copying out
        of a staging buffer costs a pass over every byte), then read by
        batch_get_into, MAX_KEYS objects a call."""
        base = dst.ctypes.data
        offs = [0]
        for n in lengths:
            offs.append(offs[-1] + n)
        rc = self.mc.register_buffer(base, dst.nbytes)
        if rc != 0:
            raise MooncakeError(keys[0], f"register_buffer of {dst.nbytes} bytes failed", rc)
        deadline = time.monotonic() + self.c.read_deadline
        try:
            for i in range(0, len(keys), MAX_KEYS):
                part, want = keys[i:i + MAX_KEYS], lengths[i:i + MAX_KEYS]
                ptrs = [base + o for o in offs[i:i + len(part)]]
                delay = 0.002
                while True:
                    res = list(self.mc.batch_get_into(part, ptrs, want))
                    if len(res) != len(part):
                        raise MooncakeError(part[0], f"batch_get_into answered {len(res)} of "
                                            f"{len(part)} keys")
                    bad = [(k, n, got) for k, n, got in zip(part, want, res) if got != n]
                    if not bad:
                        break
                    k, n, got = bad[0]
                    if got >= 0:
                        raise MooncakeError(k, f"read {got} of its {n} bytes")
                    if got not in _TRANSIENT or time.monotonic() + delay > deadline:
                        raise MooncakeError(k, "reading it failed", got)
                    time.sleep(delay)  # passing: the whole call again
                    delay = min(delay * 2, 0.2)
        finally:
            self.mc.unregister_buffer(base)

    def _read_ranges(self, keys: list[str], ranges: list[tuple[int, int, int, bool]],
                     dst: Any) -> None:
        c = self.c
        with c.lock:
            stage = c._staging(1)
            cap = len(stage)
            # (key, offset in the piece, length, offset in dst), each within the staging buffer
            segs: list[tuple[str, int, int, int]] = []
            at = 0
            for key, (_, start, length, _) in zip(keys, ranges):
                segs += [(key, start + o, min(cap, length - o), at + o)
                         for o in range(0, length, cap)]
                at += length
            i = 0
            while i < len(segs):
                m = segs[i][2]
                pos: dict[str, int] = {}
                dsts: list[list[int]] = []
                srcs: list[list[int]] = []
                copies: list[tuple[int, int]] = []
                used = 0
                # One call: segments of one length, back to back in the staging buffer.
                while i < len(segs) and segs[i][2] == m and used + m <= cap:
                    key, src, _, o = segs[i]
                    if key not in pos:
                        if len(pos) == MAX_KEYS:
                            break
                        pos[key] = len(dsts)
                        dsts.append([])
                        srcs.append([])
                    dsts[pos[key]].append(used)
                    srcs[pos[key]].append(src)
                    copies.append((used, o))
                    used += m
                    i += 1
                c._read_chunk(list(pos), m, stage.ctypes.data, dsts, srcs,
                              time.monotonic() + c.read_deadline)
                for s, o in copies:
                    dst[o:o + m] = stage[s:s + m]
