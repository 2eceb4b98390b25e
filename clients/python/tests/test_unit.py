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
