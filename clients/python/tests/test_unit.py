"""Unit tests: error mapping, the retry rules against a scripted HTTP
server on loopback, the keep-alive's deadline rule with a fake renewer."""

import asyncio
import json
import socket
import time

import pytest
from aiohttp import web

import leasehold
from leasehold import errors as E
from leasehold.keepalive import KeepAlive, Renewal


def run(coro, timeout=30):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_every_wire_code_has_its_class():
    import os
    import re
    src = open(os.path.join(os.path.dirname(__file__), "..", "..", "..", "wire", "errors.go")).read()
    codes = re.findall(r'Code\w+\s+Code = "([A-Z_]+)"', src)
    assert len(codes) >= 25
    for code in codes:
        cls = E.error_class(code)
        assert cls is not E.APIError and cls.code == code, code
    e = E.from_answer(409, {"error": {"code": "LEASE_HELD", "message": "held", "key": "k",
                                      "holders": [{"holder": "w", "lease_id": "ls_1", "remaining_ms": 5}]}})
    assert isinstance(e, E.LeaseHeld) and isinstance(e, E.ConflictError) and e.holders[0].lease_id == "ls_1"
    assert isinstance(E.from_answer(503, "oops"), E.Unavailable)
    assert isinstance(E.from_answer(418, None), E.Internal)


class Scripted:
    """An HTTP server on loopback answering each request with the next
    scripted action: a status and body, or "drop" (close the connection
    without answering, after reading the request)."""

    def __init__(self, script):
        self.script = list(script)
        self.requests = []

    async def handle(self, request):
        body = await request.read()
        self.requests.append((request.method, request.path, dict(request.headers), json.loads(body) if body else None))
        action = self.script.pop(0) if self.script else (200, {})
        if action == "drop":
            request.transport.close()
            await asyncio.sleep(0.5)
            return web.Response(status=200)
        status, payload = action
        return web.json_response(payload, status=status, headers={"X-Leasehold-Index": "7", "Retry-After": "1"} if status == 503 else {"X-Leasehold-Index": "7"})

    async def __aenter__(self):
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.addr = "127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc):
        await self.runner.cleanup()


def dead_addr():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now: connections are refused
    return "127.0.0.1:%d" % port


LEASE = {"lease_id": "ls_1", "key": "k", "holder": "w", "state": "active", "fencing_token": 3, "ttl_ms": 1000, "token": "t"}
NO_LEADER = (503, {"error": {"code": "NO_LEADER", "message": "no leader"}})
INDET = (504, {"error": {"code": "INDETERMINATE", "message": "cut short"}})


def test_refused_address_moves_on_and_503_is_retried():
    async def main():
        async with Scripted([NO_LEADER, (201, LEASE)]) as srv:
            async with leasehold.Client([dead_addr(), srv.addr], retry_for=5) as c:
                # A session create is not idempotent, but a refused
                # connection and a 503 prove it was not applied.
                s = await c.create_session("w", 1.0)
                assert len(srv.requests) == 2
    run(main())


def test_non_idempotent_write_is_not_resent_after_it_may_have_arrived():
    async def main():
        async with Scripted(["drop", (201, {"session_id": "ss_1"})]) as srv:
            async with leasehold.Client([srv.addr, srv.addr], retry_for=5) as c:
                with pytest.raises(E.Indeterminate):
                    await c.create_session("w", 1.0)
                assert len(srv.requests) == 1
        async with Scripted([INDET, (200, LEASE)]) as srv:
            async with leasehold.Client([srv.addr], retry_for=5) as c:
                with pytest.raises(E.Indeterminate):
                    await c.revoke("ls_1")
                assert len(srv.requests) == 1
        # A renewal with a new TTL is not resent either.
        async with Scripted(["drop", (200, LEASE)]) as srv:
            async with leasehold.Client([srv.addr], retry_for=5) as c:
                with pytest.raises(E.Indeterminate):
                    await c.renew("ls_1", "t", ttl=5)
                assert len(srv.requests) == 1
    run(main())


