"""Replacement records as the Redis store reads them back: parsed once per stored form, and
read tolerantly (``conversation.replacements.record_from_dict``): one this version cannot read
is skipped, counted and logged once while it is remembered."""

from __future__ import annotations

import logging
from collections import OrderedDict

from compaction_proxy.conversation.replacements import (
    ReplacementRecord,
    UnreadableRecord,
    record_from_dict,
    record_to_dict,
)
from compaction_proxy.metrics import UNREADABLE_RECORDS
from compaction_proxy.parsing import jsonio

log = logging.getLogger(__name__)


class ParsedRecords:
    """Records as parsed, by their stored JSON: a compacted conversation loads the same few
    records (summaries of several KiB) on every request, and they are parsed once. Bounded by
    the characters held, least recently used first out. Records are immutable, and the
    in-process store hands the same objects to every request too."""

    def __init__(self, max_chars: int = 16 * 1024 * 1024) -> None:
        self._parsed: OrderedDict[str, ReplacementRecord | None] = OrderedDict()
        self._stored: dict[int, str] = {}  # id(record) -> its stored form, while it is held
        self._chars = 0
        self._max_chars = max_chars

    def __call__(self, raw: str) -> ReplacementRecord | None:
        """The record stored as ``raw``; None (counted and logged when first met) when this
        version cannot read it, so it never takes its conversation down."""
        if raw in self._parsed:
            found = self._parsed.pop(raw)  # and put back last: the most recently used
        else:
            found = _read_record(raw)
            self._chars += len(raw)
        self._parsed[raw] = found
        if found is not None:
            self._stored[id(found)] = raw
        while self._chars > self._max_chars and self._parsed:
            evicted, record = self._parsed.popitem(last=False)
            self._chars -= len(evicted)
            if record is not None:
                self._stored.pop(id(record), None)
        return found

    def stored_form(self, record: ReplacementRecord) -> str:
        """How ``record`` is stored: as it was read (a newer version's fields and all, so a
        commit that supersedes it removes it), else as this version writes it."""
        held = self._stored.get(id(record))
        if held is not None and self._parsed.get(held) is record:
            return held
        return jsonio.dumps(record_to_dict(record)).decode()


def _read_record(raw: str) -> ReplacementRecord | None:
    try:
        return record_from_dict(jsonio.loads(raw))
    except (UnreadableRecord, ValueError) as exc:
        UNREADABLE_RECORDS.inc()
        log.warning("a stored replacement record cannot be read, and is skipped: %s", exc)
        return None
