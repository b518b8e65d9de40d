"""Log stream entries as Redis keeps them (pure): ``e`` with the event's JSON, or ``z`` with
that JSON zstd-compressed on its own, as the version before packed segments wrote events of
``MIN_PACKED`` bytes or more that zstd shrank (``store.log_segments`` packs runs of events
instead). Reading takes either field, so every log read alike; ``packed`` is that version's
writing side, kept so that the tests can write such a log.

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
