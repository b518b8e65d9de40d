"""Redis key shapes, all in one place.

Every key of one conversation carries the hash tag ``{<conversation>}``, so a script touching
several of them stays in one Redis Cluster slot.
"""

from __future__ import annotations

from typing import Literal, get_args

PREFIX = "cp"


# The kinds of a conversation's keys, each ``cp:{<conversation>}:<kind>``:
# - log: Stream of the newest events, field "e" = JSON, or "z" = zstd-compressed JSON as
#   earlier versions wrote (packed_events); older events are packed (log_segments)
# - segments: List of the packed segments' index lines, oldest first (log_segments.Segment);
#   each segment's zstd frames are a String of their own (segment_key_prefix)
# - packing: String, a caller's claim to read the log back and pack it
# - seen: Set of the keys of the messages already logged, as earlier versions kept them: read,
#   not written (now in Sets of integers: seen_key_prefix)
# - state: Hash of generation, anchor (JSON), tip, attributes
# - records: List of replacement records (JSON) as versions before anchoring wrote them: read,
#   and emptied as they are superseded, never written
# - anchored: Hash "<position>:<hash>" -> the records anchored there (see lua/branches.lua)
# - positions: Hash position -> how many anchors there
# - used: Sorted set of anchors by when a request last reached them
# - leases: Hash owner -> "<position>:<hash>:<expires ms>"
KeyKind = Literal[
    "log",
    "segments",
    "packing",
    "seen",
    "state",
    "records",
    "anchored",
    "positions",
    "used",
    "leases",
]
KEY_KINDS: tuple[KeyKind, ...] = get_args(KeyKind)


def keys_of(conversation: str, *kinds: KeyKind) -> list[str]:
    """The keys of ``kinds`` for one conversation, in that order (built per request: no
    mapping of every kind is made for the few a script takes)."""
    tag = f"{PREFIX}:{{{conversation}}}:"
    return [*map(tag.__add__, kinds)]


def conversation_keys(conversation: str) -> dict[KeyKind, str]:
    """Every key of one conversation, by kind."""
    return dict(zip(KEY_KINDS, keys_of(conversation, *KEY_KINDS), strict=True))


def seen_key_prefix(conversation: str) -> str:
    """The start of the keys of a conversation's Sets of seen message keys (``lua/log.lua``
    ends each with a kind and a bucket)."""
    return f"{PREFIX}:{{{conversation}}}:seen:"


def segment_key_prefix(conversation: str) -> str:
    """The start of the key of each of a conversation's log segments; its index line's token
    ends it."""
    return f"{PREFIX}:{{{conversation}}}:segment:"


def secret_key(name: str) -> str:
    return f"{PREFIX}:secret:{name}"


def conversations_key() -> str:
    """Sorted set of conversation ids by last activity (for the admin listing)."""
    return f"{PREFIX}:conversations"


def quota_key(name: str) -> str:
    """Sorted set of one quota's recent calls (e.g. a tenant's summary calls). All quota keys
    share the hash tag ``{quota}``, so one script can take several at once."""
    return f"{PREFIX}:{{quota}}:{name}"


def owner_key(object_id: str) -> str:
    """String: the tenant that created upstream object ``object_id`` through the proxy (with a
    PX expiry). Keys of different objects may lie in different Cluster slots: read and written
    one command each, pipelined."""
    return f"{PREFIX}:owner:{object_id}"
