"""Request bodies read as they arrive, bounded in time (a relayed upload streamed on, and every
body the proxy reads whole: ``intake``), and the answers to an upload refused a slot or given
up.

A body that sends nothing for ``upload_idle_timeout_seconds`` is given up with 408, and so is
one that, past its first ``upload_grace_seconds``, brings fewer than
``upload_min_bytes_per_second`` in a span of that length: a client trickling a byte now and
then (which never trips the idle timeout) cannot hold an upstream connection for the length of
its patience. Time the upstream takes to read what was sent is not the client's: the spans
stop while a chunk is being sent on. Relayed traffic has a connection pool of its own
(``relay_pool_size``), so uploads, however slow or many, never take the connections chat,
Responses and summary calls need.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from enum import Enum

import aiohttp
from aiohttp import web

from compaction_proxy.config.settings import Settings
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.http.errors import error_response
from compaction_proxy.security.upload_slots import SlotRefusal

log = logging.getLogger(__name__)

POOL_RETRY_SECONDS = 5


class UploadStalled(Exception):
    """The client sent its body too slowly: no byte for the idle timeout, or under the
    minimum rate."""


class Stall(Enum):
    IDLE = "idle"
    TOO_SLOW = "too_slow"


class IdleBoundedBody:
    """``content`` as an async iterable of chunks; raises ``UploadStalled`` (and remembers
    why in ``stalled``, since the HTTP client may wrap what its body raises) when no byte
    comes in ``idle_seconds``, or a span of ``grace_seconds`` after the first brings fewer
    than ``min_rate`` bytes a second."""

    def __init__(
        self,
        content: aiohttp.StreamReader,
        idle_seconds: float,
        grace_seconds: float = 10.0,
        min_rate: float = 0.0,
    ) -> None:
        self._content = content
        self._idle = idle_seconds
        self._grace = grace_seconds
        self._min_bytes = min_rate * grace_seconds  # what each span must bring
        self.stalled: Stall | None = None

    @classmethod
    def as_configured(cls, content: aiohttp.StreamReader, settings: Settings) -> IdleBoundedBody:
        return cls(
            content,
            settings.upload_idle_timeout_seconds,
            settings.upload_grace_seconds,
            settings.upload_min_bytes_per_second,
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        loop = asyncio.get_running_loop()
        now = loop.time()
        span_ends, last_byte, brought = now + self._grace, now, 0
        graced = True  # the first span is the grace period: not measured
        while True:
            now = loop.time()
            if now >= span_ends:
                if brought < self._min_bytes and not graced:
                    self.stalled = Stall.TOO_SLOW
                    raise UploadStalled
                span_ends, brought, graced = now + self._grace, 0, False
            deadline = min(last_byte + self._idle, span_ends if self._min_bytes else now + 3600)
            try:
                async with asyncio.timeout_at(deadline):
                    # Each chunk as the parser handed it over: readany would join what is
                    # buffered, a copy of the body on the way.
                    chunk, at_http_chunk_end = await self._content.readchunk()
            except TimeoutError as exc:
                if loop.time() >= last_byte + self._idle:
                    self.stalled = Stall.IDLE
                    raise UploadStalled from exc
                continue  # a span ended: checked at the top
            if not chunk:
                # The end of one chunk of a chunked body, not its end; aiohttp's empty body
                # says so for good once read, so its end is asked too.
                if at_http_chunk_end and not self._content.at_eof():
                    continue
                return
            brought += len(chunk)
            sending = loop.time()
            yield chunk
            # The upstream's reading time is not the client's.
            waited = loop.time() - sending
            span_ends, last_byte = span_ends + waited, loop.time()


def no_upload_slot(settings: Settings, refusal: SlotRefusal, wire: WireFormat) -> web.Response:
    """429 when the client or its address holds its bound; 503 with ``Retry-After`` when the
    relay pool's upload slots are all held (the proxy's own pool, not the upstream)."""
    if refusal is SlotRefusal.POOL:
        log.warning(
            "all %d upload slots of the relay pool are held: an upload is refused with 503",
            settings.upload_slots_total,
        )
        refused = error_response(
            503,
            "The proxy is relaying as many uploads as it takes at once: retry shortly.",
            error_type="server_error",
            code="upload_slots_full",
            wire=wire,
        )
        refused.headers["Retry-After"] = str(POOL_RETRY_SECONDS)
    else:
        bound, whom = (
            (settings.max_uploads_per_client, "client")
            if refusal is SlotRefusal.CLIENT
            else (settings.max_uploads_per_address, "source address")
        )
        refused = error_response(
            429,
            f"At most {bound} uploads at once per {whom}: wait for one to finish.",
            code="too_many_uploads",
            wire=wire,
        )
    refused.force_close()  # its body was not read
    return refused


STALLED_CODE = "request_timeout"


def stall_message(settings: Settings, stall: Stall) -> str:
    if stall is Stall.IDLE:
        said = f"no byte for {settings.upload_idle_timeout_seconds:g} seconds"
    else:
        said = (
            f"under {settings.upload_min_bytes_per_second:g} bytes a second over "
            f"{settings.upload_grace_seconds:g} seconds"
        )
    return f"The request body stalled: {said}."


def stalled(settings: Settings, stall: Stall, wire: WireFormat) -> web.Response:
    """408 for a body that stalled or crawled; the rest of it is not read."""
    response = error_response(408, stall_message(settings, stall), code=STALLED_CODE, wire=wire)
    response.force_close()
    return response
