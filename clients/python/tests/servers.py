"""Real `leasehold server` processes on loopback for the tests (and the
fleet example): a binary built from this tree, free ports, temporary data
directories; every process is killed when its Cluster stops."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from typing import List, Optional

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
_used: set = set()


def build_binary() -> str:
    """$LEASEHOLD_BIN, or `go build` of ./cmd/leasehold into a temporary dir."""
    b = os.environ.get("LEASEHOLD_BIN")
    if b:
        return b
    out = os.path.join(tempfile.gettempdir(), f"leasehold-pytest-{os.getuid()}", "leasehold")
    os.makedirs(os.path.dirname(out), exist_ok=True)
    subprocess.run(["go", "build", "-o", out, "./cmd/leasehold"], cwd=REPO, check=True)
    os.environ["LEASEHOLD_BIN"] = out
    return out


def free_port() -> int:
    """A loopback port free for TCP and UDP, below the ephemeral range."""
    for _ in range(2000):
        p = random.randint(20000, 32000)
        if p in _used:
            continue
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as t, \
                    socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as u:
                t.bind(("127.0.0.1", p))
                u.bind(("127.0.0.1", p))
        except OSError:
            continue
        _used.add(p)
        return p
    raise RuntimeError("no free loopback port")


class Server:
    def __init__(self, binary: str, node_id: str, root: str, extra: Optional[List[str]] = None) -> None:
        self.bin, self.node_id = binary, node_id
        self.dir = os.path.join(root, node_id)
        os.makedirs(self.dir, exist_ok=True)
        self.http = f"127.0.0.1:{free_port()}"
        self.raft = f"127.0.0.1:{free_port()}"
        self.gossip = f"127.0.0.1:{free_port()}"
        self.extra = extra or []
        self.proc: Optional[subprocess.Popen] = None
        # With --tls-cert: readiness is asked over https, trusting ca_file.
        self.ca_file = ""

    def start(self) -> None:
        log = open(os.path.join(self.dir, "server.log"), "ab")
        self.proc = subprocess.Popen(
            [self.bin, "server", "--node-id", self.node_id, "--data-dir", os.path.join(self.dir, "data"),
             "--http-addr", self.http, "--raft-addr", self.raft, "--gossip-addr", self.gossip,
             "--tick-period", "20ms", "--log-level", "info", *self.extra],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def get(self, path: str, timeout: float = 2.0) -> tuple:
        scheme, ctx = "http", None
        if self.ca_file:
            import ssl
            scheme, ctx = "https", ssl.create_default_context(cafile=self.ca_file)
        try:
            with urllib.request.urlopen(f"{scheme}://{self.http}{path}", timeout=timeout, context=ctx) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            return e.code, {}
        except OSError:
            return 0, {}

    def log_tail(self, n: int = 4000) -> str:
        try:
            with open(os.path.join(self.dir, "server.log"), "rb") as f:
                return f.read()[-n:].decode("utf-8", "replace")
        except OSError:
            return ""


class Cluster:
    """n servers (1: a single server; 3: formed through gossip with
    --bootstrap-expect 3), ready when every one answers /readyz."""

    def __init__(self, n: int = 1, extra: Optional[List[str]] = None, ca_file: str = "") -> None:
        self.root = tempfile.mkdtemp(prefix="leasehold-pytest-")
        b = build_binary()
        self.servers = [Server(b, f"n{i + 1}", self.root, extra) for i in range(n)]
        for s in self.servers:
            s.ca_file = ca_file
        if n > 1:
            gossip = ",".join(s.gossip for s in self.servers)
            for s in self.servers:
                s.extra = s.extra + ["--join", gossip, "--bootstrap-expect", str(n)]

    @property
    def addrs(self) -> List[str]:
        return [s.http for s in self.servers]

    def start(self, timeout: float = 60.0) -> "Cluster":
        for s in self.servers:
            s.start()
        self.wait_ready(self.servers, timeout)
        return self

    def wait_ready(self, servers: List[Server], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(s.get("/readyz")[0] == 200 for s in servers):
                return
            for s in servers:
                if s.proc is not None and s.proc.poll() is not None:
                    raise RuntimeError(f"{s.node_id} exited: {s.log_tail()}")
            time.sleep(0.05)
        raise RuntimeError("cluster not ready: " + " | ".join(s.log_tail(1500) for s in servers))

    def leader(self, timeout: float = 30.0) -> Server:
        """The server the live ones agree leads."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for s in self.servers:
                if not s.alive():
                    continue
                st, body = s.get("/v1/cluster?stale=true")
                if st == 200 and body.get("leader") == s.node_id and body.get("state", "").lower() == "leader":
                    return s
            time.sleep(0.05)
        raise RuntimeError("no leader")

    def stop(self) -> None:
        for s in self.servers:
            s.kill()
        shutil.rmtree(self.root, ignore_errors=True)
