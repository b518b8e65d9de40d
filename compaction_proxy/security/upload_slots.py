"""Streamed uploads a client may hold open at once (pure accounting).

A relayed body the proxy does not read first (a multipart upload) holds an upstream connection
for as long as the client takes to send it. A client is whoever holds one API key (a digest of
it, never the key), else one address; past ``per_client`` uploads at once, it is refused.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


def client_of(api_key: str, address: str | None) -> str:
    """Names a client for the count, without keeping its key."""
    if api_key:
        return "key:" + hashlib.blake2b(api_key.encode(), digest_size=16).hexdigest()
    return f"address:{address or ''}"


@dataclass
class UploadSlots:
    per_client: int = 4
    _open: Counter[str] = field(default_factory=Counter)

    @contextmanager
    def held(self, client: str) -> Iterator[bool]:
        """Holds one of ``client``'s slots while the body streams; yields False (holding
        none) when the client already holds ``per_client``."""
        if self._open[client] >= self.per_client:
            yield False
            return
        self._open[client] += 1
        try:
            yield True
        finally:
            self._open[client] -= 1
            if self._open[client] <= 0:
                del self._open[client]
