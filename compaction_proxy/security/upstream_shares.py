"""Requests one client has upstream at once: its share of the upstream pool.

Every chat, Responses and Messages request goes upstream through one connection pool
(``upstream_pool_size``), and a streamed answer holds its connection for as long as the model
writes, or the client takes to read it. A client with more requests in flight than the pool
has connections (an agent farm on one key, or a client that reads slowly on purpose) would
leave every other client's requests queued behind its own. So one client (whoever holds one
API key, else one address: ``upload_slots.client_of``) holds at most ``share`` of them; its
requests past that wait for one of its own to end, never for another client's.

Waiting, not refusing: sent directly, a client's own concurrency is its provider's to limit,
and the proxy must not answer it with errors it would not get there.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class UpstreamShares:
    """At most ``share`` requests of one client upstream at once; the rest wait in turn."""

    def __init__(self, share: int) -> None:
        self._share = share
        self._gates: dict[str, asyncio.Semaphore] = {}
        self._users: Counter[str] = Counter()  # requests holding or awaiting each gate

    @property
    def clients(self) -> int:
        """Clients with a request upstream or waiting (a gate is kept only while used)."""
        return len(self._gates)

    def would_wait(self, client: str) -> bool:
        gate = self._gates.get(client)
        return gate is not None and gate.locked()

    @asynccontextmanager
    async def held(self, client: str) -> AsyncIterator[None]:
        gate = self._gates.get(client)
        if gate is None:
            gate = self._gates[client] = asyncio.Semaphore(self._share)
        self._users[client] += 1
        try:
            async with gate:
                yield
        finally:
            self._users[client] -= 1
            if not self._users[client]:
                del self._users[client]
                del self._gates[client]
