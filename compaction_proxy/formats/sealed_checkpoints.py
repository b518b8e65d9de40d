"""Checkpoints the proxy hands to a client, sealed (pure).

The providers' compaction APIs give the client an opaque token for the history it compacted
(OpenAI's ``compaction`` item, Anthropic's ``compaction`` block), which the client sends back
in place of that history. A token the provider made can be read only by that provider (a stale
one fails with ``invalid_encrypted_content``). One the proxy makes (``native_compaction:
serve``) carries the checkpoint itself, so it becomes the checkpoint on any route, to any
upstream, even once the store has forgotten the conversation: the compacted history moves
with the user. Each format puts the token in its own shape (``formats.responses_compaction``,
``formats.anthropic_compaction``).

A token is ``cpx1.<payload>.<mac>``: the payload (base64url JSON: the summary, when it was made)
and an HMAC-SHA256 over the tenant and the payload, under a key derived from the proxy's tenant
secret. A token altered by one character, made up, or sent under another tenant's key does not
verify (``ForgedCheckpoint``). The summary is signed, not hidden: it is the client's own
history, condensed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac

import orjson

from compaction_proxy.frozen import frozen

TOKEN_PREFIX = "cpx1."
SEALED_MARK = b'"cpx1.'  # a body holding one of the proxy's tokens holds this
KEY_LABEL = b"compaction-proxy compaction item v1"


class ForgedCheckpoint(ValueError):
    """A token in the proxy's form that does not verify for the caller."""


@frozen
class MadeCompaction:
    """A compaction the proxy made for a client: the summary, its sealed token, and what the
    summary call took and gave (tokens)."""

    summary: str
    token: str
    input_tokens: int = 0
    output_tokens: int = 0


def sealing_key(tenant_secret: bytes) -> bytes:
    """The signing key, derived from the tenant secret (never the secret itself)."""
    return hmac.new(tenant_secret, KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, tenant: str, payload: str) -> str:
    signed = f"{tenant}\x00{payload}".encode()
    return _b64(hmac.new(key, signed, hashlib.sha256).digest())


def seal(key: bytes, tenant: str, summary: str, created: int) -> str:
    """The token carrying ``summary`` for ``tenant``."""
    payload = _b64(orjson.dumps({"summary": summary, "created": created}))
    return f"{TOKEN_PREFIX}{payload}.{_mac(key, tenant, payload)}"


def is_sealed(token: object) -> bool:
    """Whether ``token`` is in the proxy's form (verified or not)."""
    return isinstance(token, str) and token.startswith(TOKEN_PREFIX)


def unseal(key: bytes, tenant: str, token: str) -> str:
    """The summary ``token`` carries; ForgedCheckpoint unless it was sealed by this proxy for
    ``tenant`` and is unaltered."""
    body = token[len(TOKEN_PREFIX) :] if token.startswith(TOKEN_PREFIX) else None
    payload, dot, mac = (body or "").partition(".")
    expected = _mac(key, tenant, payload).encode()
    if not dot or not hmac.compare_digest(mac.encode(errors="replace"), expected):
        raise ForgedCheckpoint("it was not made for this account, or was altered")
    try:
        decoded = orjson.loads(_unb64(payload))
    except (binascii.Error, ValueError, orjson.JSONDecodeError) as exc:
        raise ForgedCheckpoint("it cannot be read") from exc
    summary = decoded.get("summary") if isinstance(decoded, dict) else None
    if not isinstance(summary, str):
        raise ForgedCheckpoint("it cannot be read")
    return summary
