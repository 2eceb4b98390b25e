"""Grants: a lease's signed statement (a JWS), verified offline against the
cluster's key set (GET /v1/keys) with PyJWT; and a fence that keeps the
highest fencing token seen per key."""

from __future__ import annotations

import asyncio
import json
import time
from typing import TYPE_CHECKING, Any, Dict, Optional

import jwt

from . import errors as E

if TYPE_CHECKING:
    from .client import Client

GRANT_TYP = "leasehold-grant+jwt"


class GrantError(E.LeaseholdError):
    """A grant that does not verify: bad signature, unknown key, wrong
    issuer, type or algorithm, or expired (beyond the leeway)."""


class GrantVerifier:
    """Verifies grants against the key set of ``client``'s cluster.

    ``cluster_id`` pins the issuer (default: the key set's own). A grant
    naming a kid the set lacks refetches the set, at most once per
    ``refetch_every`` seconds (a forger can send any kid); the set is also
    refetched after ``max_age``. ``leeway`` (seconds) is allowed on exp;
    None skips the exp check (the fencing token is what fences)."""

    def __init__(self, client: "Client", *, cluster_id: str = "", leeway: Optional[float] = 5.0,
                 max_age: float = 300.0, refetch_every: float = 1.0) -> None:
        self.client = client
        self.cluster_id = cluster_id
        self.leeway = leeway
        self.max_age = max_age
        self.refetch_every = refetch_every
        self._keys: Dict[str, Any] = {}
        self._set_cluster = ""
        self._fetched = float("-inf")
        self._lock = asyncio.Lock()

    async def refresh(self) -> None:
        ks = await self.client.keys()
        keys: Dict[str, Any] = {}
        for k in ks.get("keys") or []:
            if k.get("kid") and k.get("kty") == "OKP":
                keys[k["kid"]] = jwt.PyJWK(k, algorithm="EdDSA").key
        self._keys, self._set_cluster, self._fetched = keys, ks.get("cluster_id", ""), time.monotonic()

    async def _key(self, kid: str) -> Any:
        async with self._lock:
            now = time.monotonic()
            if now - self._fetched > self.max_age or (kid not in self._keys and now - self._fetched >= self.refetch_every):
                await self.refresh()
            return self._keys.get(kid)

    async def verify(self, grant: str) -> Dict[str, Any]:
        """The grant's claims, or GrantError."""
        try:
            header = jwt.get_unverified_header(grant)
        except jwt.PyJWTError as e:
            raise GrantError(f"malformed grant: {e}") from e
        if header.get("alg") != "EdDSA" or header.get("typ") != GRANT_TYP:
            raise GrantError(f"not a grant: alg {header.get('alg')!r}, typ {header.get('typ')!r}")
        key = await self._key(str(header.get("kid", "")))
        if key is None:
            raise GrantError(f"unknown signing key {header.get('kid')!r}")
        issuer = self.cluster_id or self._set_cluster
        opts = {"require": ["iss", "iat", "exp"], "verify_exp": self.leeway is not None}
        try:
            return jwt.decode(grant, key, algorithms=["EdDSA"], issuer=issuer, options=opts,
                              leeway=self.leeway or 0)
        except jwt.PyJWTError as e:
            raise GrantError(f"grant refused: {e}") from e


class StaleToken(E.LeaseholdError):
    """A write fenced out: its token is below the highest seen for the key."""


class FenceGuard:
    """What a resource keeps: the highest fencing token seen per key. A
    write with a lower token is refused (StaleToken); an equal or higher one
    is accepted and raises the bar. ``check_grant`` verifies a grant first,
    so that only tokens the cluster issued count."""

    def __init__(self, verifier: Optional[GrantVerifier] = None) -> None:
        self.highest: Dict[str, int] = {}
        self.verifier = verifier

    def check(self, key: str, token: int) -> None:
        top = self.highest.get(key, 0)
        if token < top:
            raise StaleToken(f"{key}: fencing token {token} below {top}")
        self.highest[key] = token

    async def check_grant(self, grant: str) -> Dict[str, Any]:
        if self.verifier is None:
            raise GrantError("no verifier")
        claims = await self.verifier.verify(grant)
        self.check(str(claims["key"]), int(claims["fencing_token"]))
        return claims


def unverified_claims(grant: str) -> Dict[str, Any]:
    """A grant's claims without any check (for display only)."""
    return json.loads(jwt.utils.base64url_decode(grant.split(".")[1]))
