"""Which instructions a replacement record was made under (pure).

A checkpoint summarizes a span *as read under* a system prompt and a tool set: the head and
the tools are outside the body chain, so without this a request that shares the body prefix
but carries other instructions would be sent a summary written for the first ones. Every
record therefore names the context it was made under, and applies only to requests whose
context matches.

"Matches" is up to a normalization, so that the dynamic parts agents put in their system
prompts do not break reuse: dates and times, weekday and month names, UUIDs, long hex ids and
every run of digits are replaced by placeholders, and whitespace is collapsed, before hashing.
A changed instruction (any other word) or another tool set gives another context.

Records made before contexts were recorded carry none and apply as they did.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.text import text_of
from compaction_proxy.parsing import jsonio

_CALENDAR_WORDS = (
    r"\b(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?"
    r"|Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?"
    r"|Mon(?:day)?|Tue(?:s(?:day)?)?|Wed(?:nesday)?|Thu(?:rs(?:day)?)?|Fri(?:day)?"
    r"|Sat(?:urday)?|Sun(?:day)?)\b"
)
# Order matters: ids before digit runs (whitespace comes last, in normalized_instructions).
_VOLATILE = [
    (re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}"), "<id>"),
    (re.compile(r"\b(?=[0-9a-fA-F]*\d)(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{12,}\b"), "<id>"),
    (re.compile(_CALENDAR_WORDS), "<date>"),
    (re.compile(r"\d+"), "<n>"),
]


def normalized_instructions(text: str) -> str:
    for pattern, placeholder in _VOLATILE:
        text = pattern.sub(placeholder, text)
    # Each run of whitespace as one space, none at the ends: what ``re.sub(r"\s+", " ", text)
    # .strip()`` makes (both take whitespace as str.isspace does), in a fifth of its time.
    return " ".join(text.split())


def context_fingerprint(head: Sequence[dict[str, Any]], tools: Any) -> str:
    """Names the instructions a request carries (head and tools), up to the normalization."""
    h = hashlib.blake2b(digest_size=16)
    for message in head:
        h.update(str(message.get("role", "")).encode())
        h.update(b"\x00")
        text = text_of(message.get("content"))
        content = text if text is not None else jsonio.dumps(message.get("content")).decode()
        h.update(normalized_instructions(content).encode())
        h.update(b"\x01")
    h.update(jsonio.dumps(tools or None, sort_keys=True))
    return h.hexdigest()
