"""A fleet worker: holds camera shards on one session and processes them.

    python worker.py --addrs A,B,C --worker w1 --shards cam-0,cam-3 \
        --standby cam-1,cam-2 --sink 127.0.0.1:PORT --ttl 2

It opens one session (heartbeats carry its processing statistics), takes
the lease of each of its own shards (key camera/<id>, bound to the session,
with a grant), and queues for every standby shard, so that when the
shard's owner dies the lease comes to a live worker the moment the server
ends the dead one's session. While it owns a camera it "processes frames"
and writes the results to the sink with the lease's fencing token and
grant. When its session is lost (the heartbeat's deadline passes, before
the server could give the shards to someone else) it stops writing at once
and exits with status 3 (a supervisor restarts it)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Dict

import aiohttp

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "clients", "python", "src"))
import leasehold  # noqa: E402
from leasehold import errors as E  # noqa: E402


class Worker:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a = a
        self.frames: Dict[str, int] = {}
        self.owned: Dict[str, int] = {}  # camera -> fencing token

    def stats(self) -> Dict[str, str]:
        return {"worker": self.a.worker, "cameras": ",".join(sorted(self.owned)),
                "frames": str(sum(self.frames.values()))}

    async def hold(self, c: leasehold.Client, s: leasehold.LiveSession, http: aiohttp.ClientSession,
                   cam: str, standby: bool) -> None:
        if standby:
            # Owners first: queue behind the camera's owner once it holds
            # it (or take it after standby_grace if no owner shows up).
            give_up = time.monotonic() + self.a.standby_grace
            while time.monotonic() < give_up:
                page, _, _ = await c.list_page(key="camera/" + cam, state="active", limit=1)
                if page:
                    break
                await asyncio.sleep(0.2)
        lock = leasehold.Lock(s, "camera/" + cam, grant=True)
        while s.alive():
            try:
                await lock.acquire()
            except (E.LeaseHeld, E.LockDelay):
                continue
            except E.LeaseLost:
                return
            lease = lock.lease
            assert lease is not None
            self.owned[cam] = lease.fencing_token
            print(json.dumps({"event": "owned", "camera": cam, "token": lease.fencing_token,
                              "worker": self.a.worker, "t": time.time()}), flush=True)
            try:
                while not lock.lost.is_set():
                    self.frames[cam] = self.frames.get(cam, 0) + 1
                    body = {"camera": cam, "token": lease.fencing_token, "worker": self.a.worker,
                            "frame": self.frames[cam], "grant": lease.grant}
                    try:
                        async with http.post(f"http://{self.a.sink}/write", json=body) as r:
                            if r.status == 409:  # fenced out: someone newer owns it
                                print(json.dumps({"event": "fenced", "camera": cam, "worker": self.a.worker}), flush=True)
                                break
                    except aiohttp.ClientError:
                        pass
                    try:
                        await asyncio.wait_for(lock.lost.wait(), self.a.frame_every)
                    except asyncio.TimeoutError:
                        pass
            finally:
                self.owned.pop(cam, None)

    async def run(self) -> int:
        a = self.a
        async with leasehold.Client(a.addrs, retry_for=30) as c, aiohttp.ClientSession() as http:
            s = await c.session(a.worker, ttl=a.ttl, stats=self.stats).open()
            print(json.dumps({"event": "session", "worker": a.worker, "session": s.session_id}), flush=True)
            tasks = [asyncio.ensure_future(self.hold(c, s, http, cam, False)) for cam in a.shards]
            tasks += [asyncio.ensure_future(self.hold(c, s, http, cam, True)) for cam in a.standby]
            err = await s.wait_lost()
            for t in tasks:
                t.cancel()
            print(json.dumps({"event": "lost", "worker": a.worker, "error": str(err)}), flush=True)
            return 3


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--addrs", default=os.environ.get("LEASEHOLD_ADDR", "127.0.0.1:7700"))
    ap.add_argument("--worker", required=True)
    ap.add_argument("--shards", default="")
    ap.add_argument("--standby", default="")
    ap.add_argument("--sink", required=True)
    ap.add_argument("--ttl", type=float, default=2.0)
    ap.add_argument("--frame-every", type=float, default=0.1)
    ap.add_argument("--standby-grace", type=float, default=15.0)
    a = ap.parse_args()
    a.shards = [x for x in a.shards.split(",") if x]
    a.standby = [x for x in a.standby.split(",") if x]
    sys.exit(asyncio.run(Worker(a).run()))


if __name__ == "__main__":
    main()
