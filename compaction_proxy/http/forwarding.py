"""Forwarding one request body upstream and relaying the answer to the client."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from compaction_proxy.config.settings import Route
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import upstream_failed
from compaction_proxy.http.upstream import (
    Claim,
    ClientGone,
    UpstreamCut,
    UsageScanner,
    buffered_response,
    claim_created,
    client_headers,
    client_query,
    cut_off,
    is_event_stream,
    relay_stream,
    usage_of_body,
)
from compaction_proxy.metrics import UPSTREAM_DURATION, child
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.security.outbound import upstream_headers, upstream_url

log = logging.getLogger(__name__)


def _observe(route: Route, started: float) -> None:
    child(UPSTREAM_DURATION, route.model).observe(time.perf_counter() - started)


@dataclass(frozen=True)
class Reply:
    """The client's response, the upstream status (0: unreachable), the usage a stream
    reported or the answer it is to be read from (``usage_of``), and its raw error body when
    it answered with an error (not yet sent to the client)."""

    response: web.StreamResponse
    status: int
    usage: dict[str, Any] | None = None
    error_body: bytes | None = None
    client_gone: bool = False  # the client left before its answer was whole
    upstream_cut: bool = False  # the upstream broke off a stream already being relayed
    answer: bytes | None = None  # a successful answer sent whole


async def usage_of(reply: Reply) -> dict[str, Any] | None:
    """The usage the upstream reported: a stream's as it was relayed, a whole answer's read
    from it. Asked after the client has its answer, so reading it costs the client nothing."""
    if reply.answer is None:
        return reply.usage
    answer = reply.answer
    return await off_loop_if(is_big(len(answer)), lambda: usage_of_body(answer))


async def forward(
    request: web.Request,
    route: Route,
    path: str,
    payload: bytes,
    extra_headers: Mapping[str, str],
    claim: Claim | None = None,
    *,
    anthropic: bool = False,
) -> Reply:
    """Send ``payload`` to ``path`` (``/chat/completions``, ``/responses``) of the route. A
    successful stream is relayed to the client as it arrives; any other answer is returned
    whole, so the caller may still decide to retry. With ``claim``, what a successful answer
    creates is claimed before the client has it (``http.ownership``)."""
    session = request.app[SERVICES].http_client
    proxy_keys = request.app[SERVICES].client_keys.required
    headers = upstream_headers(
        request.headers, route.api_key_env, proxy_keys=proxy_keys, anthropic=anthropic
    )
    headers.setdefault("Content-Type", "application/json")
    url = upstream_url(route.base, path, client_query(request))
    started = time.perf_counter()
    try:
        async with session.post(
            url, data=payload, headers=headers, allow_redirects=False
        ) as upstream:
            reply_headers = client_headers(upstream)
            reply_headers.update(extra_headers)
            if upstream.status < 400 and is_event_stream(upstream):
                scanner = UsageScanner(wants_created=claim is not None)
                try:
                    streamed = await relay_stream(request, upstream, reply_headers, scanner, claim)
                except ClientGone as gone:
                    if not gone.answered:
                        log.info("the client went away mid-answer")
                    _observe(route, started)
                    # Leaving the upstream's context releases its connection.
                    return Reply(
                        gone.response, upstream.status, scanner.usage, client_gone=not gone.answered
                    )
                except UpstreamCut as cut:
                    log.warning("upstream %s cut off a stream: %s", route.base, cut.cause)
                    _observe(route, started)
                    cut_off(request)
                    return Reply(cut.response, upstream.status, scanner.usage, upstream_cut=True)
                _observe(route, started)
                return Reply(streamed, upstream.status, scanner.usage)
            body = await upstream.read()
            _observe(route, started)
            response = buffered_response(upstream.status, reply_headers, body)
            if upstream.status >= 400:
                return Reply(response, upstream.status, error_body=body)
            if claim is not None:
                await claim_created(claim, body)
            return Reply(response, upstream.status, answer=body)
    except (TimeoutError, aiohttp.ClientError) as exc:
        return Reply(upstream_failed(route.base, exc, anthropic=anthropic), 0)
