"""Free TCP ports of 127.0.0.1 for the servers the tests start (Redis
Cluster nodes, Mooncake's master and metadata server).

A port the kernel hands out (``bind`` to port 0) lies in its ephemeral
range (/proc/sys/net/ipv4/ip_local_port_range), which is also where the
client side of every connection of the machine's other tests lives, and
their TIME_WAIT sockets: between the moment such a port is found free and
the moment a server binds it, a connection can take it (a Redis node's
cluster bus port, p + 10000, was the one seen taken).  The ports picked
here lie below that range, where the kernel never puts a connection's
client side, and are checked free by binding them (without SO_REUSEADDR,
which refuses TIME_WAIT too).  Another test may still pick the same port
at the same time: the servers' helpers start again with new ports when a
server's log says "Address already in use" (:func:`bind_failed`).
"""
from __future__ import annotations

import ctypes
import random
import signal
import socket

HOST = "127.0.0.1"
LOWEST = 11000          # below: well-known ports and common services'


def ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 if unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def port_free(port: int) -> bool:
    """Whether no TCP socket of 127.0.0.1 has ``port`` (listening,
    connected or in TIME_WAIT)."""
    if not 0 < port < 65536:
        return False
    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def pick_ports(n: int, offset: int = 0, avoid: set[int] | None = None) -> list[int]:
    """``n`` distinct free ports p (and p + ``offset`` free too, if
    ``offset``: a Redis node's cluster bus port), all below the ephemeral
    range, none in ``avoid`` (nor its ports + ``offset``)."""
    taken = set(avoid or ())
    taken |= {p + offset for p in taken} | {p - offset for p in taken}
    hi = ephemeral_start() - offset - 1
    rng = random.SystemRandom()
    out: list[int] = []
    for _ in range(n):
        for _ in range(4000):
            if hi - LOWEST >= 64:
                p = rng.randint(LOWEST, hi)
            else:
                # No room below the range: a port the kernel picks, with
                # the checks, and the retries of the helpers.
                with socket.socket() as s:
                    s.bind((HOST, 0))
                    p = s.getsockname()[1]
                if p + offset > 65535:
                    continue
            if p in taken or (offset and p + offset in taken):
                continue
            if port_free(p) and (not offset or port_free(p + offset)):
                out.append(p)
                taken |= {p, p + offset, p - offset}
                break
        else:
            raise RuntimeError(f"no free port of {HOST} below {hi + 1}")
    return out


def bind_failed(log_path: str, offset: int = 0) -> bool:
    """Whether a server's log (from byte ``offset`` on: what one run of it
    wrote) says it could not bind a port."""
    try:
        with open(log_path, "rb") as f:
            f.seek(offset)
            return b"address already in use" in f.read().lower()
    except OSError:
        return False


def die_with_parent() -> None:
    """A server's preexec_fn: the kernel kills it (SIGKILL) when the test
    process that started it dies, however it dies (PR_SET_PDEATHSIG), so
    that a crashed test run leaves no server behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
