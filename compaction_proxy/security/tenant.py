"""Tenants: an HMAC of the client's API key under a server secret.

The key itself is never stored or logged; two clients share a tenant exactly when they send the
same key.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from compaction_proxy.store.base import StoreUnavailable

TENANT_HEX_LENGTH = 32


class SecretStore(Protocol):
    async def shared_secret(self, name: str, candidate: bytes) -> bytes: ...


# A browser cannot set headers on a WebSocket, so OpenAI takes its key as a subprotocol.
KEY_PROTOCOL_PREFIX = "openai-insecure-api-key."


def api_key_of(headers: Mapping[str, str]) -> str:
    """The client's credential: ``Authorization: Bearer …``, Azure's ``api-key``, Anthropic's
    ``x-api-key``, or (a browser's WebSocket) an ``openai-insecure-api-key.…`` subprotocol."""
    authorization = headers.get("Authorization", "")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    for name in ("api-key", "x-api-key"):  # Azure's, Anthropic's
        api_key = headers.get(name, "").strip()
        if api_key:
            return api_key
    for protocol in headers.get("Sec-WebSocket-Protocol", "").split(","):
        offered = protocol.strip()
        if offered.startswith(KEY_PROTOCOL_PREFIX) and len(offered) > len(KEY_PROTOCOL_PREFIX):
            return offered[len(KEY_PROTOCOL_PREFIX) :]
    return ""


# One HMAC per request cost tens of microseconds (OpenSSL sets up the digest each time) while
# a process sees few keys: the last few thousand are kept (in memory only, as requests hold them).
@functools.lru_cache(maxsize=4096)
def tenant_of(secret: bytes, api_key: str) -> str:
    digest = hmac.new(secret, api_key.encode(), hashlib.sha256).hexdigest()
    return digest[:TENANT_HEX_LENGTH]


class TenantSecret:
    """The server secret tenants are hashed under.

    A configured secret is used as is. Otherwise one is generated and kept in the store under
    ``SET NX`` semantics, so every replica and every restart agrees on it (with the in-process
    store it lives as long as the process). Until the store answers, ``get`` raises
    StoreUnavailable and requests are served without the store.

    Replicas converge after the store loses its data: every ``refresh_seconds`` a replica
    offers the secret it holds back to the store (``SET NX``) and adopts whatever the store
    then holds. The first replica to look after the loss writes its secret back; the others,
    and a replica started since (which may have written a fresh one first), all end up on the
    one value in the store within ``refresh_seconds``.
    """

    STORE_NAME = "tenant"

    def __init__(
        self,
        configured: bytes | None,
        store: SecretStore,
        refresh_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._configured = configured is not None
        self._secret = configured
        self._store = store
        self.refresh_seconds = refresh_seconds
        self._clock = clock
        self._checked_at = -math.inf

    async def get(self) -> bytes:
        if self._configured and self._secret is not None:
            return self._secret
        now = self._clock()
        if self._secret is not None and now - self._checked_at < self.refresh_seconds:
            return self._secret
        offered = self._secret or secrets.token_bytes(32)
        try:
            self._secret = await self._store.shared_secret(self.STORE_NAME, offered)
        except StoreUnavailable:
            if self._secret is None:
                raise
            # The secret held stays in force while the store is away.
        self._checked_at = now
        return self._secret
