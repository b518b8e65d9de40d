"""Client-facing errors in the caller's API shape: OpenAI's ``{"error": {"message", "type",
"param", "code"}}``, or, for a Messages client (``/v1/messages...``), Anthropic's ``{"type":
"error", "error": {"type", "message"}}`` with the type Anthropic gives that status."""

from __future__ import annotations

import logging

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.formats.bad_request import BadRequest

log = logging.getLogger(__name__)


# Anthropic's error type for each status it answers with (docs: "Errors"); api_error else.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


def anthropic_error_type(status: int) -> str:
    return _ANTHROPIC_TYPES.get(status, "api_error")


def error_response(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
    anthropic: bool = False,
) -> web.Response:
    body: dict[str, object]
    if anthropic:
        body = {
            "type": "error",
            "error": {"type": anthropic_error_type(status), "message": message},
        }
    else:
        body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def bad_request_response(error: BadRequest, *, anthropic: bool = False) -> web.Response:
    response = error_response(
        error.status,
        error.message,
        error_type=error.error_type,
        param=error.param,
        code=error.code,
        anthropic=anthropic,
    )
    if error.close_connection:
        response.force_close()
    return response


def upstream_failed(base: str, exc: BaseException, *, anthropic: bool = False) -> web.Response:
    """The client's answer when the upstream at ``base`` did not answer in time (504) or could
    not be reached (502); logged, without the request's content."""
    if isinstance(exc, TimeoutError):
        log.warning("upstream %s timed out", base)
        return error_response(
            504,
            "The upstream did not answer in time.",
            error_type="upstream_error",
            code="upstream_timeout",
            anthropic=anthropic,
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
        anthropic=anthropic,
    )


def store_unavailable_response() -> web.Response:
    """503: what the request needs of the store (the tenant secret a compaction item is
    verified under) cannot be had yet."""
    response = error_response(
        503,
        "The proxy's store is unavailable; the compaction item cannot be verified yet.",
        error_type="server_error",
        code="store_unavailable",
    )
    response.headers["Retry-After"] = "2"
    return response
