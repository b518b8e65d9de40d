"""Message content as text (pure): the text parts of a content value, and cutting them.

Content is a string or a list of parts; only ``text`` parts are text. Cuts are made on the
parts' joined text, by code point, never inside a UTF-16 surrogate pair; non-text parts keep
their place and every part keeps its own fields (``cache_control`` included).
"""

from __future__ import annotations

from itertools import compress, repeat
from operator import is_, not_
from typing import Any

MARKER = "\n[... {removed} characters removed by compaction-proxy ...]\n"


def is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def text_size(value: Any) -> int:
    """Characters of text in a JSON value (its keys and strings, at any depth): about what
    storing it costs, measured without serializing it. An object's keys (strings, as JSON's
    are) and its string members are summed in C; only its other members are looked into."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        members = value.values()
        strings = list(map(is_, map(type, members), repeat(str)))
        total = sum(map(len, value)) + sum(map(len, compress(members, strings)))
        for member in compress(members, map(not_, strings)):
            total += text_size(member)
        return total
    if isinstance(value, list):
        return sum(map(text_size, value))
    return 0


def text_of(content: Any) -> str | None:
    """The joined text of ``content``; None when it holds no text form (null, an object)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if is_text_part(p))
    return None


def safe_cut(text: str, index: int) -> int:
    """``index``, moved back by one if it would separate a surrogate pair."""
    if 0 < index < len(text) and "\ud800" <= text[index - 1] <= "\udbff":
        return index - 1
    return index


def cut(content: Any, head_end: int, tail_start: int, marker_text: str = MARKER) -> Any:
    """``content`` with joined-text code points ``head_end..tail_start`` replaced by a marker
    (``marker_text``, formatted with ``removed``) saying how many were removed. Text parts
    left empty are dropped."""
    marker = marker_text.format(removed=tail_start - head_end)
    if isinstance(content, str):
        return content[:head_end] + marker + content[tail_start:]
    whole = text_of(content) or ""
    parts: list[Any] = []
    offset = 0
    for part in content:
        if not is_text_part(part):
            parts.append(part)
            continue
        start, end = offset, offset + len(part["text"])
        offset = end
        kept = whole[start : min(end, head_end)]
        if start <= head_end < end:
            kept += marker
        kept += whole[max(start, tail_start) : end] if end > tail_start else ""
        if kept:
            parts.append({**part, "text": kept})
    return parts


def marked_length(head_end: int, tail_start: int, total: int) -> int:
    """Code points left after ``cut``."""
    return head_end + (total - tail_start) + len(MARKER.format(removed=tail_start - head_end))
