"""The asyncio client: one aiohttp session, several addresses, failover
that retries only what is safe."""

from __future__ import annotations

import asyncio
import enum
import json
import random
import secrets
import ssl as _ssl
import time
from typing import Any, AsyncIterator, Dict, List, Mapping, Optional, Protocol, Sequence, Tuple, Union
from urllib.parse import quote, urlsplit

import aiohttp

from . import errors as E
from .types import Event, Group, Lease, Session, Validation

DEFAULT_TIMEOUT = 30.0


class SessionLike(Protocol):
    """A Session answer or a LiveSession: what binds an acquire to a session."""

    @property
    def session_id(self) -> str: ...

    @property
    def token(self) -> str: ...


class Retry(enum.Enum):
    """When a request may be sent again (to the same or the next address).

    UNSENT: only when it provably never reached a server (the connection
    could not be made), or after a 503 (the server says nothing was applied).
    SAFE: also after any transport failure or timeout (reads, renewals and
    heartbeats, acquires carrying an idempotency key)."""

    UNSENT = 0
    SAFE = 1


def _base_url(addr: str, tls: bool) -> str:
    a = addr.strip()
    if "://" not in a:
        a = ("https://" if tls else "http://") + a
    u = urlsplit(a)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"bad address {addr!r}: want host:port or http(s)://host:port")
    return f"{u.scheme}://{u.netloc}{u.path}".rstrip("/")


def _esc(s: str) -> str:
    return quote(s, safe="")


def _ms(seconds: Optional[float]) -> Optional[int]:
    return None if seconds is None else int(round(seconds * 1000))


class Answer:
    """A 2xx answer: its decoded body and the Raft index it reflects."""

    def __init__(self, status: int, body: Any, index: int, addr: str) -> None:
        self.status, self.body, self.index, self.addr = status, body, index, addr


