"""Log events as Redis keeps them: zstd-compressed when that makes them smaller (pure).

A stream entry holds one field: ``e`` with the event's JSON as it was (what every version
before this one wrote, and what small events still are), or ``z`` with that JSON compressed by
zstd. Messages are most of what a conversation's log holds (tool outputs, file reads), text
that compresses several times over; an event under ``MIN_PACKED`` bytes, or one zstd would not
shrink, is kept as it was. Reading takes either field, so logs written by earlier versions, or
by a replica with ``log_compression`` off, read as before.

The Redis client decodes replies as UTF-8 with ``surrogateescape``, so a compressed field comes
back as a string that encodes to the very bytes stored.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from compaction_proxy.parsing import jsonio

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd

MIN_PACKED = 256  # smaller events are left as JSON: zstd's frame would eat the gain
LEVEL = 3  # zstd's default: hundreds of MB/s on one core, and most of the ratio
PLAIN, PACKED = "e", "z"


def packed(event_json: bytes) -> bytes | None:
    """``event_json`` compressed, when that is smaller; else None (stored as it is)."""
    if len(event_json) < MIN_PACKED:
        return None
    squeezed = zstd.compress(event_json, LEVEL)
    return squeezed if len(squeezed) < len(event_json) else None


def event_json(fields: Mapping[str, str]) -> bytes:
    """The event's JSON from a stream entry's fields, packed or not."""
    squeezed = fields.get(PACKED)
    if squeezed is not None:
        return zstd.decompress(squeezed.encode("utf-8", "surrogateescape"))
    return fields[PLAIN].encode("utf-8", "surrogateescape")


def read_event(fields: Mapping[str, str]) -> dict[str, Any]:
    """The event a stream entry holds (every event the proxy logs is a JSON object)."""
    event: dict[str, Any] = jsonio.loads(event_json(fields))
    return event
