"""Reading what a client sent: a bounded body, and headers that can be sent on."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from compaction_proxy.config.settings import Settings
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.http.body_encoding import (
    DecodedTooLarge,
    UndecodableBody,
    UnknownCoding,
    decoded,
)
from compaction_proxy.http.uploads import (
    STALLED_CODE,
    IdleBoundedBody,
    Stall,
    UploadStalled,
    stall_message,
)
from compaction_proxy.offload import is_big, off_loop_if

# How much a compressed body may grow when decoded, as far as the offload bounds go (JSON
# packs 5-15 times): decoding time follows the decoded size, which the raw one hides.
_DECODED_PER_RAW_BYTE = 16


def _too_large(limit: int) -> BadRequest:
    return BadRequest(
        f"Request body too large: the limit is {limit} bytes.",
        status=413,
        code="request_too_large",
        close_connection=True,
    )


async def _received(request: web.Request, settings: Settings) -> bytes:
    """The body's bytes as the parser handed them over, joined once (``request.read()``
    copies a body three times: the chunks buffered joined, added to a bytearray, made bytes;
    a cost that grows with the history an agent resends on every request). A body still on
    its way is bounded in time as a relayed upload is (``IdleBoundedBody``): without it, a
    client that stops sending, or whose chunked framing breaks midway (aiohttp's parser then
    queues its error behind the request and never ends the body), holds its handler for good.
    """
    limit = settings.max_body_bytes
    content = request.content
    if content.is_eof():
        # All of it came with the headers: no wait to bound. What is buffered, joined once
        # (a body of one chunk is that chunk); aiohttp's empty body gives b"".
        whole = content.read_nowait()
        if len(whole) > limit:
            raise _too_large(limit)
        return whole
    guarded = IdleBoundedBody.as_configured(content, settings)
    chunks: list[bytes] = []
    size = 0
    try:
        async for chunk in guarded:
            size += len(chunk)
            if size > limit:
                raise _too_large(limit)
            chunks.append(chunk)
    except UploadStalled as exc:  # raised by the guard alone, which says why
        stall = guarded.stalled or Stall.IDLE
        raise BadRequest(
            stall_message(settings, stall),
            status=408,
            code=STALLED_CODE,
            close_connection=True,
        ) from exc
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def read_body(request: web.Request, settings: Settings) -> bytes:
    """The body, its ``Content-Encoding`` undone; at most ``max_body_bytes`` either way."""
    limit = settings.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise _too_large(limit)
    try:
        raw = await _received(request, settings)
    except RequestPayloadError as exc:  # the chunked framing is broken
        raise BadRequest(
            "The request body could not be read: its transfer framing is invalid.",
            code="invalid_body",
            close_connection=True,
        ) from exc
    coding = request.headers.get("Content-Encoding", "")
    if not coding:
        return raw
    big = is_big(len(raw) * _DECODED_PER_RAW_BYTE)
    try:
        return await off_loop_if(big, lambda: decoded(raw, coding, limit))
    except DecodedTooLarge as exc:
        raise _too_large(limit) from exc
    except UnknownCoding as exc:
        raise BadRequest(
            f"Unsupported Content-Encoding {str(exc)!r}: use gzip, deflate, br or zstd.",
            status=415,
            param="Content-Encoding",
            code="unsupported_content_encoding",
        ) from exc
    except UndecodableBody as exc:
        raise BadRequest(
            "The request body could not be decoded as its Content-Encoding header says.",
            param="Content-Encoding",
            code="invalid_body_encoding",
        ) from exc


def check_headers(headers: Mapping[str, str]) -> None:
    """Header values must be text: bytes that are not UTF-8 cannot be forwarded either."""
    if all(map(str.isascii, headers.values())):  # every request but a rare one, in C
        return
    for name, value in headers.items():
        if value.isascii():
            continue
        try:
            value.encode()
        except UnicodeEncodeError as exc:
            raise BadRequest(
                f"Invalid value for header '{name}': it is not valid UTF-8.",
                param=name,
                code="invalid_header",
            ) from exc
