"""Tenants: an HMAC of the client's API key under a server secret.

The key itself is never stored or logged; two clients share a tenant exactly when they send the
same key.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Mapping
from typing import Protocol

TENANT_HEX_LENGTH = 32


class SecretStore(Protocol):
    async def shared_secret(self, name: str, candidate: bytes) -> bytes: ...


def api_key_of(headers: Mapping[str, str]) -> str:
    """The client's credential: ``Authorization: Bearer …`` or Azure's ``api-key``."""
    authorization = headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    return headers.get("api-key", "").strip()


def tenant_of(secret: bytes, api_key: str) -> str:
    digest = hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()
    return digest[:TENANT_HEX_LENGTH]


class TenantSecret:
    """The server secret tenants are hashed under.

    A configured secret is used as is. Otherwise one is generated and kept in the store under
    ``SET NX`` semantics, so every replica and every restart agrees on it (with the in-process
    store it lives as long as the process). Until the store answers, ``get`` raises
    StoreUnavailable and requests are served without the store.
    """

    STORE_NAME = "tenant"

    def __init__(self, configured: bytes | None, store: SecretStore) -> None:
        self._secret = configured
        self._store = store

    async def get(self) -> bytes:
        if self._secret is None:
            self._secret = await self._store.shared_secret(self.STORE_NAME, secrets.token_bytes(32))
        return self._secret
