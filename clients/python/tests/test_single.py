"""The client against one real server built from this tree."""

import asyncio
import time

import pytest

import leasehold
from leasehold import errors as E


def run(coro, timeout=60):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_lease_lifecycle(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            l = await c.acquire("py/life", "w1", ttl=5, metadata={"a": "1"}, grant=True)
            assert l.state == "active" and l.token and l.fencing_token > 0 and l.metadata == {"a": "1"}
            assert l.grant.count(".") == 2
            with pytest.raises(E.LeaseHeld) as ei:
                await c.acquire("py/life", "w2", ttl=5)
            assert ei.value.status == 409 and ei.value.key == "py/life"
            assert ei.value.holders and ei.value.holders[0].holder == "w1"
            r = await c.renew(l.lease_id, l.token, metadata={"b": "2"})
            assert r.renewal_count == 1 and r.metadata == {"b": "2"}
            with pytest.raises(E.LeaseTokenInvalid):
                await c.renew(l.lease_id, "wrong")
            g = await c.get(l.lease_id)
            assert g.state == "active" and g.token == ""
            v = await c.validate(key="py/life", fencing_token=l.fencing_token)
            assert v.valid and v.reason == "active"
            ls = await c.list(prefix="py/life")
            assert [x.lease_id for x in ls] == [l.lease_id]
            await c.release(l.lease_id, l.token)
            assert (await c.get(l.lease_id)).state == "released"
            # A second release of the same lease counts as done.
            assert await c.release(l.lease_id, l.token) is None
            v = await c.validate(key="py/life", fencing_token=l.fencing_token)
            assert not v.valid
            with pytest.raises(E.LeaseNotFound):
                await c.get("ls_nope")
            with pytest.raises(E.InvalidArgument) as ei:
                await c.acquire("", "w1", ttl=5)
            assert ei.value.field == "key"
    run(main())


def test_idempotent_acquire_replays(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            a = await c.acquire("py/idem", "w1", ttl=5, idempotency_key="k-1")
            b = await c.acquire("py/idem", "w1", ttl=5, idempotency_key="k-1")
            assert a.lease_id == b.lease_id and a.token == b.token
            with pytest.raises(E.IdempotencyConflict):
                await c.acquire("py/idem", "w1", ttl=6, idempotency_key="k-1")
            await c.release(a.lease_id, a.token)
    run(main())


def test_wait_limit_lock_delay_revoke(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            s1 = await c.acquire("py/sem", "a", ttl=5, limit=2)
            s2 = await c.acquire("py/sem", "b", ttl=5, limit=2)
            assert s2.fencing_token > s1.fencing_token
            with pytest.raises(E.LimitMismatch):
                await c.acquire("py/sem", "c", ttl=5, limit=3)
            waiter = asyncio.ensure_future(c.acquire("py/sem", "c", ttl=5, limit=2, wait=10))
            await asyncio.sleep(0.2)
            assert not waiter.done()
            await c.release(s1.lease_id, s1.token)
            s3 = await waiter
            assert s3.holder == "c" and s3.fencing_token > s2.fencing_token
            d = await c.acquire("py/delay", "a", ttl=5, lock_delay=5)
            await c.revoke(d.lease_id, "test")
            with pytest.raises(E.LockDelay) as ei:
                await c.acquire("py/delay", "b", ttl=5)
            assert ei.value.remaining_ms > 0
            with pytest.raises(E.LeaseRevoked):
                await c.renew(d.lease_id, d.token)
    run(main())


def test_groups(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            g = await c.acquire_group(["py/g/a", ("py/g/b", 3)], "w1", ttl=5)
            assert g.state == "active" and [l.key for l in g.leases] == ["py/g/a", "py/g/b"]
            assert g.leases[1].limit == 3
            with pytest.raises(E.LeaseHeld):
                await c.acquire_group(["py/g/a", "py/g/c"], "w2", ttl=5)
            assert (await c.list(prefix="py/g/c")) == []  # all or nothing
            await c.renew_group(g.group_id, g.token)
            await c.release_group(g.group_id, g.token)
            assert (await c.get_group(g.group_id)).state == "released"
    run(main())


def test_keep_alive_and_loss(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            sent = time.monotonic()
            l = await c.acquire("py/ka", "w1", ttl=1.0)
            ka = await c.keep_alive(l, sent)
            await asyncio.sleep(2.5)  # well past the TTL: renewals keep it
            assert not ka.lost.is_set() and ka.renewals >= 3
            assert (await c.get(l.lease_id)).state == "active"
            assert ka.deadline <= time.monotonic() + ka.ttl - ka.margin + 0.01
            # Revoked on the server: the next renewal says so, lost fires.
            await c.revoke(l.lease_id)
            err = await asyncio.wait_for(ka.wait_lost(), 5)
            assert isinstance(err, E.LeaseRevoked)
    run(main())


def test_session_heartbeat_stats(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            n = {"i": 0}

            def stats():
                n["i"] += 1
                return {"frames": n["i"] * 10}

            async with c.session("py-worker", ttl=1.0, stats=stats, metadata={"role": "w"}) as s:
                l = await c.acquire("py/sess", "py-worker", session=s)
                assert l.session_id == s.session_id
                await asyncio.sleep(2.0)
                got = await c.get_session(s.session_id)
                assert got.state == "active" and got.heartbeat_count >= 3
                # The last heartbeat's stats, as the session reads.
                assert int(got.metadata["frames"]) >= 30, got.metadata
                assert (await c.get(l.lease_id)).state == "active"
            assert (await c.get(l.lease_id)).state == "released"
            assert (await c.get_session(s.session_id)).state != "active"
    run(main())


def test_session_lost_before_server_expiry(single):
    """A session whose heartbeats stop: lost fires before the server ends
    it, so before anyone else could get its lease."""
    async def main():
        async with leasehold.Client(single.addrs) as c:
            s = await c.session("py-lost", ttl=1.0).open()
            l = await c.acquire("py/lost", "py-lost", session=s)

            async def refuse(attempt):
                raise E.TransportError("cut off")
            s.ka._renew = refuse  # the heartbeats stop reaching the server
            await asyncio.wait_for(s.wait_lost(), 5)
            lost_at = time.monotonic()
            assert isinstance(s.error, E.NotRenewed)
            # The server still holds the lease for the holder at that instant...
            assert (await c.get(l.lease_id)).state == "active"
            # ... and only later can someone else take it.
            l2 = await c.acquire("py/lost", "other", ttl=5, wait=5)
            assert time.monotonic() > lost_at and l2.fencing_token > l.fencing_token
    run(main())


def test_events_resume_and_grant_verify(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            l = await c.acquire("py/ev/1", "w1", ttl=5, grant=True)
            seen = []
            async for ev in c.events(prefix="py/ev/", from_start=True):
                seen.append(ev)
                if len(seen) == 1:
                    break
            assert seen[0].type == "acquired" and seen[0].lease.lease_id == l.lease_id
            await c.release(l.lease_id, l.token)
            # Resume after the first event: the next is the release.
            async for ev in c.events(prefix="py/ev/", last_event_id=seen[0].id):
                assert ev.type == "released" and ev.lease.lease_id == l.lease_id
                break
            v = leasehold.GrantVerifier(c)
            claims = await v.verify(l.grant)
            assert claims["key"] == "py/ev/1" and claims["fencing_token"] == l.fencing_token
            with pytest.raises(leasehold.GrantError):
                await v.verify(l.grant[:-4] + ("AAAA" if not l.grant.endswith("AAAA") else "BBBB"))
            fence = leasehold.FenceGuard(v)
            await fence.check_grant(l.grant)
            l2 = await c.acquire("py/ev/1", "w1", ttl=5, grant=True)
            await fence.check_grant(l2.grant)
            with pytest.raises(leasehold.StaleToken):
                await fence.check_grant(l.grant)
            await c.release(l2.lease_id, l2.token)
    run(main())


def test_recipes(single):
    async def main():
        async with leasehold.Client(single.addrs) as c:
            async with c.session("py-a", ttl=2) as sa, c.session("py-b", ttl=2) as sb:
                async with leasehold.Lock(sa, "py/lock") as lk:
                    assert lk.held and lk.fencing_token > 0
                    with pytest.raises(E.LeaseHeld):
                        await leasehold.Lock(sb, "py/lock", wait=0).acquire()
                    other = asyncio.ensure_future(leasehold.Lock(sb, "py/lock", wait=10).acquire())
                    await asyncio.sleep(0.2)
                    assert not other.done()
                    tok = lk.fencing_token
                lk2 = await other
                assert lk2.fencing_token > tok and lk.lost.is_set()
                # Revoked by an operator: the loss signal fires.
                await c.revoke(lk2.lease.lease_id, "ops")
                await asyncio.wait_for(lk2.lost.wait(), 5)
                assert "revoked" in str(lk2.error)

                s1 = await leasehold.Semaphore(sa, "py/slots", 2).acquire()
                s2 = await leasehold.Semaphore(sb, "py/slots", 2).acquire()
                with pytest.raises(E.LeaseHeld):
                    await leasehold.Semaphore(sb, "py/slots", 2, wait=0).acquire()
                await s1.release()
                await s2.release()

                ea, eb = leasehold.Election(sa, "py/elect"), leasehold.Election(sb, "py/elect")
                obs = eb.observe()
                assert await obs.__anext__() is None
                await ea.campaign("a-1")
                assert (await obs.__anext__()).value == "a-1"
                await ea.proclaim("a-2")
                ld = await obs.__anext__()
                assert ld.value == "a-2" and ld.holder == "py-a"
                camp = asyncio.ensure_future(eb.campaign("b-1"))
                await asyncio.sleep(0.2)
                assert not camp.done()
                await ea.resign()
                await camp
                assert eb.is_leader and not ea.is_leader
                while True:
                    ld = await obs.__anext__()
                    if ld is not None:
                        break
                assert ld.holder == "py-b" and ld.value == "b-1"
                await obs.aclose()
    run(main())


def test_sync_facade(single):
    with leasehold.sync.Client(single.addrs) as c:
        l = c.acquire("py/sync", "w1", ttl=5)
        assert c.get(l.lease_id).state == "active"
        with pytest.raises(E.LeaseHeld):
            c.acquire("py/sync", "w2", ttl=5)
        c.release(l.lease_id, l.token)


def test_keepalive_stream_duplex(single):
    """POST /v1/keepalive from Python: renewals and answers on one request,
    both directions at once (aiohttp writes the body from its own task)."""
    async def main():
        async with leasehold.Client(single.addrs) as c:
            a = await c.acquire("py/ks/a", "w1", ttl=5)
            b = await c.acquire("py/ks/b", "w1", ttl=5)
            rs = await c.keepalive_stream()
            # Each answer arrives while the request body is still open.
            for i in range(3):
                r = await rs.renew(a.lease_id, a.token)
                assert r["ok"] and r["fencing_token"] == a.fencing_token
            got = await asyncio.gather(*(rs.renew(x.lease_id, x.token) for x in (a, b, a, b)))
            assert [g["lease_id"] for g in got] == [a.lease_id, b.lease_id, a.lease_id, b.lease_id]
            r = await rs.renew(a.lease_id, a.token, metadata={"fps": "15"})
            assert (await c.get(a.lease_id)).metadata == {"fps": "15"}
            with pytest.raises(E.LeaseTokenInvalid):
                await rs.renew(a.lease_id, "wrong")
            # The stream goes on after a refused renewal.
            assert (await rs.renew(b.lease_id, b.token))["ok"]
            assert (await c.get(a.lease_id)).renewal_count == 6
            await rs.close()
    run(main())
