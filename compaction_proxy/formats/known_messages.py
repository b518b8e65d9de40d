"""Messages this process has already validated and hashed, looked up by their bytes.

An agent resends its whole history on every request, so all but the newest messages of a
request were validated and hashed before, usually a second or a minute ago. Canonicalizing a
message in Python costs several microseconds; serializing the parsed object back with orjson
and looking the bytes up costs a fraction of that. So each message is serialized once
(``orjson.dumps``, in C) and only the messages this process has not seen go through validation
and ``message_digest``.

Invariants:

* A hit returns exactly what ``message_digest`` returns for the message: equal serialized bytes
  mean equal JSON values, so equal canonical forms. Digests never depend on this cache.
* Only messages that passed validation are remembered, so a hit may skip validation.
* The bytes held are bounded (``max_bytes``, least recently used first out); a message larger
  than a tenth of the bound is never held, and costs what it cost before.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

import orjson

from compaction_proxy.conversation.messages import Message, message_digest

# What one entry costs beyond its key's bytes (the dict slot, the key and digest objects).
_ENTRY_OVERHEAD = 200


class KnownMessages:
    """A bounded LRU from a message's serialized bytes to its digest; safe to use from the
    event loop and worker threads at once (a big request is parsed off the loop)."""

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        if max_bytes < 0:
            raise ValueError("max_bytes must not be negative")
        self.max_bytes = max_bytes
        self._digests: OrderedDict[bytes, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._digests)

    def digests(
        self, messages: Sequence[Message], validate: Callable[[Message, int], None]
    ) -> list[str]:
        """Every message's ``message_digest``; ``validate(message, index)`` runs for each
        message not seen before and may raise, in which case nothing of it is remembered."""
        digests: list[str] = []
        table = self._digests
        for index, message in enumerate(messages):
            key = _key(message)
            known = None
            if key is not None:
                known = table.get(key)
                if known is not None:
                    # Evicted by another thread just now? The digest in hand is still right.
                    # (try is cheaper than contextlib.suppress on this path: once a message.)
                    try:  # noqa: SIM105
                        table.move_to_end(key)
                    except KeyError:
                        pass
            if known is None:
                validate(message, index)
                known = message_digest(message)
                if key is not None:
                    self._put(key, known)
            digests.append(known)
        return digests

    def _put(self, key: bytes, digest: str) -> None:
        size = len(key) + _ENTRY_OVERHEAD
        if size * 10 > self.max_bytes:
            return
        with self._lock:
            if key in self._digests:
                return
            self._digests[key] = digest
            self._bytes += size
            while self._bytes > self.max_bytes and self._digests:
                evicted, _ = self._digests.popitem(last=False)
                self._bytes -= len(evicted) + _ENTRY_OVERHEAD


def _key(message: Message) -> bytes | None:
    """The message's bytes as orjson writes them, or None when orjson cannot (an integer
    beyond 64 bits, nesting deeper than it allows): such a message is simply not cached."""
    try:
        return orjson.dumps(message)
    except TypeError:
        return None
