"""``X-Compaction-Status`` tells what was forwarded, whoever made the replacements in it."""

from __future__ import annotations

import pytest

from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.service.forwarded import RequestStatus, status_of

CHECKPOINT = Checkpoint(0, 3, "root", "h3", {"role": "user", "content": "summary"}, tokens=5)
PRUNE = Prune(5, "h5", "cut")
MASK = Prune(7, "h7", "[cleared]", masked=True)


@pytest.mark.parametrize(
    ("checkpoints", "prunes", "status"),
    [
        ((), (), RequestStatus.NONE),
        ((), (PRUNE,), RequestStatus.PRUNED),
        ((CHECKPOINT,), (), RequestStatus.COMPACTED),
        ((CHECKPOINT,), (PRUNE,), RequestStatus.COMPACTED),
        ((), (MASK,), RequestStatus.MASKED),
        ((), (PRUNE, MASK), RequestStatus.MASKED),
        ((CHECKPOINT,), (MASK,), RequestStatus.COMPACTED),
    ],
)
def test_the_status_names_what_the_forwarded_surface_carries(
    checkpoints: tuple[Checkpoint, ...], prunes: tuple[Prune, ...], status: RequestStatus
) -> None:
    assert status_of(Surface(nodes=[], checkpoints=checkpoints, prunes=prunes)) is status
