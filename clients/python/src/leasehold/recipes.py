"""Recipes on a kept-alive session, as kazoo and etcd's clientv3 have them:
Lock (an async context manager), Semaphore, Election. Each hold has a
fencing token and a loss signal (``lost``, an asyncio.Event) set when the
session is lost (before the server could end it) or the lease ends on the
server against the holder's will (revoked by an operator, say)."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, AsyncIterator, Dict, Optional, Tuple

from . import errors as E
from .keepalive import LiveSession
from .types import Lease

VALUE_KEY = "value"


class _EndWatcher:
    """One event stream per session (filter: its holder) that reports the
    end of each of the session's leases to its hold, so that a session
    with many locks keeps one stream open, not one per lock. It starts at
    the first hold's acquire, so that no later end is missed; an end seen
    before its hold registers (the event can come before the acquire's
    answer) is remembered (the last MAX_ENDED)."""

    MAX_ENDED = 256

    def __init__(self, session: LiveSession, after_index: int) -> None:
        self.session = session
        self.holds: Dict[str, "_Hold"] = {}
        self.ended: "OrderedDict[str, Tuple[str, str]]" = OrderedDict()
        self.task = asyncio.get_running_loop().create_task(self._run(after_index))
        session.ka.on_lost(lambda err: self.task.cancel())  # type: ignore[union-attr]

    def register(self, h: "_Hold") -> None:
        end = self.ended.pop(h.lease.lease_id, None)
        if end is not None:
            h.ended(*end)
        else:
            self.holds[h.lease.lease_id] = h

    def unregister(self, h: "_Hold") -> None:
        self.holds.pop(h.lease.lease_id, None)

    async def _run(self, after_index: int) -> None:
        c, sid = self.session.client, self.session.session_id
        try:
            async for ev in c.events(holder=self.session.holder, after_index=after_index):
                if ev.type == "resync":
                    live = {l.lease_id for l in ev.leases}
                    for lid in [lid for lid in self.holds if lid not in live]:
                        self.holds.pop(lid).ended("ended", "")
                    continue
                if ev.type not in ("released", "expired", "revoked") or ev.lease is None:
                    continue
                h = self.holds.pop(ev.lease.lease_id, None)
                if h is not None:
                    h.ended(ev.type, ev.reason)
                elif ev.lease.session_id == sid:
                    self.ended[ev.lease.lease_id] = (ev.type, ev.reason)
                    while len(self.ended) > self.MAX_ENDED:
                        self.ended.popitem(last=False)
        except asyncio.CancelledError:
            pass
        except E.LeaseholdError as e:  # the stream failed for good (a 4xx)
            for h in list(self.holds.values()):
                h._lose(E.LeaseLost(f"cannot watch the lease: {e}"))
            self.holds.clear()


def _watcher(session: LiveSession, lease: Lease) -> _EndWatcher:
    w: Optional[_EndWatcher] = getattr(session, "_end_watcher", None)
    if w is None or w.task.done():
        w = _EndWatcher(session, max(lease.index - 1, 0))
        setattr(session, "_end_watcher", w)
    return w


class _Hold:
    """One acquisition: its lease and its loss signal."""

    def __init__(self, session: LiveSession, lease: Lease) -> None:
        self.session, self.lease = session, lease
        self.lost = asyncio.Event()
        self.error: Optional[BaseException] = None
        self.releasing = False
        self._watcher = _watcher(session, lease)
        self._watcher.register(self)
        session.ka.on_lost(lambda err: self._lose(E.LeaseLost(f"session lost: {err}")))  # type: ignore[union-attr]

    def _lose(self, err: BaseException) -> None:
        if not self.lost.is_set():
            self.error = err
            self.lost.set()
        self._watcher.unregister(self)

    def ended(self, typ: str, reason: str) -> None:
        """The lease ended on the server: the holder's own release while it
        is under way, or a loss."""
        if typ == "released" and self.releasing and reason != "session_ended":
            self._lose(E.LeaseLost("released by its holder"))
        else:
            self._lose(E.LeaseLost(f"lease {self.lease.lease_id} {typ}" + (f" ({reason})" if reason else "")))

    async def release(self) -> None:
        self.releasing = True
        try:
            await self.session.client.release(self.lease.lease_id, session_token=self.session.token)
        except (E.LeaseExpired, E.LeaseRevoked, E.LeaseNotFound, E.SessionEnded):
            pass
        finally:
            self._lose(E.LeaseLost("released by its holder"))


class _Locker:
    def __init__(self, session: LiveSession, key: str, limit: int = 0, *, wait: Optional[float] = None,
                 lock_delay: Optional[float] = None, grant: bool = False) -> None:
        self.session, self.key, self.limit = session, key, limit
        self.wait, self.lock_delay, self.grant = wait, lock_delay, grant
        self._hold: Optional[_Hold] = None

    async def _acquire(self, metadata: Optional[Dict[str, str]] = None, wait: Optional[float] = -1.0) -> Lease:
        if not self.session.alive():
            raise E.LeaseLost(f"session lost: {self.session.error}")
        w = self.wait if wait == -1.0 else wait
        c = self.session.client
        while True:
            # wait None: as long as it takes, in slices (each a queued
            # acquire; an idempotency key per slice).
            chunk = 30.0 if w is None else w
            try:
                lease = await c.acquire(self.key, self.session.holder, session=self.session, limit=self.limit,
                                        metadata=metadata, wait=chunk or None, lock_delay=self.lock_delay,
                                        grant=self.grant)
            except (E.LeaseHeld, E.LockDelay):
                if w is not None or not self.session.alive():
                    raise
                continue
            if lease.state != "active":
                raise E.LeaseLost(f"lease {lease.lease_id} is {lease.state}")
            self._hold = _Hold(self.session, lease)
            return lease

    @property
    def lease(self) -> Optional[Lease]:
        return self._hold.lease if self._hold else None

    @property
    def fencing_token(self) -> int:
        """The hold's fencing token; 0 when not held."""
        return self._hold.lease.fencing_token if self._hold and not self._hold.lost.is_set() else 0

    @property
    def lost(self) -> asyncio.Event:
        """Set when the hold ends (lost, or released by its holder)."""
        if self._hold is None:
            ev = asyncio.Event()
            ev.set()
            return ev
        return self._hold.lost

    @property
    def error(self) -> Optional[BaseException]:
        return self._hold.error if self._hold else None

    @property
    def held(self) -> bool:
        return self._hold is not None and not self._hold.lost.is_set()

    async def _release(self) -> None:
        if self._hold is not None:
            await self._hold.release()


