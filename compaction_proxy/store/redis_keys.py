"""Redis key shapes, all in one place.

Every key of one conversation carries the hash tag ``{<conversation>}``, so a script touching
several of them stays in one Redis Cluster slot.
"""

from __future__ import annotations

PREFIX = "cp"


def conversation_keys(conversation: str) -> dict[str, str]:
    tag = f"{PREFIX}:{{{conversation}}}"
    return {
        "log": f"{tag}:log",  # Stream of events, field "e" = JSON
        "seen": f"{tag}:seen",  # Set of chain hashes already logged as messages
        "state": f"{tag}:state",  # Hash: generation, anchor (JSON), tip, attributes
        "records": f"{tag}:records",  # List of replacement records (JSON), in commit order
        "lease": f"{tag}:lease",  # String: owner token, with a PX expiry
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
