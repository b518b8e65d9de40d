"""The meter's anchor: what the upstream reported for a surface it answered (pure data)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

import orjson

from compaction_proxy.frozen import frozen


@frozen
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

    @classmethod
    def read(cls, stored: str | bytes) -> Anchor | None:
        """The anchor as stored by this version or another (fields it does not know are
        ignored); None when it cannot be read: the next measurement is an estimate, and the
        next answer stores a new anchor."""
        try:
            data: Any = orjson.loads(stored)
            if not data.keys() <= _FIELDS:  # most anchors: this version's, every field known
                data = {k: v for k, v in data.items() if k in _FIELDS}
            anchor = cls(**data)
        except (orjson.JSONDecodeError, AttributeError, TypeError):
            return None
        # Counts are JSON integers, not bools: exact types, compared at once (every load).
        counts = (type(anchor.tip), type(anchor.prompt_tokens), type(anchor.estimated_tokens))
        if counts != (int, int, int):
            return None
        return anchor if isinstance(anchor.key, str) and isinstance(anchor.tip_hash, str) else None


_FIELDS = frozenset(f.name for f in fields(Anchor))
