"""Relayed request bodies streamed as they arrive (a multipart upload), bounded in time.

A body that sends nothing for ``upload_idle_timeout_seconds`` is given up with 408, so a client
trickling bytes cannot hold an upstream connection for the length of its patience; and relayed
traffic has a connection pool of its own (``relay_pool_size``), so uploads, however slow or
many, never take the connections chat, Responses and summary calls need.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp


class UploadStalled(Exception):
    """The client sent no byte of its body for the idle timeout."""


class IdleBoundedBody:
    """``content`` as an async iterable of chunks; raises ``UploadStalled`` (and remembers it,
    since the HTTP client may wrap what its body raises) when no byte comes in ``idle``
    seconds."""

    def __init__(self, content: aiohttp.StreamReader, idle_seconds: float) -> None:
        self._content = content
        self._idle = idle_seconds
        self.stalled = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            try:
                async with asyncio.timeout(self._idle):
                    chunk = await self._content.readany()
            except TimeoutError as exc:
                self.stalled = True
                raise UploadStalled from exc
            if not chunk:
                return
            yield chunk
