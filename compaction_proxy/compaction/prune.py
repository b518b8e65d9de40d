"""Model-free pruning of oversized observations (pure).

An observation is what the outside world told the model: a ``tool`` or legacy ``function``
result, and (when the policy says so) a ``user`` message in which an agent without native tool
calling returned a command's output (``conversation.agent_outputs``: by the evidence of the
conversation; a person's words are never cut). One whose text exceeds ``threshold_chars`` Unicode
code points keeps its first ``head_chars`` and last ``tail_chars`` around a marker saying how
many were removed. In a content list the text parts are treated as one text; non-text parts
keep their place. A ``<compacted-summary>`` checkpoint is never pruned, nor the task (the first
user message: ``messages.task_position``), and callers never offer the live turn. Inputs are
never mutated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.agent_outputs import is_agent_output
from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import MARKER, cut, marked_length, safe_cut, text_of
from compaction_proxy.frozen import frozen

__all__ = ["MARKER", "PruneCandidate", "PrunedContent", "Pruner", "prune_candidates"]

SUMMARY_TAG = "<compacted-summary>"


@frozen
class Pruner:
    threshold_chars: int = 8192
    head_chars: int = 4096
    tail_chars: int = 1024
    # User messages an observation-style agent returns its outputs in count as observations
    # (``conversation.agent_outputs``); a person's words never do.
    user_messages: bool = True

    def __post_init__(self) -> None:
        if self.threshold_chars <= 0 or self.head_chars < 0 or self.tail_chars < 0:
            raise ValueError("pruner sizes must be positive (threshold) or non-negative")
        if self.head_chars + self.tail_chars >= self.threshold_chars:
            raise ValueError("head_chars + tail_chars must be below threshold_chars")

    def observes(self, message: Message, previous: Message | None) -> bool:
        """Whether ``message`` (after ``previous`` in the body) is an observation this pruner
        may cut: a tool or function result, or an agent's output returned as a user
        message, never a person's words."""
        role = message.get("role")
        if role in ("tool", "function"):
            return True
        return self.user_messages and is_agent_output(message, previous)

    def may_cut(self, body: Sequence[Message], position: int, task: int | None) -> bool:
        """Whether the message at ``body[position]`` is an observation to cut: never the task
        (body position ``task``), however long, however user messages count."""
        previous = body[position - 1] if position > 0 else None
        return position != task and self.observes(body[position], previous)


@frozen
class PrunedContent:
    """The pruned content, and the joined-text offsets it was cut at (``head_end`` up to
    ``tail_start`` removed), so the same cut can be applied to a resent copy of the message."""

    content: Any
    chars_before: int
    chars_after: int
    head_end: int
    tail_start: int


@frozen
class PruneCandidate:
    """Body ``position`` of an observation and its pruned content."""

    position: int
    pruned: PrunedContent


def prune_content(content: Any, pruner: Pruner) -> PrunedContent | None:
    """The pruned form of one message's content, or None if it is within the threshold (or is
    a checkpoint, or holds no text)."""
    whole = text_of(content)
    if whole is None:
        return None
    total = len(whole)
    if total <= pruner.threshold_chars or SUMMARY_TAG in whole:
        return None
    head_end = safe_cut(whole, pruner.head_chars)
    tail_start = safe_cut(whole, total - pruner.tail_chars)
    return PrunedContent(
        cut(content, head_end, tail_start),
        total,
        marked_length(head_end, tail_start, total),
        head_end,
        tail_start,
    )


def prune_candidates(
    positions: Sequence[int],
    messages: Sequence[Message],
    pruner: Pruner,
    task: int | None,
    body: Sequence[Message],
) -> list[PruneCandidate]:
    """Prunes for the observations among ``messages`` (body ``positions[i]`` each, of the
    client's ``body``), the task (body position ``task``) left whole."""
    candidates: list[PruneCandidate] = []
    for position, message in zip(positions, messages, strict=True):
        if not pruner.may_cut(body, position, task):
            continue
        pruned = prune_content(message.get("content"), pruner)
        if pruned is not None:
            candidates.append(PruneCandidate(position, pruned))
    return candidates
