"""Client-facing errors in OpenAI's shape: ``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import logging

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.formats.bad_request import BadRequest

log = logging.getLogger(__name__)


def error_response(
    status: int,
    message: str,
    *,
    error_type: str = "invalid_request_error",
    param: str | None = None,
    code: str | None = None,
) -> web.Response:
    body = {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    return web.Response(status=status, body=orjson.dumps(body), content_type="application/json")


def bad_request_response(error: BadRequest) -> web.Response:
    response = error_response(
        error.status,
        error.message,
        error_type=error.error_type,
        param=error.param,
        code=error.code,
    )
    if error.close_connection:
        response.force_close()
    return response


def anthropic_bad_request_response(error: BadRequest) -> web.Response:
    """``error`` in Anthropic's shape, for a Messages client."""
    kind = "invalid_request_error" if error.status == 400 else error.error_type
    body = {"type": "error", "error": {"type": kind, "message": error.message}}
    response = web.Response(
        status=error.status, body=orjson.dumps(body), content_type="application/json"
    )
    if error.close_connection:
        response.force_close()
    return response


def upstream_failed(base: str, exc: BaseException) -> web.Response:
    """The client's answer when the upstream at ``base`` did not answer in time (504) or could
    not be reached (502); logged, without the request's content."""
    if isinstance(exc, TimeoutError):
        log.warning("upstream %s timed out", base)
        return error_response(
            504,
            "The upstream did not answer in time.",
            error_type="upstream_error",
            code="upstream_timeout",
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
    )
