"""The fleet's sink: where workers write what they made of a camera's
frames. It fences on the fencing token: per camera it keeps the highest
token seen and refuses a write with a lower one (409), so a worker that
lost its camera (paused, partitioned, or dead with a write in flight)
cannot overwrite its successor's output. With --verify the write must carry
the lease's grant, verified against the cluster's key set, so that only
tokens the cluster issued count.

    python sink.py --port 0 --addrs 127.0.0.1:7700 --verify

prints "listening on HOST:PORT" once it serves. GET /state shows, per
camera, the highest token, its writer and the counts."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from typing import Any, Dict

from aiohttp import web

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "clients", "python", "src"))
import leasehold  # noqa: E402


class Sink:
    def __init__(self, verifier: "leasehold.GrantVerifier | None") -> None:
        self.fence = leasehold.FenceGuard(verifier)
        self.state: Dict[str, Dict[str, Any]] = {}

    async def write(self, request: web.Request) -> web.Response:
        try:
            w = await request.json()
        except (ConnectionError, ValueError):  # a writer killed mid-request, or not JSON
            return web.json_response({"ok": False, "error": "bad write"}, status=400)
        cam, token, worker = str(w["camera"]), int(w["token"]), str(w["worker"])
        st = self.state.setdefault(cam, {"token": 0, "worker": "", "accepted": 0, "refused": 0, "tokens": []})
        try:
            if self.fence.verifier is not None:
                claims = await self.fence.verifier.verify(str(w.get("grant", "")))
                if claims["key"] != "camera/" + cam or int(claims["fencing_token"]) != token or claims["holder"] != worker:
                    raise leasehold.GrantError("the grant is not this write's lease")
            self.fence.check(cam, token)
        except (leasehold.StaleToken, leasehold.GrantError) as e:
            st["refused"] += 1
            return web.json_response({"ok": False, "error": str(e)}, status=409)
        if token != st["token"]:
            st["tokens"].append(token)
        st.update(token=token, worker=worker, last=w)
        st["accepted"] += 1
        return web.json_response({"ok": True})

    async def get_state(self, request: web.Request) -> web.Response:
        return web.json_response(self.state)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--addrs", default="127.0.0.1:7700")
    ap.add_argument("--verify", action="store_true", help="require and verify each write's grant")
    a = ap.parse_args()
    client = leasehold.Client(a.addrs)
    sink = Sink(leasehold.GrantVerifier(client, leeway=None) if a.verify else None)
    app = web.Application()
    app.router.add_post("/write", sink.write)
    app.router.add_get("/state", sink.get_state)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", a.port)
    await site.start()
    host, port = site._server.sockets[0].getsockname()[:2]  # type: ignore[union-attr]
    print(f"listening on {host}:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await client.close()
        await runner.cleanup()


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
