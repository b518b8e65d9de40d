"""The records a prune or a mask commits (pure): addressed by the job's chain at their body
position and bound to the instructions they were made under (``context``), so a later request
applies them only where the same message follows the same history. A mask is a ``Prune`` with
``masked`` set and its placeholder as content: a version that knows nothing of masks sends the
placeholder too."""

from __future__ import annotations

from collections.abc import Sequence

from compaction_proxy.compaction.masking import MaskCandidate
from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.compaction.prune import PruneCandidate
from compaction_proxy.conversation.replacements import Prune


def prune_records(job: CompactionJob, candidates: Sequence[PruneCandidate]) -> list[Prune]:
    """The prune records of ``candidates``, addressed by ``job``'s chain and context."""
    view = job.view
    return [
        Prune(
            position=c.position,
            hash=view.chain[c.position],
            content=c.pruned.content,
            chars_before=c.pruned.chars_before,
            chars_after=c.pruned.chars_after,
            head_end=c.pruned.head_end,
            tail_start=c.pruned.tail_start,
            context=view.context_fingerprint,
        )
        for c in candidates
    ]


def mask_records(job: CompactionJob, candidates: Sequence[MaskCandidate]) -> list[Prune]:
    """The mask records of ``candidates`` (``masking.py``), addressed like prunes."""
    view = job.view
    return [
        Prune(
            position=c.position,
            hash=view.chain[c.position],
            content=c.placeholder,
            chars_before=c.chars_before,
            chars_after=len(c.placeholder),
            context=view.context_fingerprint,
            masked=True,
        )
        for c in candidates
    ]
