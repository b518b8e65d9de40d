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
        log.warning("background compaction failed: %r", task.exception())


async def shielded(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to completion even if the caller is cancelled (a client disconnecting
    must not leave a conversation's lease held mid-transaction); the caller still gets the
    result or the exception when it waits to the end."""
    task = asyncio.ensure_future(work)
    _running.add(task)
    task.add_done_callback(_forget)
    return await asyncio.shield(task)
