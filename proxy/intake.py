"""Reading what a client sent: a bounded body, and headers that can be sent on."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from proxy.content_coding import DecodedTooLarge, UndecodableBody, UnknownCoding, decoded
from proxy.errors import BadRequest
from proxy.offload import is_big, off_loop_if

# How much a compressed body may grow when decoded, as far as the offload bounds go (JSON
# packs 5-15 times): decoding time follows the decoded size, which the raw one hides.
_DECODED_PER_RAW_BYTE = 16


async def read_body(request: web.Request, limit: int) -> bytes:
    """The body, its ``Content-Encoding`` undone; at most ``limit`` bytes either way."""
    too_large = BadRequest(
        f"Request body too large: the limit is {limit} bytes.",
        status=413,
        code="request_too_large",
        close_connection=True,
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large from exc
    except RequestPayloadError as exc:  # the chunked framing is broken
        raise BadRequest(
            "The request body could not be read: its transfer framing is invalid.",
            code="invalid_body",
            close_connection=True,
        ) from exc
    if len(raw) > limit:
        raise too_large
    coding = request.headers.get("Content-Encoding", "")
    if not coding:
        return raw
    big = is_big(len(raw) * _DECODED_PER_RAW_BYTE)
    try:
        return await off_loop_if(big, lambda: decoded(raw, coding, limit))
    except DecodedTooLarge as exc:
        raise too_large from exc
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


class UndecodableBodyFilter(logging.Filter):
    """Keeps a client's unreadable body out of the server's error log.

    Such a request is answered 400 (``invalid_body``); aiohttp then drains the rest of the
    body to keep the connection usable, meets the same error again, and logs it as an
    unhandled exception with its traceback: a client's fault, at the level of a bug. Any
    client could fill an operator's error log with them."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, RequestPayloadError)


def quiet_undecodable_bodies() -> None:
    """Install the filter on aiohttp's server logger (once)."""
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, UndecodableBodyFilter) for f in server_log.filters):
        server_log.addFilter(UndecodableBodyFilter())
