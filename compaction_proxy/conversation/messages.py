"""The conversation model: canonical messages and chain hashes.

Everything here is pure: plain data in, plain data out, no I/O.

Invariants (DESIGN.md §3):

* ``chain[i]`` names the whole body prefix ``body[0..i]`` of one tenant, so two requests share
  ``chain[i]`` exactly when they share that prefix.
* A replacement record applies to a request only when the request shares the exact prefix the
  record was made from; a request never receives a replacement whose prefix it does not share.
* The head (leading ``system``/``developer`` messages) is never replaced and never hashed: it is
  always taken from the current request.
* A checkpoint never covers the last body message: the model always sees the newest turn as sent.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from compaction_proxy.parsing import jsonio

Message = dict[str, Any]

HEAD_ROLES = frozenset({"system", "developer"})
MESSAGE_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})

_DIGEST_SIZE = 16
_SESSION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=_DIGEST_SIZE)
    for part in parts:
        h.update(part)
    return h.hexdigest()


def _present(value: Any) -> bool:
    return value is not None and value != "" and value != [] and value != {}


def canonical_message(message: Mapping[str, Any]) -> bytes:
    """The bytes that identify a message for hashing.

    Keeps only the semantic fields; null or empty ones and provider extras (``refusal``,
    ``annotations``, ...) are dropped, so a client that re-serializes an assistant message
    slightly differently still produces the same bytes. Content parts lose their non-semantic
    fields (``cache_control``, which caching clients move to the newest message every turn), and
    a lone text part hashes as its plain string, so moving a cache breakpoint never changes a
    message's identity.
    """
    canonical: dict[str, Any] = {"role": message.get("role")}
    content = canonical_content(message.get("content"))
    if _present(content):
        canonical["content"] = content
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if _present(value):
            canonical[key] = value
    tool_calls = message.get("tool_calls")
    if isinstance(tool_calls, list) and tool_calls:
        canonical["tool_calls"] = [_canonical_call(call) for call in tool_calls]
    function_call = message.get("function_call")
    if isinstance(function_call, Mapping) and function_call:
        canonical["function_call"] = {
            "name": function_call.get("name"),
            "arguments": function_call.get("arguments"),
        }
    return jsonio.dumps(canonical, sort_keys=True)


# Part fields that change how a provider caches or annotates a part, not what the model reads.
NON_SEMANTIC_PART_FIELDS = frozenset({"cache_control", "annotations", "logprobs"})


def canonical_content(content: Any) -> Any:
    """Content as it matters to the model: parts without non-semantic fields, and a list that
    holds exactly one text part as that part's string."""
    if not isinstance(content, list):
        return content
    parts = [_canonical_part(part) for part in content]
    if len(parts) == 1 and isinstance(parts[0], dict) and parts[0].get("type") == "text":
        text = parts[0].get("text")
        if isinstance(text, str):
            return text
    return parts


def _canonical_part(part: Any) -> Any:
    if not isinstance(part, Mapping):
        return part
    if part.get("type") == "text":
        return {"type": "text", "text": part.get("text")}
    return {k: v for k, v in part.items() if k not in NON_SEMANTIC_PART_FIELDS}


def _canonical_call(call: Any) -> Any:
    if not isinstance(call, Mapping):
        return call
    function = call.get("function")
    function = function if isinstance(function, Mapping) else {}
    return {
        "id": call.get("id"),
        "type": call.get("type", "function"),
        "function": {"name": function.get("name"), "arguments": function.get("arguments")},
    }


def split_head(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """Split off the leading run of system/developer messages (the head) from the body."""
    cut = 0
    while cut < len(messages) and messages[cut].get("role") in HEAD_ROLES:
        cut += 1
    body = messages[cut:]  # a list's slice is a copy already: the history is copied once
    return list(messages[:cut]), body if isinstance(body, list) else list(body)


def task_position(body: Sequence[Message]) -> int | None:
    """Body position of the first user message: the task an agent was given, or the user's
    opening request. Everything after it is read in its light, so no cut (prune, mask, bridge)
    ever touches it; only a checkpoint may take it in. None when the body has no user message."""
    return next((i for i, m in enumerate(body) if m.get("role") == "user"), None)


def live_turn_start(body: Sequence[Message]) -> int:
    """Body position where the live turn starts: everything after the last assistant message
    (the whole body when there is none). The live turn reaches the model exactly as sent."""
    for position in range(len(body) - 1, -1, -1):
        if body[position].get("role") == "assistant":
            return position + 1
    return 0


@functools.lru_cache(maxsize=1024)
def chain_root(tenant: str) -> str:
    """``c[-1]``: the hash every chain of this tenant starts from."""
    return _digest(b"tenant\x00", tenant.encode())


def message_digest(message: Mapping[str, Any]) -> str:
    """``H(canonical(message))``: names one message's content, wherever it stands."""
    return _digest(canonical_message(message))


def chain_hashes(
    root: str,
    body: Sequence[Message],
    digests: Sequence[str] | None = None,
    known: Sequence[str] = (),
) -> list[str]:
    """``c[i] = H(c[i-1] || H(canonical(body[i])))`` for every body position.

    ``digests`` (from ``message_digest``) may be passed when already computed, so a request's
    messages are serialized and hashed once for the chain and the token meter together.
    ``known`` is the chain of a body this one begins with (same root, same first messages):
    it is taken as it is and only the positions after it are hashed.
    """
    if digests is None:
        digests = [message_digest(message) for message in body]
    if len(known) > len(digests):
        raise ValueError("a known chain longer than the body")
    chain = list(known)
    previous = bytes.fromhex(chain[-1] if chain else root)
    for digest in digests[len(chain) :]:
        previous = hashlib.blake2b(
            previous + bytes.fromhex(digest), digest_size=_DIGEST_SIZE
        ).digest()
        chain.append(previous.hex())
    return chain


def is_valid_session_id(value: str) -> bool:
    return _SESSION_ID.fullmatch(value) is not None


def conversation_id(tenant: str, root: str, chain: Sequence[str], session_id: str | None) -> str:
    """Groups a conversation's log, lease, generation and metrics.

    From the ``X-Session-Id`` header when given (namespaced by tenant), else from the first body
    message. It does not decide which replacements apply; chain hashes do.
    """
    if session_id is not None:
        return "s" + _digest(b"session\x00", tenant.encode(), b"\x00", session_id.encode())
    return "c" + (chain[0] if chain else root)


BRANCH_FINGERPRINT_MESSAGES = 3


def branch_fingerprint(digests: Sequence[str], end: int) -> str:
    """Names the messages just before and at body position ``end`` by content alone, wherever
    the prefix before them differs."""
    first = max(0, end - BRANCH_FINGERPRINT_MESSAGES + 1)
    return _digest(b"branch\x00", *(bytes.fromhex(d) for d in digests[first : end + 1]))