def test_acquire_is_retried_with_the_same_idempotency_key():
    async def main():
        async with Scripted(["drop", INDET, NO_LEADER, (200, LEASE)]) as srv:
            async with leasehold.Client([srv.addr], retry_for=10) as c:
                l = await c.acquire("k", "w", ttl=1)
                assert l.lease_id == "ls_1" and l.token == "t" and l.index == 7
                keys = {r[3]["idempotency_key"] for r in srv.requests}
                assert len(srv.requests) == 4 and len(keys) == 1 and len(keys.pop()) >= 20
    run(main())


def test_acquire_bodies_and_headers():
    class S:
        session_id, token = "ss_1", "stok"

    async def main():
        async with Scripted([(201, LEASE), (201, LEASE), (201, {"group_id": "lg_1"}), (201, {"group_id": "lg_1"})]) as srv:
            async with leasehold.Client([srv.addr]) as c:
                await c.acquire("k", "w", ttl=1.5, limit=2, metadata={"a": "b"}, wait=2, lock_delay=0.25, grant=True,
                                idempotency_key="i1")
                await c.acquire("k", "w", ttl=9, session=S(), idempotency_key="i2")
                await c.acquire_group(["a", ("b", 3)], "w", ttl=1.5, metadata={"a": "b"}, wait=2, lock_delay=0.25,
                                      idempotency_key="i3")
                await c.acquire_group(["a"], "w", session=S(), idempotency_key="i4")
        got = [(r[0], r[1], r[2].get("X-Session-Token"), list(r[3].items())) for r in srv.requests]
        assert got == [
            ("POST", "/v1/leases", None, [("key", "k"), ("holder", "w"), ("idempotency_key", "i1"), ("ttl_ms", 1500),
                                          ("limit", 2), ("metadata", {"a": "b"}), ("wait_ms", 2000),
                                          ("lock_delay_ms", 250), ("grant", True)]),
            ("POST", "/v1/leases", "stok", [("key", "k"), ("holder", "w"), ("idempotency_key", "i2"),
                                            ("session_id", "ss_1")]),
            ("POST", "/v1/groups", None, [("keys", [{"key": "a"}, {"key": "b", "limit": 3}]), ("holder", "w"),
                                          ("idempotency_key", "i3"), ("ttl_ms", 1500), ("metadata", {"a": "b"}),
                                          ("wait_ms", 2000), ("lock_delay_ms", 250)]),
            ("POST", "/v1/groups", "stok", [("keys", [{"key": "a"}]), ("holder", "w"), ("idempotency_key", "i4"),
                                            ("session_id", "ss_1")]),
        ], got
    run(main())


def test_reads_and_renewals_are_retried_and_give_up_in_time():
    async def main():
        async with Scripted(["drop", (200, LEASE), "drop", (200, LEASE)]) as srv:
            async with leasehold.Client([srv.addr], retry_for=5, token="sekrit") as c:
                assert (await c.get("ls_1")).lease_id == "ls_1"
                assert (await c.renew("ls_1", "t")).lease_id == "ls_1"
                assert srv.requests[0][2]["Authorization"] == "Bearer sekrit"
                assert srv.requests[2][2]["X-Lease-Token"] == "t" and len(srv.requests) == 4
                assert "sekrit" not in repr(c)
        async with leasehold.Client([dead_addr()], retry_for=0.5) as c:
            t0 = time.monotonic()
            with pytest.raises(E.TransportError) as ei:
                await c.get("ls_1")
            assert not ei.value.sent and time.monotonic() - t0 < 5
    run(main())


def test_bad_addresses_are_refused():
    with pytest.raises(ValueError):
        leasehold.Client("ftp://x:1")
    with pytest.raises(ValueError):
        leasehold.Client([])


