"""The Responses API's compaction items, as the proxy makes them (pure).

OpenAI's ``/v1/responses/compact`` and Codex's ``compaction_trigger`` answer with one opaque
``compaction`` item that the client sends back in place of the history it stands for. An item
the provider made can be read only by that provider (a stale one fails with
``invalid_encrypted_content``); an item the proxy makes (``native_compaction: serve``) carries
the checkpoint itself, so it becomes the checkpoint on any route, to any upstream, even once
the store has forgotten the conversation: the compacted history moves with the user.

``encrypted_content`` is ``cpx1.<payload>.<mac>``: the payload (base64url JSON: the summary,
when it was made) and an HMAC-SHA256 over the tenant and the payload, under a key derived from
the proxy's tenant secret. An item altered by one bit, made up, or sent under another tenant's
key does not verify (``ForgedItem``). The summary is signed, not hidden: it is the client's own
history, condensed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Sequence
from typing import Any

import orjson

TRIGGER_TYPE = "compaction_trigger"
ITEM_TYPE = "compaction"
TOKEN_PREFIX = "cpx1."
SEALED_MARK = b'"cpx1.'  # a body holding one of the proxy's items holds this
CREATED_BY = "compaction-proxy"
KEY_LABEL = b"compaction-proxy compaction item v1"


class ForgedItem(ValueError):
    """A ``compaction`` item in the proxy's form that does not verify for the caller."""


def item_key(tenant_secret: bytes) -> bytes:
    """The signing key, derived from the tenant secret (never the secret itself)."""
    return hmac.new(tenant_secret, KEY_LABEL, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, tenant: str, payload: str) -> str:
    signed = f"{tenant}\x00{payload}".encode()
    return _b64(hmac.new(key, signed, hashlib.sha256).digest())


def seal(key: bytes, tenant: str, summary: str, created: int) -> dict[str, Any]:
    """The ``compaction`` item carrying ``summary`` for ``tenant``; its id is a digest of the
    content, so the same summary sealed again is the same item."""
    payload = _b64(orjson.dumps({"summary": summary, "created": created}))
    content = f"{TOKEN_PREFIX}{payload}.{_mac(key, tenant, payload)}"
    ident = "cmp_" + hashlib.sha256(content.encode()).hexdigest()[:32]
    return {"id": ident, "type": ITEM_TYPE, "encrypted_content": content, "created_by": CREATED_BY}


def is_sealed(item: Any) -> bool:
    """Whether ``item`` is a ``compaction`` item in the proxy's form (verified or not)."""
    if not isinstance(item, dict) or item.get("type") != ITEM_TYPE:
        return False
    content = item.get("encrypted_content")
    return isinstance(content, str) and content.startswith(TOKEN_PREFIX)


def unseal(key: bytes, tenant: str, content: str) -> str:
    """The summary an item's ``encrypted_content`` carries; ForgedItem unless it was sealed
    by this proxy for ``tenant`` and is unaltered."""
    body = content[len(TOKEN_PREFIX) :] if content.startswith(TOKEN_PREFIX) else None
    payload, dot, mac = (body or "").partition(".")
    expected = _mac(key, tenant, payload).encode()
    if not dot or not hmac.compare_digest(mac.encode(errors="replace"), expected):
        raise ForgedItem("the compaction item was not made for this account, or was altered")
    try:
        decoded = orjson.loads(_unb64(payload))
    except (binascii.Error, ValueError, orjson.JSONDecodeError) as exc:
        raise ForgedItem("the compaction item cannot be read") from exc
    summary = decoded.get("summary") if isinstance(decoded, dict) else None
    if not isinstance(summary, str):
        raise ForgedItem("the compaction item cannot be read")
    return summary


def asks_for_compaction(body: dict[str, Any]) -> bool:
    """Whether a Responses body ends with a ``compaction_trigger`` item (Codex's remote
    compaction: the answer must be exactly one ``compaction`` item)."""
    items = body.get("input")
    if not isinstance(items, list) or not items:
        return False
    last = items[-1]
    return isinstance(last, dict) and last.get("type") == TRIGGER_TYPE


def summary_message_item(text: str) -> dict[str, Any]:
    """The input item a verified compaction item becomes: the checkpoint, as a user message."""
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def user_message_items(items: Sequence[Any]) -> list[dict[str, Any]]:
    """The user messages among ``items``, as ``/v1/responses/compact`` returns them ahead of
    its compaction item."""
    kept = []
    for item in items:
        if not isinstance(item, dict) or item.get("role") != "user":
            continue
        if item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "input_text", "text": content}]
        kept.append({"type": "message", "role": "user", "content": content})
    return kept


def responses_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """A summary call's usage (chat or Responses form) in the Responses API's form."""
    usage = usage or {}
    taken = usage.get("input_tokens", usage.get("prompt_tokens", 0))
    given = usage.get("output_tokens", usage.get("completion_tokens", 0))
    taken = taken if isinstance(taken, int) else 0
    given = given if isinstance(given, int) else 0
    return {
        "input_tokens": taken,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": given,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": taken + given,
    }


def trigger_response(
    response_id: str, model: str, created: int, item: dict[str, Any], usage: dict[str, Any]
) -> dict[str, Any]:
    """The Response object answering a ``compaction_trigger``: one ``compaction`` output."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "completed",
        "model": model,
        "output": [item],
        "usage": usage,
        "error": None,
        "incomplete_details": None,
    }


def trigger_events(response: dict[str, Any]) -> bytes:
    """``response`` as the server-sent events of a streamed answer: created, the item added
    and done, completed."""
    item = response["output"][0]
    started = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": started},
        {"type": "response.in_progress", "response": started},
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_item.done", "output_index": 0, "item": item},
        {"type": "response.completed", "response": response},
    ]
    return b"".join(
        b"event: %s\ndata: %s\n\n" % (e["type"].encode(), orjson.dumps({**e, "sequence_number": n}))
        for n, e in enumerate(events)
    )


def compacted_response(
    response_id: str,
    created: int,
    items: Sequence[Any],
    item: dict[str, Any],
    usage: dict[str, Any],
) -> dict[str, Any]:
    """``/v1/responses/compact``'s answer: the input's user messages, then the item."""
    return {
        "id": response_id,
        "object": "response.compaction",
        "created_at": created,
        "output": [*user_message_items(items), item],
        "usage": usage,
    }


def _is_compaction_option(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("type") == ITEM_TYPE


def compaction_option(body: dict[str, Any]) -> int | bool | None:
    """A Responses body's ``context_management`` compaction: its ``compact_threshold``
    (tokens), None when it gives none, False when the body asks for no such thing."""
    entries = body.get("context_management")
    if not isinstance(entries, list):
        return False
    for entry in entries:
        if _is_compaction_option(entry):
            threshold = entry.get("compact_threshold")
            valid = isinstance(threshold, int) and not isinstance(threshold, bool)
            return threshold if valid and threshold > 0 else None
    return False


def without_compaction_option(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without its ``context_management`` compaction (the field left out when
    nothing else is in it), for an upstream that has no such option."""
    kept = [e for e in body["context_management"] if not _is_compaction_option(e)]
    rest = {key: value for key, value in body.items() if key != "context_management"}
    return {**rest, "context_management": kept} if kept else rest
