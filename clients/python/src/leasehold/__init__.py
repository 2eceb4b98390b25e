"""Leasehold's Python client: asyncio first (aiohttp), with a small
synchronous facade (leasehold.sync). See docs/python.md."""

from . import sync  # noqa: F401
from .client import Client, Retry
from .errors import *  # noqa: F401,F403 - the typed errors, one per wire code
from .errors import APIError, LeaseholdError, LeaseLost, NotRenewed, TransportError, error_class
from .grants import FenceGuard, GrantError, GrantVerifier, StaleToken
from .keepalive import KeepAlive, LiveSession, default_margin
from .stream import RenewStream
from .recipes import Election, Leader, Lock, Semaphore, leader_of, observe
from .types import Event, Group, Lease, Session, Validation

__version__ = "0.1.0"

__all__ = ["Client", "Retry", "APIError", "LeaseholdError", "LeaseLost", "NotRenewed", "TransportError",
           "error_class", "FenceGuard", "GrantError", "GrantVerifier", "StaleToken", "KeepAlive", "LiveSession",
           "default_margin", "Election", "Leader", "Lock", "Semaphore", "leader_of", "observe", "Event", "Group",
           "Lease", "Session", "Validation", "RenewStream"]
