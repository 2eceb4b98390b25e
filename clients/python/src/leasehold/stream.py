"""Keep-alive streams (POST /v1/keepalive): many single-lease renewals on
one long-lived request, the request body a stream of JSON lines and the
answer a stream of JSON lines, both flowing at once. aiohttp writes a
request body from its own task while the answer is read, which is what
this needs (httpx sends the whole body first)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import TYPE_CHECKING, Any, AsyncIterator, Dict, Mapping, Optional

import aiohttp

from . import errors as E

if TYPE_CHECKING:
    from .client import Client

MAX_LINE = 4096
IDLE_PING = 10.0  # an empty line after this long idle (the server's body timeout is 30 s)


class RenewStream:
    """``rs = await client.keepalive_stream()``; ``await rs.renew(lease_id,
    token)`` returns the answer line (a dict with ``ok``, ``fencing_token``,
    ``remaining_ms``...) or raises the renewal's typed error. Renewals from
    many tasks share the stream. If the stream breaks, renewals in flight
    raise Indeterminate and the next renew opens a new stream (any
    address). ``await rs.close()`` ends it."""

    def __init__(self, client: "Client") -> None:
        self.client = client
        self._ids = itertools.count(1)
        self._pending: Dict[int, asyncio.Future] = {}
        self._queue: Optional[asyncio.Queue] = None
        self._reader: Optional[asyncio.Task] = None
        self._lock = asyncio.Lock()

    async def _open(self) -> None:
        c = self.client
        q: asyncio.Queue = asyncio.Queue()

        async def body() -> AsyncIterator[bytes]:
            while True:
                try:
                    line = await asyncio.wait_for(q.get(), IDLE_PING)
                except asyncio.TimeoutError:
                    line = b"\n"
                if line is None:
                    return
                yield line

        base = c.addrs[c._next % len(c.addrs)]
        hdrs = c._headers({"Content-Type": "application/x-ndjson", "Accept": "application/x-ndjson"})
        ready: asyncio.Future = asyncio.get_running_loop().create_future()

        async def read() -> None:
            try:
                async with c._http().post(base + "/v1/keepalive", data=body(), headers=hdrs,
                                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.timeout)) as r:
                    if r.status != 200:
                        raw = await r.read()
                        try:
                            payload: Any = json.loads(raw)
                        except ValueError:
                            payload = raw[:200].decode("utf-8", "replace")
                        raise E.from_answer(r.status, payload, base)
                    ready.set_result(None)
                    async for line in r.content:
                        if not line.strip():
                            continue
                        a = json.loads(line)
                        fut = self._pending.pop(int(a.get("id", 0)), None)
                        if fut is not None and not fut.done():
                            fut.set_result(a)
            except BaseException as e:
                if not ready.done():
                    ready.set_exception(e if isinstance(e, E.LeaseholdError) else E.TransportError(f"{base}: {e}"))
            finally:
                c._next += 0 if ready.done() and not ready.exception() else 1
                self._queue = None
                for fut in self._pending.values():
                    if not fut.done():
                        fut.set_exception(E.Indeterminate(504, {"code": "INDETERMINATE", "message":
                                          "the keep-alive stream broke before the renewal was answered"}, base))
                self._pending.clear()

        self._reader = asyncio.get_running_loop().create_task(read())
        self._queue = q
        try:
            await ready
        except BaseException:
            self._queue = None
            raise

    async def renew(self, lease_id: str, token: str, *, ttl: Optional[float] = None,
                    metadata: Optional[Mapping[str, str]] = None, timeout: Optional[float] = None) -> Dict[str, Any]:
        line: Dict[str, Any] = {"lease_id": lease_id, "token": token}
        if ttl is not None:
            line["ttl_ms"] = int(round(ttl * 1000))
        if metadata is not None:
            line["metadata"] = dict(metadata)
        async with self._lock:
            if self._queue is None:
                await self._open()
            q = self._queue
            assert q is not None
            i = next(self._ids)
            line["id"] = i
            data = (json.dumps(line, separators=(",", ":")) + "\n").encode()
            if len(data) > MAX_LINE:
                raise E.InvalidArgument(400, {"code": "INVALID_ARGUMENT", "field": "metadata",
                                              "message": f"a keep-alive line is at most {MAX_LINE} bytes: renew by POST instead"})
            fut: asyncio.Future = asyncio.get_running_loop().create_future()
            self._pending[i] = fut
            q.put_nowait(data)
        a = await asyncio.wait_for(fut, timeout or self.client.timeout)
        if not a.get("ok"):
            raise E.from_answer(int(a.get("status", 500)), {"error": a.get("error") or {}})
        return a

    async def close(self) -> None:
        if self._queue is not None:
            self._queue.put_nowait(None)
        if self._reader is not None:
            try:
                await asyncio.wait_for(self._reader, 5)
            except (asyncio.TimeoutError, Exception):
                self._reader.cancel()
