"""Rescue: a request whose live turn alone cannot fit the window (pure).

A 128k-character tool output in an 8k window, or an observation-style agent pasting 41k
characters: no compaction of the history makes such a request fit, and sent as it is the
upstream refuses it, every time the agent retries. The one exception to "the live turn reaches
the model as sent" is made here, and only when the alternative is that certain error: the live
turn's largest observations are cut to a head and a tail, only as far as it takes to fit, each
marked with the size cut and a suggestion to run a narrower command.

Observations are tool (and legacy function) results, and, in a live turn that holds none, the
user messages an observation-style agent returns its outputs in, by the evidence of the
conversation (``conversation.agent_outputs``; when the pruner counts user messages at all). A
person's words are never cut: the task, a lone user message, a pasted document, a user message
beside tool results. A request whose live turn is a person's and cannot fit goes as it came, and
the client gets the upstream's own overflow error. The cuts are this request's alone: the next
request, where the observation is history, prunes it as usual.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_proxy.compaction.prune import PruneCandidate, PrunedContent, Pruner
from compaction_proxy.conversation.messages import Message, task_position
from compaction_proxy.conversation.surface import SurfaceNode
from compaction_proxy.conversation.text import cut, safe_cut, text_of

RESCUE_MARKER = (
    "\n[... {removed} characters of this output were cut by compaction-proxy: whole, it does not "
    "fit the model's context window. Run a narrower command (grep, head, tail, a line range) to "
    "see what is needed ...]\n"
)
MIN_KEPT_CHARS = 512  # an observation is never cut below this
HEAD_SHARE = 0.75
_OVERSHOOT = 1.1  # characters per token vary inside one output: cut a little more than priced


def _observations(
    nodes: Sequence[SurfaceNode], body: Sequence[Message], live_start: int, pruner: Pruner
) -> list[int]:
    live = [n.start for n in nodes if n.kind == "body" and n.start is not None]
    live = [p for p in live if p >= live_start]
    results = [p for p in live if body[p].get("role") in ("tool", "function")]
    if results or not pruner.user_messages:
        return results
    task = task_position(body)
    return [p for p in live if pruner.may_cut(body, p, task)]


def rescuable(
    nodes: Sequence[SurfaceNode], body: Sequence[Message], live_start: int, pruner: Pruner
) -> bool:
    """Whether the live turn holds an observation a rescue could cut (else nothing is worth
    doing for a live turn that cannot fit: not even compacting the history)."""
    return any(
        len(text_of(body[p].get("content")) or "") > 2 * MIN_KEPT_CHARS
        for p in _observations(nodes, body, live_start, pruner)
    )


def rescue_cuts(
    nodes: Sequence[SurfaceNode],
    body: Sequence[Message],
    live_start: int,
    pruner: Pruner,
    tokens: Callable[[Message], int],
    need: int,
) -> list[PruneCandidate] | None:
    """Cuts of the live turn's observations, largest first, that save at least ``need`` tokens,
    each only as far as still needed; None when cutting them all cannot. ``nodes`` is the
    surface, ``body`` the client's messages, ``tokens`` prices a message; nothing is mutated."""
    by_size = sorted(
        _observations(nodes, body, live_start, pruner),
        key=lambda p: len(text_of(body[p].get("content")) or ""),
        reverse=True,
    )
    cuts: list[PruneCandidate] = []
    remaining = need
    for position in by_size:
        if remaining <= 0:
            break
        message = body[position]
        whole = text_of(message.get("content")) or ""
        total, price = len(whole), tokens(message)
        if total <= 2 * MIN_KEPT_CHARS or price <= 0:
            continue
        remove = int(remaining * total / price * _OVERSHOOT) + len(RESCUE_MARKER) + 16
        keep = max(MIN_KEPT_CHARS, total - remove)
        head_end = safe_cut(whole, int(keep * HEAD_SHARE))
        tail_start = max(head_end, safe_cut(whole, total - (keep - head_end)))
        content = cut(message.get("content"), head_end, tail_start, RESCUE_MARKER)
        after = len(text_of(content) or "")
        cuts.append(
            PruneCandidate(position, PrunedContent(content, total, after, head_end, tail_start))
        )
        remaining -= price - tokens({**message, "content": content})
    return cuts if cuts and remaining <= 0 else None
