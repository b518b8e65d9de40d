"""Work that must finish even if the request that started it goes away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

_running: set[asyncio.Task[Any]] = set()


def _forget(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if not task.cancelled() and task.exception() is not None:
        # Seen only when nobody was left waiting for the result (the client hung up).
        log.warning("background work failed: %r", task.exception())


async def shielded(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to completion even if the caller is cancelled (a client disconnecting
    must not leave a conversation's lease held mid-transaction); the caller still gets the
    result or the exception when it waits to the end."""
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_forget)
    return await asyncio.shield(task)


async def _after(previous: asyncio.Task[None], work: Coroutine[Any, Any, None]) -> None:
    await asyncio.wait([previous])
    await work


class PendingLogWrites:
    """What a request writes after its answer (its log events, usage and anchor), run after
    the client has the answer instead of before.

    Invariant: one conversation's writes run in the order they were spawned, and ``settled``
    waits for all of a conversation's writes so far: the conversation's next request on this
    process, and the admin API, see the state as if every write had been made inline.
    """

    def __init__(self) -> None:
        self._tails: dict[str, asyncio.Task[None]] = {}

    def __len__(self) -> int:
        return len(self._tails)

    def spawn(self, conversation: str, work: Coroutine[Any, Any, None]) -> None:
        previous = self._tails.get(conversation)
        task = asyncio.ensure_future(work if previous is None else _after(previous, work))
        self._tails[conversation] = task
        _running.add(task)
        task.add_done_callback(lambda done: self._release(conversation, done))

    def _release(self, conversation: str, task: asyncio.Task[None]) -> None:
        _forget(task)
        if self._tails.get(conversation) is task:
            del self._tails[conversation]

    async def settled(self, conversation: str) -> None:
        tail = self._tails.get(conversation)
        if tail is not None:
            await asyncio.wait([tail])

    async def settled_all(self) -> None:
        """Wait for every write spawned so far (not for those spawned meanwhile)."""
        if self._tails:
            await asyncio.wait(list(self._tails.values()))

    async def drain(self, within: float | None = None) -> None:
        """Wait for every write spawned so far (at shutdown, before the store closes), at most
        ``within`` seconds: a process told to stop must stop, and a write still waiting then
        is logged and left (its request was answered; only its log and anchor are lost)."""
        loop = asyncio.get_running_loop()
        deadline = None if within is None else loop.time() + within
        while self._tails:
            left = None if deadline is None else max(0.0, deadline - loop.time())
            _, pending = await asyncio.wait(list(self._tails.values()), timeout=left)
            if pending and deadline is not None and loop.time() >= deadline:
                log.warning("shutdown: %d record writes still pending are left", len(pending))
                return
