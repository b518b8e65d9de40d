"""An anchor read back from what any version stored, or nothing when it cannot be."""

from __future__ import annotations

import pytest

from compaction_proxy.metering.anchor import Anchor

WHOLE = '{"key": "k", "tip": 3, "prompt_tokens": 900, "estimated_tokens": 870, "tip_hash": "h"}'


@pytest.mark.parametrize(
    ("stored", "read"),
    [
        (WHOLE, Anchor("k", 3, 900, 870, "h")),
        # An older version's, before the tip's hash; a newer one's field is ignored.
        ('{"key": "k", "tip": 3, "prompt_tokens": 9, "estimated_tokens": 8}', Anchor("k", 3, 9, 8)),
        (WHOLE[:-1] + ', "later": [1]}', Anchor("k", 3, 900, 870, "h")),
        (WHOLE.replace('"tip": 3', '"tip": true'), None),  # a bool is no count
        (WHOLE.replace("900", "900.0"), None),
        (WHOLE.replace('"key": "k", ', ""), None),
        (WHOLE.replace('"h"', "7"), None),
        ("[1, 2]", None),
        ("{", None),
    ],
)
def test_an_anchor_reads_back_only_with_every_count_an_integer(
    stored: str, read: Anchor | None
) -> None:
    assert Anchor.read(stored) == read