class Lock(_Locker):
    """A mutex on key, bound to ``session``: ``async with Lock(s, "k") as
    lk:`` waits for it (``wait`` seconds, None: as long as it takes; 0: not
    at all, LeaseHeld), then ``lk.fencing_token`` and ``lk.lost``; leaving
    the block releases it."""

    def __init__(self, session: LiveSession, key: str, **kw: Any) -> None:
        super().__init__(session, key, 0, **kw)

    async def acquire(self) -> "Lock":
        await self._acquire()
        return self

    async def release(self) -> None:
        await self._release()

    async def __aenter__(self) -> "Lock":
        return await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()


class Semaphore(_Locker):
    """One of ``limit`` slots of key (every user of the key must agree on
    the limit); otherwise as Lock."""

    def __init__(self, session: LiveSession, key: str, limit: int, **kw: Any) -> None:
        if limit < 1:
            raise ValueError("a semaphore needs a limit of at least 1")
        super().__init__(session, key, limit, **kw)

    async def acquire(self) -> "Semaphore":
        await self._acquire()
        return self

    async def release(self) -> None:
        await self._release()

    async def __aenter__(self) -> "Semaphore":
        return await self.acquire()

    async def __aexit__(self, *exc: Any) -> None:
        await self.release()


@dataclass
class Leader:
    holder: str
    value: str
    lease_id: str
    fencing_token: int


class Election(_Locker):
    """An election on key: the leader holds the key's lease (limit 1) on its
    session and announces ``value`` in the lease's metadata."""

    def __init__(self, session: LiveSession, key: str, **kw: Any) -> None:
        super().__init__(session, key, 0, **kw)

    async def campaign(self, value: str, wait: Optional[float] = None) -> None:
        """Wait (``wait`` seconds, None: as long as it takes) to lead."""
        await self._acquire({VALUE_KEY: value}, wait)

    async def proclaim(self, value: str) -> None:
        """Change the announced value without giving leadership up (one
        renewal of the lease that replaces its metadata)."""
        if self._hold is None or self._hold.lost.is_set():
            raise E.LeaseLost(f"not the leader of {self.key}")
        h = self._hold
        nl = await self.session.client.renew(h.lease.lease_id, h.lease.token, metadata={VALUE_KEY: value})
        h.lease.metadata = nl.metadata

    async def resign(self) -> None:
        await self._release()

    @property
    def is_leader(self) -> bool:
        return self.held

    async def leader(self) -> Optional[Leader]:
        """The current leader (linearizable read), None when nobody leads."""
        return await leader_of(self.session.client, self.key)

    def observe(self) -> AsyncIterator[Optional[Leader]]:
        return observe(self.session.client, self.key)


async def leader_of(client: Any, key: str) -> Optional[Leader]:
    page, _, _ = await client.list_page(key=key, state="active", limit=10)
    for l in page:
        if l.key == key and l.state == "active":
            return Leader(l.holder, l.metadata.get(VALUE_KEY, ""), l.lease_id, l.fencing_token)
    return None


async def observe(client: Any, key: str) -> AsyncIterator[Optional[Leader]]:
    """Yield the leader of the election on key (None: nobody) now and each
    time it changes or proclaims a new value. It reads the leader again
    after every event of the key, so it never reports an outdated one."""
    page, _, index = await client.list_page(key=key, state="active", limit=10)
    cur = next((Leader(l.holder, l.metadata.get(VALUE_KEY, ""), l.lease_id, l.fencing_token)
                for l in page if l.key == key and l.state == "active"), None)
    yield cur
    # From the listing's index: a change between the read and the stream's
    # opening is replayed rather than missed.
    async for _ in client.events(key=key, after_index=max(index - 1, 0)):
        nxt = await leader_of(client, key)
        if nxt != cur:
            cur = nxt
            yield cur
