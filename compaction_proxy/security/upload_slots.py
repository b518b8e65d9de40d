"""Streamed uploads held open at once (pure accounting).

A relayed body the proxy does not read first (a multipart upload) holds an upstream connection
of the relay pool for as long as the client takes to send it. Three bounds keep that pool
serving everyone:

* per client: whoever holds one API key (a digest of it, never the key), else one address;
* per source address, whatever keys it sends: a client inventing a key per upload is still
  one address;
* in total, below the relay pool's size: the rest of the pool stays free for the requests that
  are not uploads (file lists, downloads, batches), so no trickle of uploads starves them.

Past a client's or an address's bound, the upload is refused with 429; past the total, with
503 and a ``Retry-After``: the proxy's own pool is full, not the upstream.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum


class SlotRefusal(Enum):
    CLIENT = "client"  # the client holds its bound
    ADDRESS = "address"  # its source address holds its bound
    POOL = "pool"  # every upload slot of the relay pool is held


def client_of(api_key: str, address: str | None) -> str:
    """Names a client for the count, without keeping its key."""
    if api_key:
        return "key:" + hashlib.blake2b(api_key.encode(), digest_size=16).hexdigest()
    return f"address:{address or ''}"


@dataclass
class UploadSlots:
    per_client: int = 4
    per_address: int = 16
    total: int = 48
    _open: Counter[str] = field(default_factory=Counter)
    _held: int = 0

    def _refusal(self, client: str, source: str) -> SlotRefusal | None:
        if self._open[client] >= self.per_client:
            return SlotRefusal.CLIENT
        if self._open[source] >= self.per_address:
            return SlotRefusal.ADDRESS
        if self._held >= self.total:
            return SlotRefusal.POOL
        return None

    @contextmanager
    def held(self, client: str, address: str | None) -> Iterator[SlotRefusal | None]:
        """Holds one slot of ``client``, of its ``address`` and of the pool while the body
        streams; yields None when held, else why none is (holding nothing)."""
        source = "from:" + (address or "")
        refusal = self._refusal(client, source)
        if refusal is not None:
            yield refusal
            return
        self._open[client] += 1
        self._open[source] += 1
        self._held += 1
        try:
            yield None
        finally:
            self._held -= 1
            for name in (client, source):
                self._open[name] -= 1
                if self._open[name] <= 0:
                    del self._open[name]
