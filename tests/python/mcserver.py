"""A Mooncake Store for the tests, on this machine only: Mooncake's HTTP
metadata server and its master, started on free 127.0.0.1 ports, waited
for until they answer, and stopped by the PIDs started here; each also
dies with the test process however it dies (PR_SET_PDEATHSIG, as
rdserver.py's servers).  Also used by bench/bench_mooncake.py.

Needs the wheel mooncake-transfer-engine-non-cuda (and Debian's
libibverbs1, which its libraries link); scripts/test.sh installs both.

Ports come from ports.py: below the kernel's ephemeral range, where no
connection's client side can take them between the check and the bind;
a server that could not bind one all the same ("address already in use"
in its log) makes start() begin again at once with new ports.
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from ports import bind_failed, die_with_parent, pick_ports

HOST = "127.0.0.1"


def mooncake_missing() -> str | None:
    """Why Mooncake's Store cannot run here, or None."""
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        return (f"Mooncake's Python client is not importable ({e}); "
                "pip install mooncake-transfer-engine-non-cuda, and apt-get install "
                "libibverbs1 (scripts/test.sh does both)")
    if not os.access(master_binary(), os.X_OK):
        return f"the wheel has no mooncake_master at {master_binary()}"
    return None


def require_mooncake() -> None:
    """Skips the calling test where the wheel is missing, unless
    ENGRAM_REQUIRE_MOONCAKE=1 (scripts/test.sh sets it once the wheel
    installed), where that is a failure."""
    import pytest
    why = mooncake_missing()
    if why:
        if os.environ.get("ENGRAM_REQUIRE_MOONCAKE") == "1":
            pytest.fail(why)
        pytest.skip(why)


def master_binary() -> str:
    import mooncake
    return os.path.join(os.path.dirname(mooncake.__file__), "mooncake_master")


class _PortTaken(Exception):
    """A server exited because a port of its was taken meanwhile."""


def _answers_tcp(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _answers_http(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).close()
        return True
    except urllib.error.HTTPError:
        return True  # it answered (404 for an unknown key)
    except OSError:
        return False


class MooncakeServers:
    """The metadata server and a master; start() and stop() are safe to
    repeat, restart_master() replaces the master with an empty one on the
    same port."""

    def __init__(self, logdir: str):
        self.logdir = logdir
        self.meta_port, self.rpc_port, self.metrics_port = pick_ports(3)
        self.meta = None
        self.master = None
        self._logs = []
        self._log_start = {}  # process -> (its log, where its output starts)

    @property
    def metadata_url(self) -> str:
        return f"http://{HOST}:{self.meta_port}/metadata"

    @property
    def master_addr(self) -> str:
        return f"{HOST}:{self.rpc_port}"

    def _spawn(self, name, argv):
        path = os.path.join(self.logdir, f"{name}.log")
        log = open(path, "ab")
        self._logs.append(log)
        start = log.seek(0, os.SEEK_END)
        # The servers are Mooncake's programs, not ours: none of a sanitizer
        # run's preloads.
        env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "ASAN_OPTIONS")}
        # Each server dies with the test process however it dies.
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                start_new_session=True, env=env, preexec_fn=die_with_parent)
        # scripts/test.sh checks afterwards that every server it started is gone.
        pidfile = os.environ.get("ENGRAM_MOONCAKE_PIDFILE")
        if pidfile:
            with open(pidfile, "a") as f:
                f.write(f"{proc.pid}\n")
        self._log_start[proc.pid] = (path, start)
        return proc

    def start(self, timeout: float = 30.0) -> None:
        os.environ["MC_TCP_BIND_ADDRESS"] = HOST  # what this process's clients advertise
        try:
            for _ in range(21):
                try:
                    if self.meta is None:
                        self.meta = self._spawn("metadata", [
                            sys.executable, "-m", "mooncake.http_metadata_server", "--host",
                            HOST, "--port", str(self.meta_port), "--log-level", "WARNING"])
                    self._start_master(timeout)
                    self._wait(lambda: _answers_http(self.metadata_url + "?key=probe"),
                               self.meta, "metadata server", timeout)
                    return
                except _PortTaken:
                    # Another process took a port since it was found free:
                    # new ports, at once.
                    self.stop()
                    self.meta_port, self.rpc_port, self.metrics_port = pick_ports(3)
            raise RuntimeError(f"the Mooncake servers could not bind their ports 21 times "
                               f"(logs in {self.logdir})")
        except BaseException:
            self.stop()
            raise

    def _start_master(self, timeout: float = 30.0) -> None:
        self.master = self._spawn("master", [
            master_binary(), f"--rpc_address={HOST}", f"--rpc_port={self.rpc_port}",
            f"--metrics_host={HOST}", f"--metrics_port={self.metrics_port}"])
        self._wait(lambda: _answers_tcp(self.rpc_port), self.master, "mooncake_master", timeout)

    def _wait(self, ready, proc, what, timeout):
        end = time.monotonic() + timeout
        while not ready():
            if proc.poll() is not None:
                if bind_failed(*self._log_start.get(proc.pid, ("", 0))):
                    raise _PortTaken(what)
                raise RuntimeError(f"{what} exited with {proc.returncode} (log in {self.logdir})")
            if time.monotonic() > end:
                raise RuntimeError(f"{what} did not answer within {timeout:g} s "
                                   f"(log in {self.logdir})")
            time.sleep(0.05)

    def restart_master(self) -> None:
        """Kills the master (SIGKILL) and starts an empty one on the same
        port."""
        _stop(self.master, signal.SIGKILL)
        self._start_master()

    def client(self, segment_bytes: int = 0, buffer_bytes: int = 64 << 20):
        """A set-up MooncakeDistributedStore; segment_bytes of this
        process's memory join the store (0: none, the client only reads and
        writes others' segments)."""
        from mooncake.store import MooncakeDistributedStore
        c = MooncakeDistributedStore()
        rc = c.setup(HOST, self.metadata_url, segment_bytes, buffer_bytes, "tcp", "",
                     self.master_addr)
        if rc != 0:
            raise RuntimeError(f"MooncakeDistributedStore.setup failed with {rc}")
        return c

    def stop(self) -> None:
        for p in (self.master, self.meta):
            _stop(p, signal.SIGTERM)
        self.master = self.meta = None
        for log in self._logs:
            log.close()
        self._logs = []


def _stop(proc, sig) -> None:
    """Stops a process this module started, by its PID."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.kill(proc.pid, sig)
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    except ProcessLookupError:
        pass
