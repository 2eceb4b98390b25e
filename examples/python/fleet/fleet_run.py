"""One failover run of the camera fleet against a real cluster, shared by
the test (test_fleet.py) and the measurement (measure.py): start the fleet,
wait until every camera is owned and written, SIGKILL a worker (and, with
leader_kill, the cluster's leader right after), then time until each of
the dead worker's cameras is owned by another worker, and check the
fencing: tokens only went up and the dead worker's late write is refused."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from typing import Any, Dict

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "clients", "python", "tests"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "..", "clients", "python", "src"))
sys.path.insert(0, HERE)

import leasehold  # noqa: E402
from manager import Fleet, owners  # noqa: E402


def wait_until(cond, timeout: float, what: str, poll: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def run_once(cluster, run: int, leader_kill: bool, ttl: float = 3.0, workers: int = 3, cameras: int = 9) -> Dict[str, Any]:
    fleet = Fleet(cluster.addrs, workers, cameras, ttl, name=f"r{run}w").start()
    out: Dict[str, Any] = {}
    try:
        plan = fleet.assignment()
        victim = f"r{run}w1"
        mine = plan[victim]

        def settled():
            st = fleet.sink_state()
            return all(cam in st and st[cam]["worker"] == w and st[cam]["accepted"] >= 2
                       for w, cams in plan.items() for cam in cams)
        wait_until(settled, 60, "every camera owned by its assigned worker and written")
        before = fleet.sink_state()
        old_tokens = {cam: before[cam]["token"] for cam in mine}

        fleet.kill(victim)
        killed = time.monotonic()
        killed_leader = None
        if leader_kill:
            killed_leader = cluster.leader()
            killed_leader.kill()

        def reowned():
            got = {}
            for w, log in list(fleet.logs.items()):
                if w == victim:
                    continue
                for ev in list(log):
                    if ev.get("event") == "owned" and ev["camera"] in mine and ev["seen"] > killed:
                        got.setdefault(ev["camera"], (ev["seen"], w, ev["token"]))
            return got if len(got) == len(mine) else None
        got = wait_until(reowned, ttl + 30, "the dead worker's cameras owned again")
        out["reown_s"] = max(t for t, _, _ in got.values()) - killed
        out["first_reown_s"] = min(t for t, _, _ in got.values()) - killed
        for cam, (_, w, tok) in got.items():
            assert tok > old_tokens[cam], (cam, tok, old_tokens[cam])

        # The new owners write; tokens only went up at the sink.
        wait_until(lambda: all(fleet.sink_state()[cam]["worker"] != victim for cam in mine), 30,
                   "the new owners' writes")
        st = fleet.sink_state()
        for cam, s in st.items():
            toks = s["tokens"]
            assert toks == sorted(set(toks)), (cam, toks)
        # The dead worker's late write (its last accepted one, sent again)
        # is refused.
        for cam in mine:
            late = before[cam]["last"]
            assert late["worker"] == victim
            assert fleet.sink_write(late) == 409, cam
        assert all(fleet.sink_state()[cam]["refused"] >= 1 for cam in mine)

        # The survivors' sessions carry their stats, the taken-over cameras included.
        async def stats():
            async with leasehold.Client(cluster.addrs, retry_for=30) as c:
                own = await owners(c)
                sessions = {s.holder: s for s in await c.list_sessions() if s.state == "active"}
                return own, sessions

        def stats_show():
            own, sessions = asyncio.run(stats())
            for cam in mine:
                w = own[cam].holder
                if cam not in sessions[w].metadata.get("cameras", "").split(","):
                    return None
            return sessions
        sessions = wait_until(stats_show, 20, "the survivors' heartbeat stats", poll=0.2)
        out["stats"] = {w: s.metadata for w, s in sessions.items() if w.startswith(f"r{run}w")}
        out["new_owners"] = {cam: w for cam, (_, w, _) in got.items()}
        out["respawns"] = dict(fleet.respawns)
        if killed_leader is not None:
            killed_leader.start()
            cluster.wait_ready(cluster.servers, 60)
        return out
    finally:
        fleet.stop()
        async def cleanup():
            async with leasehold.Client([s.http for s in cluster.servers if s.alive()], retry_for=30) as c:
                for w in fleet.assignment():
                    await c.release_holder(w)
        asyncio.run(cleanup())