class Client:
    """An asyncio Leasehold client.

    ``addrs``: "host:port" or "http(s)://host:port", one or several
    (comma-separated string or a list); any server answers (followers
    forward to the leader). ``token``: the bearer token. TLS: an
    ``ssl.SSLContext`` as ``ssl``, or ``ca_file`` (and ``cert_file``,
    ``key_file`` for a client certificate); either makes "host:port" https.
    ``timeout`` bounds one attempt (an acquire's wait is added).
    ``retry_for`` is how long a call keeps trying the addresses after
    failures it may retry (503, refused connections; transport failures of
    safe calls) before it raises the last error.

    Use as ``async with Client(...) as c:`` or call ``await c.close()``."""

    def __init__(self, addrs: Union[str, Sequence[str]] = "127.0.0.1:7700", *, token: str = "",
                 ssl: Optional[_ssl.SSLContext] = None, ca_file: str = "", cert_file: str = "",
                 key_file: str = "", timeout: float = DEFAULT_TIMEOUT, retry_for: float = 10.0,
                 stale_reads: bool = False) -> None:
        if isinstance(addrs, str):
            addrs = [a for a in addrs.split(",") if a.strip()]
        if not addrs:
            raise ValueError("no address")
        if ssl is None and (ca_file or cert_file):
            ssl = _ssl.create_default_context(cafile=ca_file or None)
            if cert_file:
                ssl.load_cert_chain(cert_file, key_file or None)
        self._ssl = ssl
        self.addrs: List[str] = [_base_url(a, ssl is not None) for a in addrs]
        self._token = token
        self.timeout = timeout
        self.retry_for = retry_for
        self.stale_reads = stale_reads
        self._next = 0
        self._session: Optional[aiohttp.ClientSession] = None

    def __repr__(self) -> str:  # never the token
        return f"Client(addrs={self.addrs!r}, token={'***' if self._token else ''!r})"

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            conn = aiohttp.TCPConnector(ssl=self._ssl if self._ssl is not None else False, limit=0)
            self._session = aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=None))
        return self._session

    def _headers(self, extra: Optional[Mapping[str, str]]) -> Dict[str, str]:
        h = {"Accept": "application/json"}
        if self._token:
            h["Authorization"] = "Bearer " + self._token
        if extra:
            h.update({k: v for k, v in extra.items() if v})
        return h

    # ---- the request loop ----

    async def request(self, method: str, path: str, *, body: Any = None, query: Optional[Dict[str, Any]] = None,
                      headers: Optional[Mapping[str, str]] = None, retry: Retry = Retry.UNSENT,
                      read: bool = False, timeout: Optional[float] = None, extra: float = 0.0,
                      retry_indeterminate: bool = False) -> Answer:
        """Send one logical request; returns the 2xx Answer or raises.

        Failures are retried within ``retry_for``, rotating over the
        addresses: a refused connection and a 503 always (nothing was
        applied); a transport failure or timeout after the request may
        have been sent only for Retry.SAFE calls, else it raises
        Indeterminate; a 504 INDETERMINATE only with retry_indeterminate
        (an acquire that carries its idempotency key)."""
        q = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in (query or {}).items()
             if v is not None and v != ""}
        if read and self.stale_reads:
            q["stale"] = "true"
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        hdrs = self._headers(headers)
        if data is not None:
            hdrs["Content-Type"] = "application/json"
        attempt_timeout = (self.timeout if timeout is None else timeout) + extra
        give_up = time.monotonic() + self.retry_for
        backoff = 0.05
        tries = 0
        last: Optional[BaseException] = None
        while True:
            idx = self._next % len(self.addrs)
            base = self.addrs[idx]
            tries += 1
            try:
                return await self._attempt(method, base, path, q, hdrs, data, attempt_timeout)
            except E.APIError as e:
                last = e
                retriable = isinstance(e, E.Retryable) or (isinstance(e, E.Indeterminate) and retry_indeterminate)
                if isinstance(e, E.Retryable):
                    self._next = idx + 1  # the next request starts elsewhere too
                if not retriable:
                    raise
            except _NotSent as e:
                last = E.TransportError(f"{base}: {e.cause}", sent=False)
                self._next = idx + 1
            except _MaybeSent as e:
                self._next = idx + 1
                if retry is not Retry.SAFE:
                    raise E.Indeterminate(504, {"code": "INDETERMINATE", "message": f"{base}: {e.cause}: the request may or may not have been applied"}, base) from e.cause
                last = E.TransportError(f"{base}: {e.cause}", sent=True)
            # Retry: the next address at once, then with a jittered backoff
            # once every address has been tried in this round.
            if time.monotonic() >= give_up:
                assert last is not None
                raise last
            if tries % len(self.addrs) == 0:
                wait = backoff * (0.5 + random.random() / 2)
                if isinstance(last, E.APIError) and last.retry_after:
                    wait = min(wait, last.retry_after)
                await asyncio.sleep(min(wait, max(0.0, give_up - time.monotonic())))
                backoff = min(backoff * 2, 1.0)

    async def _attempt(self, method: str, base: str, path: str, q: Dict[str, str], hdrs: Dict[str, str],
                       data: Optional[bytes], timeout: float) -> Answer:
        url = base + path
        try:
            async with self._http().request(method, url, params=q or None, data=data, headers=hdrs,
                                             timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                raw = await resp.read()
                return _answer(resp.status, resp.headers, raw, base)
        except aiohttp.ClientConnectorError as e:
            raise _NotSent(e) from e
        except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as e:
            raise _MaybeSent(e) from e

    # ---- leases ----

    async def acquire(self, key: str, holder: str, *, ttl: Optional[float] = None, session: Optional[SessionLike] = None,
                      limit: int = 0, metadata: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
                      lock_delay: Optional[float] = None, grant: bool = False,
                      idempotency_key: Optional[str] = None) -> Lease:
        """Acquire a lease on key (POST /v1/leases): standalone with ``ttl``
        (seconds), or bound to ``session``. ``wait`` queues for a slot that
        long; ``limit`` > 1 makes the key a semaphore. An idempotency key is
        made up if none is given, so that the acquire is retried safely
        after a transport failure or a 504 (the retry answers the one lease
        the first attempt may have created, with its token). The answer's
        ``token`` is the lease's secret."""
        a = await self._acquire("/v1/leases", {"key": key}, holder, ttl, session, limit, metadata, wait, lock_delay,
                                grant, idempotency_key)
        lease = Lease.from_dict(a.body)
        lease.index = a.index
        return lease

    async def _acquire(self, path: str, body: Dict[str, Any], holder: str, ttl: Optional[float],
                       session: Optional[SessionLike], limit: int, metadata: Optional[Mapping[str, str]],
                       wait: Optional[float], lock_delay: Optional[float], grant: bool,
                       idempotency_key: Optional[str]) -> Answer:
        """POST an acquire of a lease or a group: body names the key(s)."""
        body.update(holder=holder, idempotency_key=idempotency_key or secrets.token_urlsafe(18))
        hdrs: Dict[str, str] = {}
        if session is not None:
            body["session_id"] = session.session_id
            hdrs["X-Session-Token"] = session.token
        elif ttl is not None:
            body["ttl_ms"] = _ms(ttl)
        if limit:
            body["limit"] = limit
        if metadata:
            body["metadata"] = dict(metadata)
        if wait:
            body["wait_ms"] = _ms(wait)
        if lock_delay:
            body["lock_delay_ms"] = _ms(lock_delay)
        if grant:
            body["grant"] = True
        return await self.request("POST", path, body=body, headers=hdrs, retry=Retry.SAFE,
                                  extra=wait or 0.0, retry_indeterminate=True)

    async def renew(self, lease_id: str, token: str, *, ttl: Optional[float] = None,
                    metadata: Optional[Mapping[str, str]] = None, grant: bool = False,
                    timeout: Optional[float] = None) -> Lease:
        """Renew a standalone lease (POST /v1/leases/:id/renew); ``metadata``
        replaces the lease's metadata with the renewal ({} clears it). A
        renewal without a new TTL is retried after a transport failure (a
        duplicate only pushes the end later); one with ``ttl`` is not."""
        body: Dict[str, Any] = {}
        if ttl is not None:
            body["ttl_ms"] = _ms(ttl)
        if metadata is not None:
            body["metadata"] = dict(metadata)
        if grant:
            body["grant"] = True
        a = await self.request("POST", f"/v1/leases/{_esc(lease_id)}/renew", body=body or None,
                               headers={"X-Lease-Token": token},
                               retry=Retry.SAFE if ttl is None else Retry.UNSENT, timeout=timeout)
        return Lease.from_dict(a.body)

    async def release(self, lease_id: str, token: str = "", *, session_token: str = "", reason: str = "") -> Optional[Lease]:
        """Release a lease (DELETE /v1/leases/:id) with its token (or, bound,
        its session's). Retried after a transport failure: a retry that
        finds the lease already released counts as success (None)."""
        hdrs = {"X-Lease-Token": token} if token else {"X-Session-Token": session_token}
        try:
            a = await self.request("DELETE", f"/v1/leases/{_esc(lease_id)}", query={"reason": reason},
                                   headers=hdrs, retry=Retry.SAFE)
        except E.LeaseReleased:
            return None
        return Lease.from_dict(a.body) if a.body else None

    async def revoke(self, lease_id: str, reason: str = "") -> Lease:
        """Force-release a lease (admin; POST /v1/leases/:id/revoke)."""
        a = await self.request("POST", f"/v1/leases/{_esc(lease_id)}/revoke",
                               body={"reason": reason} if reason else None, retry=Retry.UNSENT)
        return Lease.from_dict(a.body)

    async def get(self, lease_id: str, *, token: str = "", session_token: str = "") -> Lease:
        """Read a lease (GET /v1/leases/:id); with its token, the holder's
        read, which carries a fresh grant."""
        hdrs: Dict[str, str] = {}
        if token:
            hdrs["X-Lease-Token"] = token
        elif session_token:
            hdrs["X-Session-Token"] = session_token
        a = await self.request("GET", f"/v1/leases/{_esc(lease_id)}", headers=hdrs, retry=Retry.SAFE, read=True)
        return Lease.from_dict(a.body)

    async def list_page(self, *, key: str = "", prefix: str = "", holder: str = "", session_id: str = "",
                        state: str = "", limit: int = 0, after: str = "") -> Tuple[List[Lease], str, int]:
        """One page of GET /v1/leases: (leases, next cursor, index)."""
        a = await self.request("GET", "/v1/leases", query={"key": key, "prefix": prefix, "holder": holder,
                               "session_id": session_id, "state": state, "limit": limit or None, "after": after},
                               retry=Retry.SAFE, read=True)
        return [Lease.from_dict(x) for x in a.body.get("leases") or []], a.body.get("next", "") or "", a.index

    async def list(self, *, key: str = "", prefix: str = "", holder: str = "", session_id: str = "",
                   state: str = "") -> List[Lease]:
        """Every lease matching the filters (follows ``next``)."""
        out: List[Lease] = []
        after = ""
        while True:
            page, after, _ = await self.list_page(key=key, prefix=prefix, holder=holder, session_id=session_id,
                                                  state=state, limit=1000, after=after)
            out.extend(page)
            if not after:
                return out

    async def validate(self, *, key: str = "", fencing_token: int = 0, lease_id: str = "",
                       token: str = "") -> Validation:
        """POST /v1/validate, by key and fencing token or by lease id and token."""
        body: Dict[str, Any] = {}
        if key:
            body.update(key=key, fencing_token=fencing_token)
        else:
            body.update(lease_id=lease_id, token=token)
        a = await self.request("POST", "/v1/validate", body=body, retry=Retry.SAFE)
        return Validation.from_dict(a.body)

    async def heartbeat(self, items: Sequence[Tuple[str, str]]) -> List[Dict[str, Any]]:
        """Renew many standalone leases in one entry (POST /v1/heartbeat):
        items are (lease_id, token); returns the per-item results."""
        a = await self.request("POST", "/v1/heartbeat",
                               body={"leases": [{"lease_id": i, "token": t} for i, t in items]}, retry=Retry.SAFE)
        return list(a.body.get("results") or [])

    # ---- groups ----

    async def acquire_group(self, keys: Sequence[Union[str, Tuple[str, int]]], holder: str, *,
                            ttl: Optional[float] = None, session: Optional[SessionLike] = None,
                            metadata: Optional[Mapping[str, str]] = None, wait: Optional[float] = None,
                            lock_delay: Optional[float] = None, idempotency_key: Optional[str] = None) -> Group:
        """Acquire several keys at once, all or nothing (POST /v1/groups);
        a key is "k" or ("k", limit)."""
        ks = [{"key": k} if isinstance(k, str) else {"key": k[0], "limit": k[1]} for k in keys]
        a = await self._acquire("/v1/groups", {"keys": ks}, holder, ttl, session, 0, metadata, wait, lock_delay,
                                False, idempotency_key)
        return Group.from_dict(a.body)

    async def get_group(self, group_id: str) -> Group:
        a = await self.request("GET", f"/v1/groups/{_esc(group_id)}", retry=Retry.SAFE, read=True)
        return Group.from_dict(a.body)

    async def renew_group(self, group_id: str, token: str, *, timeout: Optional[float] = None) -> Group:
        a = await self.request("POST", f"/v1/groups/{_esc(group_id)}/renew", headers={"X-Lease-Token": token},
                               retry=Retry.SAFE, timeout=timeout)
        return Group.from_dict(a.body)

    async def release_group(self, group_id: str, token: str = "", *, session_token: str = "") -> None:
        hdrs = {"X-Lease-Token": token} if token else {"X-Session-Token": session_token}
        try:
            await self.request("DELETE", f"/v1/groups/{_esc(group_id)}", headers=hdrs, retry=Retry.SAFE)
        except E.LeaseReleased:
            pass

    # ---- sessions ----

    async def create_session(self, holder: str, ttl: float, metadata: Optional[Mapping[str, str]] = None) -> Session:
        """POST /v1/sessions. Not retried after it may have been sent (a
        retry would make a second session): a failure then is Indeterminate."""
        body: Dict[str, Any] = {"holder": holder, "ttl_ms": _ms(ttl)}
        if metadata:
            body["metadata"] = dict(metadata)
        a = await self.request("POST", "/v1/sessions", body=body, retry=Retry.UNSENT)
        return Session.from_dict(a.body)

    async def session_heartbeat(self, session_id: str, token: str, metadata: Optional[Mapping[str, str]] = None,
                                *, timeout: Optional[float] = None) -> Session:
        """POST /v1/sessions/:id/heartbeat; ``metadata`` (worker stats)
        replaces the session's metadata with the heartbeat. Retried after a
        transport failure: a duplicate only pushes the end later."""
        a = await self.request("POST", f"/v1/sessions/{_esc(session_id)}/heartbeat",
                               body={"metadata": dict(metadata)} if metadata is not None else None,
                               headers={"X-Session-Token": token}, retry=Retry.SAFE, timeout=timeout)
        return Session.from_dict(a.body)

    async def get_session(self, session_id: str) -> Session:
        a = await self.request("GET", f"/v1/sessions/{_esc(session_id)}", retry=Retry.SAFE, read=True)
        return Session.from_dict(a.body)

    async def list_sessions(self, holder: str = "") -> List[Session]:
        out: List[Session] = []
        after = ""
        while True:
            a = await self.request("GET", "/v1/sessions", query={"holder": holder, "after": after, "limit": 1000},
                                   retry=Retry.SAFE, read=True)
            out.extend(Session.from_dict(x) for x in a.body.get("sessions") or [])
            after = a.body.get("next", "") or ""
            if not after:
                return out

    async def end_session(self, session_id: str, token: str = "") -> Optional[Session]:
        """End a session and its leases (without token: an admin's force)."""
        try:
            a = await self.request("DELETE", f"/v1/sessions/{_esc(session_id)}",
                                   headers={"X-Session-Token": token}, retry=Retry.SAFE)
        except E.SessionEnded:
            return None
        return Session.from_dict(a.body)

    async def release_holder(self, holder: str, reason: str = "") -> int:
        a = await self.request("POST", f"/v1/holders/{_esc(holder)}/release",
                               body={"reason": reason} if reason else None, retry=Retry.SAFE)
        return int(a.body.get("released", 0))

    # ---- keys, cluster ----

    async def keys(self) -> Dict[str, Any]:
        """The grant key set (GET /v1/keys), a JWK Set with ``cluster_id``."""
        return (await self.request("GET", "/v1/keys", retry=Retry.SAFE, read=True)).body

    async def cluster(self, stale: bool = False) -> Dict[str, Any]:
        return (await self.request("GET", "/v1/cluster", query={"stale": stale or None}, retry=Retry.SAFE)).body

    # ---- keep-alive helpers (see keepalive.py) ----

    def session(self, holder: str, ttl: float = 10.0, **kw: Any) -> "Any":
        """A kept-alive session: ``async with client.session("w1", ttl=10,
        stats=fn) as s:``; see leasehold.LiveSession."""
        from .keepalive import LiveSession
        return LiveSession(self, holder, ttl, **kw)

    async def keep_alive(self, lease: Lease, sent: float, **kw: Any) -> "Any":
        """Keep a standalone lease alive from its acquire's answer and the
        time.monotonic() the acquire was sent at; see leasehold.KeepAlive."""
        from .keepalive import KeepAlive, lease_renewer
        ka = KeepAlive(lease_renewer(self, lease), ttl=lease.ttl_ms / 1000.0,
                       granted=_granted(lease.ttl_ms, lease.remaining_ms), sent=sent,
                       hb_interval=lease.heartbeat_interval_ms / 1000.0, lease_id=lease.lease_id, **kw)
        ka.fencing_token = lease.fencing_token
        ka.start()
        return ka

    async def keepalive_stream(self) -> "Any":
        """A keep-alive stream (POST /v1/keepalive, full duplex): see
        leasehold.stream.RenewStream. Opened at its first renewal."""
        from .stream import RenewStream
        return RenewStream(self)

    # ---- events ----

    def events(self, *, key: str = "", prefix: str = "", holder: str = "", from_start: bool = False,
               after_index: int = 0, last_event_id: str = "", relist: bool = True,
               idle_timeout: float = 45.0) -> AsyncIterator[Event]:
        """Follow GET /v1/events as an async iterator of Event. A broken
        stream is opened again (any address) with Last-Event-ID: no event is
        missed or repeated. When the history no longer reaches back (410
        EVENTS_COMPACTED) it yields one ``resync`` Event with the current
        leases of the filter (relist=False raises EventsCompacted instead)
        and goes on from that listing's index. A stream silent for
        ``idle_timeout`` seconds (servers send a comment every 15 s) is
        taken as broken and opened again."""
        from .events import follow
        return follow(self, key=key, prefix=prefix, holder=holder, from_start=from_start,
                      after_index=after_index, last_event_id=last_event_id, relist=relist,
                      idle_timeout=idle_timeout)


def _granted(ttl_ms: int, remaining_ms: int) -> float:
    g = ttl_ms
    if remaining_ms > 0:
        g = min(g, remaining_ms) if g > 0 else remaining_ms
    return g / 1000.0


class _NotSent(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


class _MaybeSent(Exception):
    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause or "timed out"


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    v = headers.get("Retry-After", "")
    try:
        return float(int(v.strip())) if v else None
    except ValueError:
        return None


def _answer(status: int, headers: Mapping[str, str], raw: bytes, base: str) -> Answer:
    try:
        index = int(headers.get("X-Leasehold-Index", "0") or 0)
    except ValueError:
        index = 0
    payload: Any = None
    if raw.strip():
        try:
            payload = json.loads(raw)
        except ValueError:
            payload = raw[:200].decode("utf-8", "replace")
    if status // 100 != 2:
        raise E.from_answer(status, payload, base, _retry_after(headers))
    return Answer(status, payload if payload is not None else {}, index, base)
