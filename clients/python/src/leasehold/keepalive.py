"""Keep-alives: a renewal loop whose deadline counts from each renewal's
send time, and a loss signal that fires before the server could grant the
lease (or end the session) for someone else."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import time
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, Mapping, Optional, Union

from . import errors as E
from .types import Lease, Session

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("leasehold")

MIN_MARGIN = 0.1

# A renewer sends one renewal, bounded by the attempt timeout, and returns
# (state, granted seconds from the send time, fencing token or 0).
Renewer = Callable[[float], Awaitable["Renewal"]]
Stats = Union[Mapping[str, str], Callable[[], Any], None]


class Renewal:
    def __init__(self, state: str, ttl_ms: int, remaining_ms: int, fencing_token: int = 0) -> None:
        self.state, self.ttl_ms, self.remaining_ms, self.fencing_token = state, ttl_ms, remaining_ms, fencing_token


def default_margin(ttl: float) -> float:
    """TTL/10, at least 100 ms, at most TTL/2 (as the Go client)."""
    return min(max(ttl / 10, MIN_MARGIN), ttl / 2)


_GONE = (E.LeaseExpired, E.LeaseReleased, E.LeaseRevoked, E.LeaseTokenInvalid, E.LeaseNotFound,
         E.SessionNotFound, E.SessionEnded)


class KeepAlive:
    """Renews something (a lease, a group, a session) until stopped or lost.

    The holder's deadline is the send time of the last successful renewal
    plus what the server granted (the TTL, or less if the answer said less),
    minus ``margin``: the server counts the TTL from when it applied the
    renewal, which is after it was sent, so at the deadline the server has
    not yet ended the lease. ``lost`` (an asyncio.Event) is set at the
    deadline if no renewal succeeded by then, or as soon as the server says
    the lease is gone; ``error`` says why. Renewals go every ``interval``
    (default: a third of TTL - margin, or the server's
    heartbeat_interval_ms if shorter); a failed one is retried with a
    jittered backoff until the deadline."""

    def __init__(self, renew: Renewer, *, ttl: float, granted: float, sent: float, margin: Optional[float] = None,
                 interval: Optional[float] = None, hb_interval: float = 0.0, lease_id: str = "",
                 on_renew_error: Optional[Callable[[BaseException], None]] = None) -> None:
        if ttl <= 0:
            raise ValueError("keep-alive needs a positive TTL")
        self._renew = renew
        self.ttl = ttl
        self.margin = default_margin(ttl) if margin is None else max(margin, 0.0)
        if self.margin >= ttl:
            raise ValueError(f"keep-alive margin {self.margin} not below the TTL {ttl}")
        self.interval = interval if interval else (ttl - self.margin) / 3
        if not interval and 0 < hb_interval < self.interval:
            self.interval = hb_interval
        if not 0 < self.interval < ttl - self.margin:
            raise ValueError("keep-alive interval must be positive and below TTL - margin")
        self.lease_id = lease_id
        self.fencing_token = 0
        self._expiry = sent + min(granted, ttl) if granted > 0 else sent + ttl
        self._last_sent = sent
        self.lost = asyncio.Event()
        self.error: Optional[BaseException] = None
        self.renewals = 0
        self._on_err = on_renew_error
        self._task: Optional[asyncio.Task[None]] = None
        self._callbacks: List[Callable[[BaseException], Any]] = []

    @property
    def deadline(self) -> float:
        """time.monotonic() at which ``lost`` fires without a renewal."""
        return self._expiry - self.margin

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    def on_lost(self, fn: Callable[[BaseException], Any]) -> None:
        """Call fn(error) once when lost (at once if already lost)."""
        if self.lost.is_set():
            assert self.error is not None
            fn(self.error)
        else:
            self._callbacks.append(fn)

    async def wait_lost(self) -> BaseException:
        """Wait until lost; returns why."""
        await self.lost.wait()
        assert self.error is not None
        return self.error

    def __await__(self) -> Any:
        return self.wait_lost().__await__()

    def _lose(self, err: BaseException) -> None:
        if self.lost.is_set():
            return
        self.error = err
        self.lost.set()
        for fn in self._callbacks:
            try:
                r = fn(err)
                if inspect.isawaitable(r):
                    asyncio.ensure_future(r)
            except Exception:  # a callback's failure is its own
                log.exception("leasehold: on_lost callback failed")
        self._callbacks.clear()

    async def stop(self) -> None:
        """Stop renewing (the lease then expires by itself) and set lost."""
        self._lose(E.LeaseLost("keep-alive stopped"))
        if self._task is not None and self._task is not asyncio.current_task():
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass

    async def _run(self) -> None:
        watchdog = asyncio.get_running_loop().create_task(self._watch())
        backoff = 0.05
        cap = min(max(self.interval / 4, 0.05), 1.0)
        last_err: Optional[BaseException] = None
        wait = min(self._last_sent + self.interval, self._last_sent + (self.deadline - self._last_sent) / 2) - time.monotonic()
        try:
            while not self.lost.is_set():
                if wait > 0:
                    await asyncio.sleep(wait)
                now = time.monotonic()
                if now >= self.deadline:
                    break
                sent = now
                try:
                    attempt = max(0.01, min(self.interval, self.deadline - now))
                    r = await asyncio.wait_for(self._renew(attempt), timeout=max(0.01, self.deadline - now))
                except _GONE as e:
                    self._lose(e)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as e:
                    last_err = e
                    if self._on_err is not None:
                        self._on_err(e)
                    wait = backoff * (0.5 + random.random() / 2)
                    backoff = min(backoff * 2, cap)
                    continue
                if r.state and r.state != "active":
                    self._lose(E.LeaseLost(f"{self.lease_id} is {r.state}"))
                    return
                if time.monotonic() >= self.deadline:
                    break
                g = self.ttl
                if r.ttl_ms > 0:
                    g = min(g, r.ttl_ms / 1000.0)
                if r.remaining_ms > 0:
                    g = min(g, r.remaining_ms / 1000.0)
                if sent + g > self._expiry:
                    self._expiry = sent + g
                self._last_sent = sent
                if r.fencing_token:
                    self.fencing_token = r.fencing_token
                self.renewals += 1
                last_err, backoff = None, 0.05
                wait = min(sent + self.interval, time.monotonic() + (self.deadline - time.monotonic()) / 2) - time.monotonic()
            msg = "not renewed before the holder's deadline"
            self._lose(E.NotRenewed(f"{msg} (last renewal: {last_err})" if last_err else msg))
        finally:
            watchdog.cancel()

    async def _watch(self) -> None:
        # Fires lost at the deadline even while a renewal hangs.
        while not self.lost.is_set():
            left = self.deadline - time.monotonic()
            if left <= 0:
                self._lose(E.NotRenewed("not renewed before the holder's deadline"))
                if self._task is not None:
                    self._task.cancel()
                return
            await asyncio.sleep(left)


def lease_renewer(c: "Client", lease: Lease) -> Renewer:
    async def renew(attempt: float) -> Renewal:
        l = await c.renew(lease.lease_id, lease.token, timeout=attempt)
        return Renewal(l.state, l.ttl_ms, l.remaining_ms, l.fencing_token)
    return renew


async def _stats_of(stats: Stats) -> Optional[Dict[str, str]]:
    if stats is None:
        return None
    v = stats() if callable(stats) else stats
    if inspect.isawaitable(v):
        v = await v
    if v is None:
        return None
    return {str(k): str(x) for k, x in dict(v).items()}


class LiveSession:
    """A session kept alive by a heartbeat task.

    ``async with client.session("worker-3", ttl=10, stats=fn) as s:``
    creates the session and starts heartbeats; each heartbeat carries
    ``stats`` (a mapping, or a function, sync or async, returning one) as
    the session's metadata, which GET /v1/sessions/:id shows. ``s.lost``
    is set before the server could end the session and so hand its leases
    to someone else (see KeepAlive). Leaving the block ends the session
    (its leases are released)."""

    def __init__(self, client: "Client", holder: str, ttl: float = 10.0, *, metadata: Optional[Mapping[str, str]] = None,
                 stats: Stats = None, margin: Optional[float] = None, interval: Optional[float] = None) -> None:
        self.client, self.holder, self.ttl = client, holder, ttl
        self.metadata, self.stats = metadata, stats
        self._margin, self._interval = margin, interval
        self.info: Optional[Session] = None
        self.ka: Optional[KeepAlive] = None

    async def open(self) -> "LiveSession":
        sent = time.monotonic()
        md = dict(self.metadata or {})
        first = await _stats_of(self.stats)
        if first:
            md.update(first)
        s = await self.client.create_session(self.holder, self.ttl, md or None)
        self.info = s

        async def beat(attempt: float) -> Renewal:
            r = await self.client.session_heartbeat(s.session_id, s.token, await _stats_of(self.stats), timeout=attempt)
            return Renewal("active" if r.state == "active" else r.state, r.ttl_ms, r.remaining_ms)

        self.ka = KeepAlive(beat, ttl=s.ttl_ms / 1000.0, granted=s.ttl_ms / 1000.0, sent=sent, margin=self._margin,
                            interval=self._interval, hb_interval=s.heartbeat_interval_ms / 1000.0, lease_id=s.session_id)
        self.ka.start()
        return self

    async def __aenter__(self) -> "LiveSession":
        return await self.open()

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    @property
    def session_id(self) -> str:
        assert self.info is not None, "session not open"
        return self.info.session_id

    @property
    def token(self) -> str:
        assert self.info is not None, "session not open"
        return self.info.token

    @property
    def lost(self) -> asyncio.Event:
        assert self.ka is not None, "session not open"
        return self.ka.lost

    @property
    def error(self) -> Optional[BaseException]:
        return self.ka.error if self.ka else None

    @property
    def deadline(self) -> float:
        assert self.ka is not None
        return self.ka.deadline

    def alive(self) -> bool:
        return self.ka is not None and not self.ka.lost.is_set()

    async def wait_lost(self) -> BaseException:
        assert self.ka is not None
        return await self.ka.wait_lost()

    async def close(self) -> None:
        """Stop the heartbeat and end the session (releasing its leases)."""
        if self.ka is None or self.info is None:
            return
        await self.ka.stop()
        try:
            await self.client.end_session(self.info.session_id, self.info.token)
        except (E.SessionNotFound, E.SessionEnded):
            pass

    async def orphan(self) -> None:
        """Stop the heartbeat without ending the session: it expires."""
        if self.ka is not None:
            await self.ka.stop()
