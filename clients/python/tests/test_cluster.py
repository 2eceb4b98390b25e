"""The client against a real three-server cluster on loopback, through a
leader kill (SIGKILL)."""

import asyncio
import time

import leasehold
from leasehold import errors as E


def run(coro, timeout=120):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_cluster_leader_kill(trio):
    leader = trio.leader()
    # The leader first: the client's requests and its event stream start there.
    addrs = [leader.http] + [s.http for s in trio.servers if s is not leader]

    async def main():
        async with leasehold.Client(addrs, retry_for=30) as c:
            l = await c.acquire("py/c/before", "w1", ttl=30)
            assert l.state == "active"
            async with c.session("py-cw", ttl=4, stats=lambda: {"t": str(time.monotonic())}) as s:
                lk = await leasehold.Lock(s, "py/c/lock").acquire()
                events = []

                async def follow():
                    async for ev in c.events(prefix="py/c/"):
                        events.append(ev)
                watcher = asyncio.ensure_future(follow())
                await asyncio.sleep(0.3)

                leader.kill()
                killed = time.monotonic()
                # Writes go on through the other servers once they elect a
                # leader: retried over the addresses (refused, 503).
                l2 = await c.acquire("py/c/after", "w1", ttl=30)
                took = time.monotonic() - killed
                assert l2.state == "active" and l2.fencing_token > l.fencing_token, l2
                assert took < 20, took
                # The session lived through it: heartbeats continue on the new leader.
                before = (await c.get_session(s.session_id)).heartbeat_count
                deadline = time.monotonic() + 15
                while (await c.get_session(s.session_id)).heartbeat_count <= before + 2:
                    assert time.monotonic() < deadline, "no heartbeats after the leader kill"
                    await asyncio.sleep(0.1)
                assert s.alive() and lk.held and not lk.lost.is_set()
                assert (await c.get(lk.lease.lease_id)).state == "active"
                assert "t" in (await c.get_session(s.session_id)).metadata
                # The event stream moved to another server and saw the new acquire.
                deadline = time.monotonic() + 15
                while not any(e.type == "acquired" and e.key == "py/c/after" for e in events):
                    assert time.monotonic() < deadline, [(e.type, e.key) for e in events]
                    await asyncio.sleep(0.05)
                ids = [e.id for e in events]
                assert len(ids) == len(set(ids)), "an event was repeated"
                watcher.cancel()
                await lk.release()
            assert (await c.get(lk.lease.lease_id)).state == "released"
    run(main())
