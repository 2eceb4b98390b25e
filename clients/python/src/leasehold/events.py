"""The event stream (GET /v1/events, Server-Sent Events) as an async
iterator that resumes with Last-Event-ID and re-lists on 410."""

from __future__ import annotations

import asyncio
import json
import random
from typing import TYPE_CHECKING, AsyncIterator, Dict, List, Optional

import aiohttp

from . import errors as E
from .types import Event, Lease

if TYPE_CHECKING:
    from .client import Client


async def follow(c: "Client", *, key: str = "", prefix: str = "", holder: str = "", from_start: bool = False,
                 after_index: int = 0, last_event_id: str = "", relist: bool = True,
                 idle_timeout: float = 45.0) -> AsyncIterator[Event]:
    last_id = last_event_id
    after = after_index
    start = from_start
    backoff = 0.05
    while True:
        q: Dict[str, str] = {}
        for k, v in (("key", key), ("prefix", prefix), ("holder", holder)):
            if v:
                q[k] = v
        hdrs = c._headers({"Accept": "text/event-stream"})
        if last_id:
            hdrs["Last-Event-ID"] = last_id
        elif after:
            q["after_index"] = str(after)
        elif start:
            q["from"] = "start"
        base = c.addrs[c._next % len(c.addrs)]
        try:
            async with c._http().get(base + "/v1/events", params=q, headers=hdrs,
                                     timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.timeout,
                                                                   sock_read=idle_timeout)) as resp:
                if resp.status // 100 != 2:
                    raw = await resp.read()
                    try:
                        payload = json.loads(raw)
                    except ValueError:
                        payload = raw[:200].decode("utf-8", "replace")
                    err = E.from_answer(resp.status, payload, base)
                    if isinstance(err, E.EventsCompacted) and relist:
                        leases, index = await _relist(c, key, prefix, holder)
                        yield Event(id="", type="resync", index=index, leases=leases)
                        last_id, after, start = "", index, False
                        continue
                    if not isinstance(err, E.Retryable):
                        raise err
                    c._next += 1
                    await asyncio.sleep(backoff * (0.5 + random.random() / 2))
                    backoff = min(backoff * 2, 1.0)
                    continue
                backoff = 0.05
                ev_id, ev_type, data = "", "", []  # type: str, str, List[str]
                async for raw_line in resp.content:
                    line = raw_line.decode("utf-8").rstrip("\r\n")
                    if line == "":
                        if data and ev_type != "stream_error":
                            d = json.loads("\n".join(data))
                            ev = Event.from_dict(d)
                            if not ev.type:
                                ev.type = ev_type
                            if ev_id:
                                last_id = ev_id
                            yield ev
                        elif ev_type == "stream_error":
                            break
                        ev_id, ev_type, data = "", "", []
                        continue
                    if line.startswith(":"):
                        continue
                    name, _, value = line.partition(":")
                    if value.startswith(" "):
                        value = value[1:]
                    if name == "id":
                        ev_id = value
                    elif name == "event":
                        ev_type = value
                    elif name == "data":
                        data.append(value)
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError):
            pass
        # The stream broke: open it again elsewhere, from the last event.
        c._next += 1
        await asyncio.sleep(backoff * (0.5 + random.random() / 2))
        backoff = min(backoff * 2, 1.0)


async def _relist(c: "Client", key: str, prefix: str, holder: str) -> "tuple[List[Lease], int]":
    out: List[Lease] = []
    after = ""
    index: Optional[int] = None
    while True:
        page, after, idx = await c.list_page(key=key, prefix=prefix, holder=holder, state="active", limit=1000, after=after)
        out.extend(page)
        index = idx if index is None else min(index, idx)
        if not after:
            return out, index or 0
