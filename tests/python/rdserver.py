"""A Redis Cluster for the tests, on this machine only: redis-server
processes on free 127.0.0.1 ports, joined with ``redis-cli --cluster
create``, waited for until every node says ``cluster_state:ok``, and
stopped by the PIDs started here.

Each server dies with the test process however it dies (PR_SET_PDEATHSIG
= SIGKILL in the child before exec), keeps no data on disk and logs to its
scratch directory (pytest's tmp_path: kept after the run).  With
ENGRAM_REDIS_PIDFILE set (scripts/test.sh sets it), every PID started is
appended there, so that the script can check that none is left running.

Ports come from ports.py: below the kernel's ephemeral range, bus ports
(p + 10000) included, and checked free; a server that could not bind one
all the same ("Address already in use" in its log) makes start() begin
again at once with new ports.  The node timeout is 15 s without replicas
(5 s with them, for failovers), so that a server descheduled on a busy
machine is not failed by the others; the waits end as soon as the cluster
is up, and are generous.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time

from ports import bind_failed, die_with_parent, pick_ports

HOST = "127.0.0.1"
BUS_OFFSET = 10000


def redis_missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        return ("redis-server or redis-cli not found (Debian: apt-get install redis-server "
                "redis-tools; scripts/setup.sh does it)")
    return None


def require_redis() -> None:
    """Skips the calling test where no cluster can run, unless
    ENGRAM_REQUIRE_REDIS=1 (scripts/test.sh), where that is a failure."""
    import pytest
    why = redis_missing()
    if why:
        if os.environ.get("ENGRAM_REQUIRE_REDIS") == "1":
            pytest.fail(why)
        pytest.skip(why)


class RedisCluster:
    """``masters`` masters with ``replicas`` replicas each (and the default
    user's ``password``, and ``extra`` server arguments); start() and
    stop() are safe to repeat."""

    def __init__(self, directory: str, masters: int = 3, replicas: int = 0,
                 password: str | None = None, extra: list[str] | None = None):
        self.dir = directory
        self.masters = masters
        self.replicas = replicas
        self.password = password
        self.extra = list(extra or [])
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen | None] = []

    @property
    def nodes(self) -> str:
        return ",".join(f"{HOST}:{p}" for p in self.ports)

    def _log(self, port: int) -> str:
        return os.path.join(self.dir, f"server-{port}.log")

    def _spawn(self, port: int) -> subprocess.Popen:
        timeout = "5000" if self.replicas else "15000"
        args = ["redis-server", "--port", str(port), "--bind", HOST, "--cluster-enabled", "yes",
                "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", timeout,
                "--dir", self.dir, "--save", "", "--appendonly", "no",
                "--logfile", self._log(port), "--daemonize", "no"]
        if self.password:
            args += ["--requirepass", self.password, "--masterauth", self.password]
        p = subprocess.Popen(args + self.extra, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=die_with_parent)
        pidfile = os.environ.get("ENGRAM_REDIS_PIDFILE")
        if pidfile:
            with open(pidfile, "a") as f:
                f.write(f"{p.pid}\n")
        return p

    def cli(self, i: int, *args: str, check: bool = True) -> str:
        env = dict(os.environ)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        r = subprocess.run(["redis-cli", "-h", HOST, "-p", str(self.ports[i]), *args],
                           capture_output=True, text=True, env=env, timeout=30)
        if check and r.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {r.stderr or r.stdout}")
        return r.stdout

    def _answers(self, i: int) -> bool:
        try:
            with socket.create_connection((HOST, self.ports[i]), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return bool(s.recv(64))
        except OSError:
            return False

    def _wait(self, pred, what: str, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.1)
        raise RuntimeError(f"the Redis cluster did not {what} within {seconds} s "
                           f"(logs in {self.dir})")

    def _started(self, i: int, seconds: float) -> bool:
        """Waits until server i answers: True; False if it exited because
        a port of its was taken (it is then started again with others);
        raises if it exited otherwise or does not answer in time."""
        end = time.monotonic() + seconds
        while not self._answers(i):
            proc = self.procs[i]
            if proc is not None and proc.poll() is not None:
                if bind_failed(self._log(self.ports[i])):
                    return False
                raise RuntimeError(f"redis-server on port {self.ports[i]} exited with "
                                   f"{proc.returncode} (its log: {self._log(self.ports[i])})")
            if time.monotonic() > end:
                raise RuntimeError(f"redis-server on port {self.ports[i]} did not answer within "
                                   f"{seconds} s (its log: {self._log(self.ports[i])})")
            time.sleep(0.05)
        return True

    def start(self) -> "RedisCluster":
        if self.procs:
            return self
        n = self.masters * (1 + self.replicas)
        try:
            for rebinds in range(21):
                self.ports = pick_ports(n, BUS_OFFSET)
                self.procs = [self._spawn(p) for p in self.ports]
                if all(self._started(i, 30) for i in range(n)):
                    break
                # Another process took a port since it was found free: new
                # ports, at once.
                self.stop()
            else:
                raise RuntimeError(f"redis-server could not bind its ports 21 times "
                                   f"(logs in {self.dir})")
            env = dict(os.environ)
            if self.password:
                env["REDISCLI_AUTH"] = self.password
            r = subprocess.run(["redis-cli", "--cluster", "create",
                                *[f"{HOST}:{p}" for p in self.ports],
                                "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                               capture_output=True, text=True, env=env, timeout=120)
            if r.returncode != 0:
                raise RuntimeError(f"redis-cli --cluster create failed: {r.stdout[-500:]} "
                                   f"(logs in {self.dir})")
            self._wait(lambda: all("cluster_state:ok" in self.cli(i, "cluster", "info",
                                                                  check=False)
                                   for i in range(n)), "reach cluster_state:ok", 120)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for p in self.procs:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
        self.procs = []
