"""Redis key shapes, all in one place.

Every key of one conversation carries the hash tag ``{<conversation>}``, so a script touching
several of them stays in one Redis Cluster slot.
"""

from __future__ import annotations

PREFIX = "cp"


def conversation_keys(conversation: str) -> dict[str, str]:
    tag = f"{PREFIX}:{{{conversation}}}"
    return {
        # Stream of the newest events, field "e" = JSON, or "z" = zstd-compressed JSON as
        # earlier versions wrote (packed_events); older events are packed (log_segments)
        "log": f"{tag}:log",
        # List of the packed segments' index lines, oldest first (log_segments.Segment); each
        # segment's zstd frame is a String of its own (segment_key)
        "segments": f"{tag}:segments",
        "packing": f"{tag}:packing",  # String: a caller's claim to read the log back and pack it
        # Set of the keys of the messages already logged, as earlier versions kept them: read,
        # not written (now in Sets of integers: seen_key_prefix)
        "seen": f"{tag}:seen",
        "state": f"{tag}:state",  # Hash: generation, anchor (JSON), tip, attributes
        # List of replacement records (JSON) as versions before anchoring wrote them: read,
        # and emptied as they are superseded, never written
        "records": f"{tag}:records",
        # Hash "<position>:<hash>" -> the records anchored there (see lua/branches.lua)
        "anchored": f"{tag}:anchored",
        "positions": f"{tag}:positions",  # Hash position -> how many anchors there
        "used": f"{tag}:used",  # Sorted set of anchors by when a request last reached them
        "leases": f"{tag}:leases",  # Hash owner -> "<position>:<hash>:<expires ms>"
    }


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