def test_keep_alive_deadline_counts_from_the_send_time():
    """Renewals succeed, then stop: lost fires at the last successful
    renewal's send time + TTL - margin, not later."""
    async def main():
        sends = []
        fail = {"on": False}

        async def renew(attempt):
            sends.append(time.monotonic())
            await asyncio.sleep(0.05)  # the answer comes later than the send
            if fail["on"]:
                raise E.TransportError("down")
            return Renewal("active", 1000, 1000, 9)

        t0 = time.monotonic()
        ka = KeepAlive(renew, ttl=1.0, granted=1.0, sent=t0, margin=0.2)
        ka.start()
        await asyncio.sleep(1.5)
        assert not ka.lost.is_set() and ka.renewals >= 3 and ka.fencing_token == 9
        fail["on"] = True
        last_ok = max(s for s in sends if s < time.monotonic() - 0.06)
        err = await asyncio.wait_for(ka.wait_lost(), 3)
        lost_at = time.monotonic()
        assert isinstance(err, E.NotRenewed)
        # Never after send + TTL - margin of the last success (the server
        # could end the lease only after send + TTL).
        assert lost_at <= ka.deadline + 0.1 <= last_ok + 1.0 - 0.2 + 0.15
        await ka.stop()
    run(main())


def test_keep_alive_hanging_renewal_still_loses_on_time():
    async def main():
        async def hang(attempt):
            await asyncio.sleep(60)

        t0 = time.monotonic()
        ka = KeepAlive(hang, ttl=0.6, granted=0.6, sent=t0, margin=0.1)
        lost = []
        ka.on_lost(lambda e: lost.append(time.monotonic()))
        ka.start()
        await asyncio.wait_for(ka.wait_lost(), 5)
        assert lost and lost[0] - t0 <= 0.5 + 0.1
        await ka.stop()
    run(main())


def test_keep_alive_gone_lease_loses_at_once():
    async def main():
        async def gone(attempt):
            raise E.LeaseRevoked(409, {"code": "LEASE_REVOKED", "message": "revoked"})

        ka = KeepAlive(gone, ttl=3, granted=3, sent=time.monotonic(), interval=0.05)
        ka.start()
        err = await asyncio.wait_for(ka.wait_lost(), 2)
        assert isinstance(err, E.LeaseRevoked)
    run(main())


def test_keep_alive_option_checks():
    async def r(a):
        return Renewal("active", 1, 1)
    with pytest.raises(ValueError):
        KeepAlive(r, ttl=1, granted=1, sent=0, margin=1)
    with pytest.raises(ValueError):
        KeepAlive(r, ttl=1, granted=1, sent=0, interval=2)
    assert leasehold.default_margin(10) == 1.0 and leasehold.default_margin(0.5) == 0.1


class SSE:
    """A scripted /v1/events and /v1/leases: the first stream answers 410,
    the listing answers one lease at index 40, the next stream (which must
    resume after index 40) sends one event and breaks, the last (which
    must carry Last-Event-ID) sends the next one."""

    def __init__(self):
        self.streams = []

    async def events(self, request):
        self.streams.append((dict(request.query), request.headers.get("Last-Event-ID", "")))
        n = len(self.streams)
        if n == 1:
            return web.json_response({"error": {"code": "EVENTS_COMPACTED", "message": "gone"}}, status=410)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        ev = {"id": f"{40 + n}-0", "index": 40 + n, "type": "acquired", "key": "k", "lease": dict(LEASE, lease_id=f"ls_{n}")}
        await resp.write(f": ping\n\nid: {ev['id']}\nevent: acquired\ndata: {json.dumps(ev)}\n\n".encode())
        if n == 2:
            request.transport.close()  # the stream breaks
            return resp
        await asyncio.sleep(30)
        return resp

    async def leases(self, request):
        return web.json_response({"leases": [LEASE]}, headers={"X-Leasehold-Index": "40"})


def test_events_relist_on_410_and_resume_with_last_event_id():
    async def main():
        sse = SSE()
        app = web.Application()
        app.router.add_get("/v1/events", sse.events)
        app.router.add_get("/v1/leases", sse.leases)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        addr = "127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        try:
            async with leasehold.Client([addr]) as c:
                got = []
                async for ev in c.events(prefix="k", last_event_id="3-0"):
                    got.append(ev)
                    if len(got) == 3:
                        break
                assert got[0].type == "resync" and [l.lease_id for l in got[0].leases] == ["ls_1"] and got[0].index == 40
                assert [e.lease.lease_id for e in got[1:]] == ["ls_2", "ls_3"]
                assert sse.streams[0] == ({"prefix": "k"}, "3-0")
                assert sse.streams[1] == ({"prefix": "k", "after_index": "40"}, "")
                assert sse.streams[2] == ({"prefix": "k"}, "42-0")
                with pytest.raises(E.EventsCompacted):
                    sse.streams.clear()
                    async for ev in c.events(relist=False):
                        pass
        finally:
            await runner.cleanup()
    run(main())


