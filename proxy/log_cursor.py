"""What this process last saw logged per conversation, so that a request sends the store only
what may be new: the body messages after the known tip, and its context only when it changed.

Only a hint: the store deduplicates by chain hash anyway, and a request whose hint turns out
wrong (another branch, a wiped store) logs the rest in one more round trip.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Cursor:
    tip: tuple[int, str] | None = None
    context: str | None = None


def log_is_contiguous(
    chain: Sequence[str], previous_tip: tuple[int, str] | None, start: int
) -> bool:
    """Whether the store's log already held this request's body before ``start``: its tip
    before the append lay on this request's chain at or beyond ``start - 1``."""
    if start == 0:
        return True
    if previous_tip is None:
        return False
    position, tip_hash = previous_tip
    return start - 1 <= position < len(chain) and chain[position] == tip_hash


class LogCursors:
    def __init__(self, size: int = 100_000) -> None:
        self._cursors: OrderedDict[str, Cursor] = OrderedDict()
        self._size = size

    def get(self, conversation: str) -> Cursor:
        cursor = self._cursors.get(conversation)
        if cursor is None:
            return Cursor()
        self._cursors.move_to_end(conversation)
        return cursor

    def set(self, conversation: str, cursor: Cursor) -> None:
        self._cursors[conversation] = cursor
        self._cursors.move_to_end(conversation)
        if len(self._cursors) > self._size:
            self._cursors.popitem(last=False)
