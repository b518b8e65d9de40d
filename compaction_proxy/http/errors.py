"""Client-facing errors in the caller's API shape, which its wire format writes
(``WireFormat.error_body``): OpenAI's for chat and Responses clients, Anthropic's for a
Messages client. A path no format parses answers in its family's format
(``caller_format``)."""

from __future__ import annotations

import logging

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.wire import WireFormat
from compaction_proxy.formats.wire_formats import CHAT, family_wire_format
from compaction_proxy.security.outbound import speaks_anthropic

log = logging.getLogger(__name__)


def caller_format(request: web.BaseRequest) -> WireFormat:
    """The format whose errors ``request``'s client reads: Anthropic's for its API's paths
    (``speaks_anthropic``), OpenAI's otherwise."""
    anthropic = speaks_anthropic(request.path, request.headers)
    return family_wire_format(ApiFamily.ANTHROPIC if anthropic else ApiFamily.OPENAI)


def error_response(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    wire: WireFormat = CHAT,
) -> web.Response:
    body = wire.error_body(status, message, error_type=error_type, param=param, code=code)
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def bad_request_response(error: BadRequest, *, wire: WireFormat = CHAT) -> web.Response:
    response = error_response(
        error.status,
        error.message,
        error_type=error.error_type,
        param=error.param,
        code=error.code,
        wire=wire,
    )
    if error.close_connection:
        response.force_close()
    return response


def bad_request_outcome(error: BadRequest) -> str:
    """The ``outcome`` label of a request answered with ``error``: a body that stalled
    (408) is the client's timeout, anything else its bad request."""
    return "client_timeout" if error.status == 408 else "bad_request"


def upstream_failed(base: str, exc: BaseException, *, wire: WireFormat = CHAT) -> web.Response:
    """The client's answer when the upstream at ``base`` did not answer in time (504) or could
    not be reached (502); logged, without the request's content."""
    if isinstance(exc, TimeoutError):
        log.warning("upstream %s timed out", base)
        return error_response(
            504,
            "The upstream did not answer in time.",
            error_type="upstream_error",
            code="upstream_timeout",
            wire=wire,
        )
    log.warning("upstream %s failed: %s", base, type(exc).__name__)
    # Reached, but what came back was not valid HTTP (or was cut off): a fault of its own.
    answered = isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientPayloadError)
    what = "sent an answer that is not valid HTTP" if answered else "could not be reached"
    return error_response(
        502,
        f"The upstream {what}: {type(exc).__name__}.",
        error_type="upstream_error",
        code="upstream_unavailable",
        wire=wire,
    )


def store_unavailable_response(wire: WireFormat = CHAT) -> web.Response:
    """503: what the request needs of the store (the tenant secret a compaction item is
    verified under) cannot be had yet."""
    response = error_response(
        503,
        "The proxy's store is unavailable; the compaction item cannot be verified yet.",
        error_type="server_error",
        code="store_unavailable",
        wire=wire,
    )
    response.headers["Retry-After"] = "2"
    return response
