"""Model-free pruning of oversized tool results (pure).

A ``tool`` message whose text exceeds ``threshold_chars`` Unicode code points keeps its first
``head_chars`` and last ``tail_chars`` code points around a marker saying how many were removed.
In a content list the text parts are treated as one text; non-text parts keep their place.
A cut never falls inside a UTF-16 surrogate pair. Inputs are never mutated.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from proxy.conversation import Message

MARKER = "\n[... {removed} characters removed by compaction-proxy ...]\n"


@dataclass(frozen=True)
class Pruner:
    threshold_chars: int = 8192
    head_chars: int = 4096
    tail_chars: int = 1024

    def __post_init__(self) -> None:
        if self.threshold_chars <= 0 or self.head_chars < 0 or self.tail_chars < 0:
            raise ValueError("pruner sizes must be positive (threshold) or non-negative")
        if self.head_chars + self.tail_chars >= self.threshold_chars:
            raise ValueError("head_chars + tail_chars must be below threshold_chars")


@dataclass(frozen=True)
class PrunedContent:
    content: Any
    chars_before: int
    chars_after: int


@dataclass(frozen=True)
class PruneCandidate:
    """Body ``position`` of a tool message and its pruned content."""

    position: int
    pruned: PrunedContent


def _is_high_surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udbff"


def _safe_cut(text: str, index: int) -> int:
    """Move ``index`` back by one if it would separate a surrogate pair."""
    if 0 < index < len(text) and _is_high_surrogate(text[index - 1]):
        return index - 1
    return index


def _text_parts(content: Any) -> list[str] | None:
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):
        return [p["text"] for p in content if _is_text_part(p)]
    return None


def _is_text_part(part: Any) -> bool:
    return (
        isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
    )


def prune_content(content: Any, pruner: Pruner) -> PrunedContent | None:
    """The pruned form of one tool message's content, or None if it is within the threshold."""
    parts = _text_parts(content)
    if parts is None:
        return None
    whole = "".join(parts)
    total = len(whole)
    if total <= pruner.threshold_chars:
        return None
    head_end = _safe_cut(whole, pruner.head_chars)
    tail_start = _safe_cut(whole, total - pruner.tail_chars)
    marker = MARKER.format(removed=tail_start - head_end)
    kept_total = head_end + (total - tail_start) + len(marker)

    if isinstance(content, str):
        return PrunedContent(whole[:head_end] + marker + whole[tail_start:], total, kept_total)

    pruned_parts: list[Any] = []
    offset = 0
    for part in content:
        if not _is_text_part(part):
            pruned_parts.append(part)
            continue
        start, end = offset, offset + len(part["text"])
        offset = end
        kept = whole[start : min(end, head_end)]
        if start <= head_end < end:
            kept += marker
        kept += whole[max(start, tail_start) : end] if end > tail_start else ""
        if kept:
            pruned_parts.append({**part, "text": kept})
    return PrunedContent(pruned_parts, total, kept_total)


def prune_candidates(
    positions: Sequence[int], messages: Sequence[Message], pruner: Pruner
) -> list[PruneCandidate]:
    """Prunes for the ``tool`` messages among ``messages`` (body ``positions[i]`` each)."""
    candidates: list[PruneCandidate] = []
    for position, message in zip(positions, messages, strict=True):
        if message.get("role") != "tool":
            continue
        pruned = prune_content(message.get("content"), pruner)
        if pruned is not None:
            candidates.append(PruneCandidate(position, pruned))
    return candidates
