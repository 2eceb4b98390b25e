"""The fleet's manager: spreads camera shards over worker processes.

    python manager.py --addrs A,B,C --workers 3 --cameras 12

It starts the sink, then one worker process per shard group: camera i goes
to worker i mod N, and every worker queues as standby for the cameras of
the others, so that a dead worker's cameras are taken over as soon as the
cluster ends its session (its TTL after its last heartbeat, plus a tick).
It then prints who owns what (from the cluster: the camera leases and the
workers' sessions with their heartbeat stats) every few seconds until
interrupted."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from typing import Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "clients", "python", "src"))
import leasehold  # noqa: E402


class Fleet:
    """A sink and N worker processes on the cluster at addrs."""

    def __init__(self, addrs: List[str], workers: int = 3, cameras: int = 12, ttl: float = 2.0,
                 python: str = sys.executable, verify: bool = True, name: str = "w") -> None:
        self.addrs, self.n, self.cams, self.ttl, self.python, self.verify = addrs, workers, cameras, ttl, python, verify
        self.name = name
        self.cameras = [f"cam-{i:02d}" for i in range(cameras)]
        self.procs: Dict[str, subprocess.Popen] = {}
        self.logs: Dict[str, List[dict]] = {}
        self.sink_proc: Optional[subprocess.Popen] = None
        self.sink = ""
        self.killed: set = set()
        self.respawns: Dict[str, int] = {}
        self._args: Dict[str, tuple] = {}
        self._stop = threading.Event()

    def assignment(self) -> Dict[str, List[str]]:
        out: Dict[str, List[str]] = {f"{self.name}{j + 1}": [] for j in range(self.n)}
        for i, cam in enumerate(self.cameras):
            out[f"{self.name}{i % self.n + 1}"].append(cam)
        return out

    def _reader(self, name: str, p: subprocess.Popen) -> None:
        assert p.stdout is not None
        for line in p.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"event": "log", "line": line.rstrip()}
            ev["seen"] = time.monotonic()
            self.logs.setdefault(name, []).append(ev)

    def start(self) -> "Fleet":
        args = [self.python, os.path.join(HERE, "sink.py"), "--addrs", ",".join(self.addrs)]
        if self.verify:
            args.append("--verify")
        self.sink_proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        assert self.sink_proc.stdout is not None
        line = self.sink_proc.stdout.readline()
        if not line.startswith("listening on "):
            raise RuntimeError(f"sink: {line!r}")
        self.sink = line.split()[-1]
        a = self.assignment()
        for w, mine in a.items():
            others = [c for c in self.cameras if c not in mine]
            self.spawn(w, mine, others)
        threading.Thread(target=self._supervise, daemon=True).start()
        return self

    def _supervise(self) -> None:
        # A worker that exits by itself (status 3: its session was lost,
        # say while the cluster elected a leader for longer than the
        # session could wait) is started again, as a supervisor would.
        while not self._stop.wait(0.1):
            for w, p in list(self.procs.items()):
                if p.poll() is not None and w not in self.killed and not self._stop.is_set():
                    self.respawns[w] = self.respawns.get(w, 0) + 1
                    self.spawn(w, *self._args[w])

    def spawn(self, w: str, mine: List[str], standby: List[str]) -> None:
        self._args[w] = (mine, standby)
        p = subprocess.Popen([self.python, os.path.join(HERE, "worker.py"), "--addrs", ",".join(self.addrs),
                              "--worker", w, "--shards", ",".join(mine), "--standby", ",".join(standby),
                              "--sink", self.sink, "--ttl", str(self.ttl)],
                             stdout=subprocess.PIPE, text=True)
        self.procs[w] = p
        threading.Thread(target=self._reader, args=(w, p), daemon=True).start()

    def kill(self, w: str) -> None:
        """SIGKILL worker w (it stays dead)."""
        self.killed.add(w)
        p = self.procs[w]
        p.send_signal(signal.SIGKILL)
        p.wait(10)

    def sink_state(self) -> dict:
        with urllib.request.urlopen(f"http://{self.sink}/state", timeout=5) as r:
            return json.loads(r.read())

    def sink_write(self, body: dict) -> int:
        req = urllib.request.Request(f"http://{self.sink}/write", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def stop(self) -> None:
        self._stop.set()
        for p in list(self.procs.values()) + ([self.sink_proc] if self.sink_proc else []):
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait(10)


async def owners(c: leasehold.Client) -> Dict[str, leasehold.Lease]:
    """camera -> its active lease, from the cluster."""
    return {l.key.split("/", 1)[1]: l for l in await c.list(prefix="camera/", state="active")}


async def report(addrs: List[str]) -> None:
    async with leasehold.Client(addrs) as c:
        while True:
            own = await owners(c)
            by: Dict[str, List[str]] = {}
            for cam, l in sorted(own.items()):
                by.setdefault(l.holder, []).append(f"{cam}@{l.fencing_token}")
            for s in await c.list_sessions():
                if s.state == "active":
                    print(f"{s.holder}: {' '.join(by.get(s.holder, []))}  stats {s.metadata}")
            print(flush=True)
            await asyncio.sleep(3)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addrs", default=os.environ.get("LEASEHOLD_ADDR", "127.0.0.1:7700"))
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--cameras", type=int, default=12)
    ap.add_argument("--ttl", type=float, default=2.0)
    a = ap.parse_args()
    addrs = [x for x in a.addrs.split(",") if x]
    fleet = Fleet(addrs, a.workers, a.cameras, a.ttl).start()
    try:
        asyncio.run(report(addrs))
    except KeyboardInterrupt:
        pass
    finally:
        fleet.stop()


if __name__ == "__main__":
    main()
