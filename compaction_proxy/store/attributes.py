"""What a conversation keeps besides its log and records: one schema, read and written only
through ``ConversationAttributes``.

Stored as flat strings (a Redis hash's fields beside the conversation's generation and anchor;
a dict in the in-process store), so the stored names and formats below are a contract with
every replica that shares the store: they never change meaning. Reading is tolerant: an
unknown field is ignored and a value that does not parse reads as unknown (``None``), so a
newer or older replica's writes never take a conversation down.

A write names only the fields it sets (the others are ``None`` and left as stored): the
request path writes the request's attributes with its record, the engine its failures.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import StrEnum
from itertools import compress, repeat
from operator import is_not
from typing import Any

from compaction_proxy.frozen import frozen


class ShortfallReason(StrEnum):
    """Why a request went at or above its threshold (the ``reason`` label of
    ``compaction_proxy_over_threshold_total``, and the last one a conversation saw)."""

    BELOW_THRESHOLD = ""  # stored once a request is back under its threshold
    AHEAD = "ahead"  # between the watermarks: a checkpoint is being prepared in the background
    SOFT_TARGET = "soft_target"  # over a soft target only: compacted where it pays
    LIVE_TURN = "live_turn"
    NO_RANGE = "no_range"
    SUMMARY_FAILED = "summary_failed"
    NOT_SMALLER = "not_smaller"
    CEILING = "ceiling"
    BREAKER = "breaker"
    COOLDOWN = "cooldown"
    STOPPED = "stopped"
    BUSY = "busy"
    CHANGED = "changed"
    COMMIT_FAILED = "commit_failed"
    ROUNDS = "rounds"
    ERROR = "error"
    STORE = "store"


def _count(value: str) -> int | None:
    return int(value) if value.isascii() and value.isdigit() else None


def _seconds(value: str) -> float | None:
    try:
        number = float(value)
    except ValueError:
        return None
    return number if math.isfinite(number) else None


def _reason(value: str) -> ShortfallReason | None:
    try:
        return ShortfallReason(value)
    except ValueError:
        return None


@frozen
class ConversationAttributes:
    """Every attribute a conversation may keep; ``None`` is unknown (reading) or unchanged
    (writing). Field names are the stored names."""

    tenant: str | None = None  # HMAC of the client key (security.tenant)
    session: str | None = None  # the client's own name for the conversation
    model: str | None = None  # the model of its last request
    context: str | None = None  # digest of the last request's head and tools
    last_seen: float | None = None  # seconds since the epoch
    last_pressure: float | None = None  # the last request's tokens over its window
    checkpoint_misses: int | None = None  # requests in a row that missed every checkpoint
    over_threshold: ShortfallReason | None = None  # the last request's shortfall
    largest_answer_tokens: int | None = None  # the most completion tokens of one answer
    compaction_failed_at: float | None = None  # the last failed summary (the cooldown's start)
    compaction_failed_tokens: int | None = None  # the request's tokens when it failed
    overflow_recovery_at: float | None = None  # the last overflow recovery of a miss-guarded one
    client_compactions: int | None = None  # summarization requests of the client's own

    @classmethod
    def read(cls, stored: Mapping[str, str]) -> ConversationAttributes:
        """The attributes as stored; unknown fields and unreadable values are left out."""
        # Text is stored as is: taken in C (a missing one reads as None, unknown); only the
        # fields held as numbers or names are parsed, those set alone.
        values = dict(zip(_TEXT_FIELDS, map(stored.get, _TEXT_FIELDS), strict=True))
        for name in _PARSERS.keys() & stored.keys():
            parsed = _PARSERS[name](stored[name])
            if parsed is not None:
                values[name] = parsed
        return _built(NO_ATTRIBUTES.__dict__, values)

    def to_stored(self) -> dict[str, str]:
        """The fields this holds, as stored (those that are ``None`` are left out)."""
        stored = dict(_set_fields(self))  # the text ones as they are
        for name in _FORMATS.keys() & stored.keys():
            stored[name] = _FORMATS[name](stored[name])
        return stored

    def updated(self, newer: ConversationAttributes) -> ConversationAttributes:
        """These attributes with every field ``newer`` sets written over them."""
        if newer is NO_ATTRIBUTES:
            return self
        return _built(self.__dict__, _set_fields(newer))

    @property
    def misses(self) -> int:
        return self.checkpoint_misses or 0


def _set_fields(attributes: ConversationAttributes) -> Iterator[tuple[str, Any]]:
    """The fields ``attributes`` sets (not ``None``), picked in C: a loop over the thirteen
    fields in Python cost more than what a request does with the few it sets."""
    fields = attributes.__dict__
    return compress(fields.items(), map(is_not, fields.values(), repeat(None)))


def _built(
    fields: Mapping[str, Any], written: Iterable[tuple[str, Any]] | Mapping[str, Any]
) -> ConversationAttributes:
    """Attributes with ``fields`` and ``written`` over them, values already of their types:
    filled in C rather than by ``__init__``, a store per field in Python (a request merges
    a few)."""
    built = object.__new__(ConversationAttributes)
    built.__dict__.update(fields)
    built.__dict__.update(written)
    return built


NO_ATTRIBUTES = ConversationAttributes()  # none known, none to write (frozen: one for all)
ATTRIBUTE_NAMES = tuple(f.name for f in dataclasses.fields(ConversationAttributes))
_TEXT_FIELDS = ("tenant", "session", "model", "context")
_PARSERS: dict[str, Callable[[str], Any]] = {
    "last_seen": _seconds,
    "last_pressure": _seconds,
    "checkpoint_misses": _count,
    "over_threshold": _reason,
    "largest_answer_tokens": _count,
    "compaction_failed_at": _seconds,
    "compaction_failed_tokens": _count,
    "overflow_recovery_at": _seconds,
    "client_compactions": _count,
}
_FORMATS: dict[str, Callable[[Any], str]] = {  # every field but the text ones
    "last_seen": lambda v: f"{v:.3f}",
    "last_pressure": lambda v: f"{v:.4f}",
    "compaction_failed_at": lambda v: f"{v:.3f}",
    "overflow_recovery_at": lambda v: f"{v:.3f}",
    "over_threshold": lambda v: str(v.value),
    "checkpoint_misses": str,
    "largest_answer_tokens": str,
    "compaction_failed_tokens": str,
    "client_compactions": str,
}
