"""The meter's anchor: what the upstream reported for a surface it answered (pure data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Anchor:
    """Upstream usage for a forwarded surface: ``prompt_tokens`` for the surface up to body
    position ``tip``, named (with its head, tools and replacements) by ``key``."""

    key: str
    tip: int
    prompt_tokens: int
    estimated_tokens: int
    tip_hash: str = ""  # the body chain hash at ``tip`` (empty in anchors stored before it)

    def answered(self, chain: Sequence[str]) -> bool:
        """Whether a body of ``chain`` extends (or is) the one the upstream answered."""
        return (
            bool(self.tip_hash) and 0 <= self.tip < len(chain) and chain[self.tip] == self.tip_hash
        )
