"""Requests one client has upstream at once: its share of the upstream pool.

Every chat, Responses and Messages request goes upstream through one connection pool
(``upstream_pool_size``), and a streamed answer holds its connection for as long as the model
writes, or the client takes to read it. A client with more requests in flight than the pool
has connections (an agent farm on one key, or a client that reads slowly on purpose) would
leave every other client's requests queued behind its own. So one client (whoever holds one
API key, else one address) holds at most ``share`` of them; its requests past that wait for
one of its own to end, in turn, never for another client's.

Waiting, not refusing: sent directly, a client's own concurrency is its provider's to limit,
and the proxy must not answer it with errors it would not get there.

On every request's path, so a plain count per client (no lock object, no context manager): a
request under its client's share costs two dictionary updates. For the same reason a client is
named by its key itself, held only while its requests are upstream, not by the digest
``upload_slots.client_of`` takes for uploads (a hash on every request).
"""

from __future__ import annotations

import asyncio
from collections import deque

# Whoever holds one API key, else one source address.
Client = tuple[str, str]


def client_named(api_key: str, address: str | None) -> Client:
    return ("key", api_key) if api_key else ("address", address or "")


class UpstreamShares:
    """At most ``share`` requests of one client upstream at once: ``took`` (else ``turn``)
    before a request goes, ``give_back`` once its answer is done (in a ``finally``)."""

    def __init__(self, share: int) -> None:
        self._share = share
        self._held: dict[Client, int] = {}  # only clients with a request upstream
        self._waiting: dict[Client, deque[asyncio.Future[None]]] = {}

    @property
    def clients(self) -> int:
        """Clients with a request upstream (nothing is kept for the others)."""
        return len(self._held)

    def took(self, client: Client) -> bool:
        """Whether one of ``client``'s places upstream was free, and is now taken."""
        held = self._held.get(client, 0)
        if held < self._share:
            self._held[client] = held + 1
            return True
        return False

    async def turn(self, client: Client) -> None:
        """A place for a request ``took`` found none for, asked at once (a place is never
        freed while others wait: ``give_back`` hands it on): the next one of ``client``'s own
        requests gives back, in turn. Cancelled while waiting, it takes none."""
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(client, deque()).append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give_back(client)  # handed a place as it was cancelled: passed on
            raise

    def give_back(self, client: Client) -> None:
        """The place of one of ``client``'s requests: to its next waiting request, if any."""
        waiting = self._waiting.get(client)
        while waiting:
            turn = waiting.popleft()
            if not waiting:
                del self._waiting[client]
            if not turn.done():  # not a request that stopped waiting
                turn.set_result(None)
                return
        held = self._held[client] - 1
        if held:
            self._held[client] = held
        else:
            del self._held[client]
