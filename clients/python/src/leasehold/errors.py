"""Typed exceptions mirroring the wire error codes (wire/errors.go)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Type


class LeaseholdError(Exception):
    """Base of every error this package raises."""


class TransportError(LeaseholdError):
    """No answer from any address: connection refused, reset or timed out.

    ``sent`` is False when the request provably never reached a server
    (the connection could not be made), True when it may have."""

    def __init__(self, message: str, sent: bool = True) -> None:
        super().__init__(message)
        self.sent = sent


@dataclass
class Holder:
    holder: str
    lease_id: str
    remaining_ms: int


class APIError(LeaseholdError):
    """A non-2xx answer. ``code`` is the contract code, ``status`` the HTTP
    status; ``field``, ``key``, ``holders``, ``remaining_ms``, ``limit`` are
    set where the code calls for them. Subclasses exist per code; unknown
    codes are plain APIError."""

    code: str = ""

    def __init__(self, status: int, body: Dict[str, Any], addr: str = "", retry_after: Optional[float] = None) -> None:
        self.status = status
        self.body = body
        self.code = str(body.get("code") or self.code or "")
        self.message = str(body.get("message", ""))
        self.field: str = body.get("field", "") or ""
        self.key: str = body.get("key", "") or ""
        self.holders: List[Holder] = [
            Holder(h.get("holder", ""), h.get("lease_id", ""), int(h.get("remaining_ms", 0)))
            for h in (body.get("holders") or [])
        ]
        self.remaining_ms: int = int(body.get("remaining_ms", 0) or 0)
        self.limit: int = int(body.get("limit", 0) or 0)
        self.applied_index: int = int(body.get("applied_index", 0) or 0)
        self.addr = addr
        self.retry_after = retry_after
        msg = f"{self.code}: {self.message}"
        if self.field:
            msg += f" (field {self.field})"
        super().__init__(msg)


class InvalidArgument(APIError):
    code = "INVALID_ARGUMENT"


class Unauthenticated(APIError):
    code = "UNAUTHENTICATED"


class PermissionDenied(APIError):
    code = "PERMISSION_DENIED"


class LeaseTokenInvalid(APIError):
    code = "LEASE_TOKEN_INVALID"


class NotFoundError(APIError):
    """Base of the 404 codes."""


class LeaseNotFound(NotFoundError):
    code = "LEASE_NOT_FOUND"


class SessionNotFound(NotFoundError):
    code = "SESSION_NOT_FOUND"


class NotFound(NotFoundError):
    code = "NOT_FOUND"


class ConflictError(APIError):
    """Base of the 409 codes."""


class LeaseHeld(ConflictError):
    code = "LEASE_HELD"


class LimitMismatch(ConflictError):
    code = "LIMIT_MISMATCH"


class LockDelay(ConflictError):
    code = "LOCK_DELAY"


class EndedError(ConflictError):
    """Base of the codes of an operation on an ended lease or session."""


class LeaseExpired(EndedError):
    code = "LEASE_EXPIRED"


class LeaseReleased(EndedError):
    code = "LEASE_RELEASED"


class LeaseRevoked(EndedError):
    code = "LEASE_REVOKED"


class SessionEnded(EndedError):
    code = "SESSION_ENDED"


class IdempotencyConflict(ConflictError):
    code = "IDEMPOTENCY_CONFLICT"


class IndexPassed(ConflictError):
    code = "INDEX_PASSED"


class ControlLocked(ConflictError):
    code = "CONTROL_LOCKED"


class LeaseInvalid(APIError):
    code = "LEASE_INVALID"


class LeaseRequired(APIError):
    code = "LEASE_REQUIRED"


class EventsCompacted(APIError):
    code = "EVENTS_COMPACTED"


class PayloadTooLarge(APIError):
    code = "PAYLOAD_TOO_LARGE"


class ResourceExhausted(APIError):
    code = "RESOURCE_EXHAUSTED"


class MethodNotAllowed(APIError):
    code = "METHOD_NOT_ALLOWED"


class Retryable(APIError):
    """Base of the 503 codes: nothing was applied; send it again."""


class NoLeader(Retryable):
    code = "NO_LEADER"


class Unavailable(Retryable):
    code = "UNAVAILABLE"


class OutOfService(Retryable):
    """This server took itself out of service (its state diverged, its log
    is damaged, it was removed or it is frozen: ``service_state`` in the
    answer says which). Nothing was applied; the client tries another
    address."""

    code = "OUT_OF_SERVICE"


class Indeterminate(APIError):
    """504 INDETERMINATE, or a write whose connection broke after it was
    sent: it may or may not have been applied."""

    code = "INDETERMINATE"


class Internal(APIError):
    code = "INTERNAL"


class LeaseLost(LeaseholdError):
    """A lease, session, lock, slot or leadership was lost (or its holder's
    deadline passed without a successful renewal)."""


class NotRenewed(LeaseLost):
    """No renewal succeeded before the holder's deadline."""


_BY_CODE: Dict[str, Type[APIError]] = {}
for _cls in list(globals().values()):
    if isinstance(_cls, type) and issubclass(_cls, APIError) and _cls.__dict__.get("code"):
        _BY_CODE[_cls.code] = _cls

_BY_STATUS = {400: "INVALID_ARGUMENT", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "NOT_FOUND",
              405: "METHOD_NOT_ALLOWED", 410: "EVENTS_COMPACTED", 413: "PAYLOAD_TOO_LARGE",
              429: "RESOURCE_EXHAUSTED", 503: "UNAVAILABLE", 504: "INDETERMINATE"}


def error_class(code: str) -> Type[APIError]:
    """The exception class of a wire code (APIError for an unknown one)."""
    return _BY_CODE.get(code, APIError)


def from_answer(status: int, payload: Any, addr: str = "", retry_after: Optional[float] = None) -> APIError:
    """Build the typed error of a non-2xx answer."""
    body: Dict[str, Any] = {}
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict) and payload["error"].get("code"):
        body = dict(payload["error"])
    else:
        text = payload if isinstance(payload, str) else ""
        body = {"code": _BY_STATUS.get(status, "INTERNAL"), "message": f"HTTP {status}: {text[:200]}".rstrip(": ")}
    return error_class(str(body["code"]))(status, body, addr, retry_after)
