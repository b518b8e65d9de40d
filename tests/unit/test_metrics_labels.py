"""The metrics' closed label sets name what the code can report, all of it."""

from __future__ import annotations

from compaction_proxy.formats.usage import PromptCacheUse
from compaction_proxy.formats.wire_formats import WIRE_FORMATS
from compaction_proxy.metrics import FORMATS, PROMPT_CACHE_KINDS, STATUSES
from compaction_proxy.service.forwarded import RequestStatus


def test_the_format_counter_knows_every_status_and_every_api() -> None:
    assert set(STATUSES) == {status.value for status in RequestStatus}
    assert set(FORMATS) == set(WIRE_FORMATS)


def test_the_cache_counter_labels_each_part_of_the_split_in_its_order() -> None:
    assert PromptCacheUse._fields == PROMPT_CACHE_KINDS
