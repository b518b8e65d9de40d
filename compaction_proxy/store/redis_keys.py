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
        "packed": f"{tag}:packed",  # List of the packed segments' zstd frames, oldest first
        "segments": f"{tag}:segments",  # List of their index lines (log_segments.Segment)
        "packing": f"{tag}:packing",  # String: a caller's claim to read the log back and pack it
        # Hash of 16 buckets: the keys of the messages already logged (lua/log.lua)
        "seen_keys": f"{tag}:seen_keys",
        "seen": f"{tag}:seen",  # Set of the same, as earlier versions kept it: read, not written
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
