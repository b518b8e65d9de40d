"""Reading what a client sent: a bounded body, and headers that can be sent on."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from proxy.errors import BadRequest


async def read_body(request: web.Request, limit: int) -> bytes:
    too_large = BadRequest(
        f"Request body too large: the limit is {limit} bytes.",
        status=413,
        code="request_too_large",
    )
    if request.content_length is not None and request.content_length > limit:
        raise too_large
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise too_large from exc
    except RequestPayloadError as exc:
        raise BadRequest(
            "The request body could not be decoded as its Content-Encoding header says.",
            param="Content-Encoding",
            code="invalid_body_encoding",
        ) from exc
    if len(raw) > limit:
        raise too_large
    return raw


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