def test_grant_verifier_refetches_on_an_unknown_kid():
    import jwt as pyjwt
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    def jwk(priv, kid):
        d = json.loads(pyjwt.algorithms.OKPAlgorithm.to_jwk(priv.public_key()))
        d.update(kid=kid, alg="EdDSA", use="sig")
        return d

    k1, k2, forged = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()

    def sign(priv, kid, **claims):
        now = int(time.time())
        c = {"iss": "cl-1", "iat": now, "exp": now + 60, "key": "k", "lease_id": "ls_1", "holder": "w", "fencing_token": 5}
        c.update(claims)
        return pyjwt.encode(c, priv, algorithm="EdDSA", headers={"kid": kid, "typ": "leasehold-grant+jwt"})

    async def main():
        sets = [{"cluster_id": "cl-1", "keys": [jwk(k1, "a")]},
                {"cluster_id": "cl-1", "keys": [jwk(k1, "a"), jwk(k2, "b")]}]
        fetches = []

        async def keys(request):
            fetches.append(1)
            return web.json_response(sets[min(len(fetches), 2) - 1])
        app = web.Application()
        app.router.add_get("/v1/keys", keys)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        addr = "127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        try:
            async with leasehold.Client([addr]) as c:
                v = leasehold.GrantVerifier(c, refetch_every=0.0)
                assert (await v.verify(sign(k1, "a")))["fencing_token"] == 5
                assert len(fetches) == 1
                # A key recorded since (a rotation): refetched once, verifies.
                assert (await v.verify(sign(k2, "b", fencing_token=6)))["fencing_token"] == 6
                assert len(fetches) == 2
                with pytest.raises(leasehold.GrantError):
                    await v.verify(sign(forged, "a"))          # a known kid, a wrong signature
                with pytest.raises(leasehold.GrantError):
                    await v.verify(sign(k1, "a", iss="other"))  # another cluster
                with pytest.raises(leasehold.GrantError):
                    await v.verify(sign(k1, "a", exp=int(time.time()) - 60))  # past exp and the leeway
                slow = leasehold.GrantVerifier(c, refetch_every=3600)
                await slow.verify(sign(k1, "a"))
                n = len(fetches)
                for _ in range(3):  # a forger's unknown kids: at most one refetch per interval
                    with pytest.raises(leasehold.GrantError):
                        await slow.verify(sign(forged, "zzz"))
                assert len(fetches) == n
        finally:
            await runner.cleanup()
    run(main())


def test_events_silent_stream_is_reopened():
    """A stream that goes silent (no event, no keep-alive comment) for
    idle_timeout is taken as broken: reopened with Last-Event-ID."""
    async def main():
        seen = []

        async def events(request):
            seen.append(request.headers.get("Last-Event-ID", ""))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            n = len(seen)
            ev = {"id": f"{n}-0", "index": n, "type": "released", "key": "k", "lease": LEASE}
            await resp.write(f"id: {ev['id']}\nevent: released\ndata: {json.dumps(ev)}\n\n".encode())
            await asyncio.sleep(10)  # silent: a server gone quiet (partitioned)
            return resp
        app = web.Application()
        app.router.add_get("/v1/events", events)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, shutdown_timeout=0.1)
        await site.start()
        addr = "127.0.0.1:%d" % site._server.sockets[0].getsockname()[1]
        try:
            async with leasehold.Client([addr]) as c:
                ids = []
                async for ev in c.events(idle_timeout=0.3):
                    ids.append(ev.id)
                    if len(ids) == 2:
                        break
                assert ids == ["1-0", "2-0"] and seen == ["", "1-0"]
        finally:
            await runner.cleanup()
    run(main())
