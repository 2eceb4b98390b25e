"""The objects the API answers with, as typed dataclasses. Each keeps the
answer's JSON object in ``raw`` (fields a later server adds are there)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


def _meta(d: Dict[str, Any]) -> Dict[str, str]:
    m = d.get("metadata") or {}
    return dict(m) if isinstance(m, dict) else {}


@dataclass
class Lease:
    lease_id: str
    key: str
    holder: str
    state: str
    fencing_token: int
    limit: int = 1
    session_id: str = ""
    group_id: str = ""
    ttl_ms: int = 0
    remaining_ms: int = 0
    expires_at: str = ""
    acquired_at: str = ""
    heartbeat_interval_ms: int = 0
    renewal_count: int = 0
    metadata: Dict[str, str] = field(default_factory=dict)
    end_reason: str = ""
    token: str = field(default="", repr=False)
    grant: str = field(default="", repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: the Raft index of the answer that carried it (X-Leasehold-Index), 0 if unknown
    index: int = 0

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Lease":
        return cls(
            lease_id=d.get("lease_id", ""), key=d.get("key", ""), holder=d.get("holder", ""),
            state=d.get("state", ""), fencing_token=int(d.get("fencing_token", 0) or 0),
            limit=int(d.get("limit", 1) or 1), session_id=d.get("session_id", "") or "",
            group_id=d.get("group_id", "") or "", ttl_ms=int(d.get("ttl_ms", 0) or 0),
            remaining_ms=int(d.get("remaining_ms", 0) or 0), expires_at=d.get("expires_at", "") or "",
            acquired_at=d.get("acquired_at", "") or "",
            heartbeat_interval_ms=int(d.get("heartbeat_interval_ms", 0) or 0),
            renewal_count=int(d.get("renewal_count", 0) or 0), metadata=_meta(d),
            end_reason=d.get("end_reason", "") or "", token=d.get("token", "") or "",
            grant=d.get("grant", "") or "", raw=d)

    @property
    def active(self) -> bool:
        return self.state == "active"


@dataclass
class Session:
    session_id: str
    holder: str
    state: str
    ttl_ms: int = 0
    remaining_ms: int = 0
    expires_at: str = ""
    heartbeat_interval_ms: int = 0
    heartbeat_count: int = 0
    metadata: Dict[str, str] = field(default_factory=dict)
    lease_ids: List[str] = field(default_factory=list)
    end_reason: str = ""
    token: str = field(default="", repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Session":
        return cls(
            session_id=d.get("session_id", ""), holder=d.get("holder", ""), state=d.get("state", ""),
            ttl_ms=int(d.get("ttl_ms", 0) or 0), remaining_ms=int(d.get("remaining_ms", 0) or 0),
            expires_at=d.get("expires_at", "") or "",
            heartbeat_interval_ms=int(d.get("heartbeat_interval_ms", 0) or 0),
            heartbeat_count=int(d.get("heartbeat_count", 0) or 0), metadata=_meta(d),
            lease_ids=list(d.get("lease_ids") or []), end_reason=d.get("end_reason", "") or "",
            token=d.get("token", "") or "", raw=d)


@dataclass
class Group:
    group_id: str
    holder: str
    state: str
    leases: List[Lease]
    session_id: str = ""
    ttl_ms: int = 0
    remaining_ms: int = 0
    heartbeat_interval_ms: int = 0
    token: str = field(default="", repr=False)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Group":
        return cls(
            group_id=d.get("group_id", ""), holder=d.get("holder", ""), state=d.get("state", ""),
            leases=[Lease.from_dict(x) for x in d.get("leases") or []],
            session_id=d.get("session_id", "") or "", ttl_ms=int(d.get("ttl_ms", 0) or 0),
            remaining_ms=int(d.get("remaining_ms", 0) or 0),
            heartbeat_interval_ms=int(d.get("heartbeat_interval_ms", 0) or 0),
            token=d.get("token", "") or "", raw=d)


@dataclass
class Validation:
    valid: bool
    reason: str
    current: Optional[Lease]

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Validation":
        cur = d.get("current")
        return cls(bool(d.get("valid")), d.get("reason", ""), Lease.from_dict(cur) if cur else None)


@dataclass
class Event:
    """One event of /v1/events. ``type`` is the server's (acquired,
    renewed, released, expired, revoked, session_*, lock_delay_ended), or
    ``resync`` (made by this client): the history no longer reached back
    (410), so ``leases`` is a fresh listing of the watched leases, and the
    stream goes on from there."""

    id: str
    type: str
    index: int = 0
    key: str = ""
    lease: Optional[Lease] = None
    session: Optional[Session] = None
    reason: str = ""
    previous: str = ""
    leases: List[Lease] = field(default_factory=list)
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Event":
        lease, sess = d.get("lease"), d.get("session")
        return cls(id=d.get("id", ""), type=d.get("type", ""), index=int(d.get("index", 0) or 0),
                   key=d.get("key", "") or "", lease=Lease.from_dict(lease) if lease else None,
                   session=Session.from_dict(sess) if sess else None, reason=d.get("reason", "") or "",
                   previous=d.get("previous", "") or "", raw=d)
