"""Tenants: an HMAC of the client's API key under a server secret.

The key itself is never stored or logged; two clients share a tenant exactly when they send the
same key.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

TENANT_HEX_LENGTH = 32


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
