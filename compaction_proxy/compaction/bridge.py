"""The bridge: how a request goes at once while its checkpoint is still to come (pure).

With precompaction on, a request at or over ``must_compact`` cannot go as it is (its answer
might not fit), and without a bridge it waits for the summary round in flight, or runs one:
the seconds of a summary call, the freeze precompaction is there to avoid. Conversations do
outgrow a summary call: a 3 s call spans three agent turns, and one tool output can be a sixth
of a small window.

The bridge cuts the conversation's older observations, those before the retain budget and,
while a summary is being written for the branch, inside its span (the part the coming
checkpoint replaces), harder than the pruner does: oldest first, only as many as it takes to go
under ``must_compact``. The cuts are this request's alone and are never committed: the request
after the checkpoint forwards the checkpoint (which shadows every cut) and the retained tail in
full, and the summary is written from the observations as they were. A cut outside the span
would go out whole again once the checkpoint lands, and a provider's prompt cache would miss
twice for it. The live turn and the
retain budget are never cut; a request that no such cut brings under ``must_compact`` waits
as before. The same request is cut the same way by every replica, and consecutive requests
cut the same oldest observations first, so the provider's prefix cache holds between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

from compaction_proxy.compaction.prune import PruneCandidate, Pruner, prune_content
from compaction_proxy.conversation.messages import Message, task_position
from compaction_proxy.conversation.surface import SurfaceNode


class BridgeCuts(NamedTuple):
    cuts: list[PruneCandidate]
    saved: int  # tokens, as ``tokens`` priced the messages before and after


def bridge_cuts(
    nodes: Sequence[SurfaceNode],
    body: Sequence[Message],
    before: int,
    pruner: Pruner,
    tokens: Callable[[Message], int],
    need: int,
) -> BridgeCuts | None:
    """The fewest cuts, oldest first, of observations at body positions before ``before``
    that save at least ``need`` tokens; None when all of them together save less.

    ``nodes`` is the surface (a node already pruned is cut again, from the message as the
    client sent it, ``body``); ``tokens`` prices a message. Inputs are never mutated."""
    cuts: list[PruneCandidate] = []
    saved = 0
    task = task_position(body)
    for node in nodes:
        if saved >= need:
            break
        position = node.start
        if node.kind not in ("body", "pruned") or position is None or position >= before:
            continue
        original = body[position]
        if not pruner.may_cut(body, position, task):
            continue
        cut = prune_content(original.get("content"), pruner)
        if cut is None:
            continue
        saving = tokens(node.message) - tokens({**original, "content": cut.content})
        if saving > 0:
            cuts.append(PruneCandidate(position, cut))
            saved += saving
    return BridgeCuts(cuts, saved) if saved >= need else None
