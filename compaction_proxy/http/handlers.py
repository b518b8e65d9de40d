"""HTTP handlers: the edge reads, parses and authenticates; the service decides.

One handler per wire format (``endpoint``): headers checked, the body read and parsed by the
format's adapter, the objects it names found; then the request's life is the service's
(``service.exchange.serve``), with the client's connection as its ``EdgeLink``. Whatever fails
in the store, the request is still forwarded unchanged (``X-Compaction-Status: bypass``) and
the upstream's answer reaches the client byte for byte.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.policy import family_route_for
from compaction_proxy.conversation.messages import is_valid_session_id
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import ProviderHeld
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import (
    bad_request_outcome,
    bad_request_response,
    caller_format,
    store_unavailable_response,
    upstream_failed,
)
from compaction_proxy.http.forwarding import EdgeLink
from compaction_proxy.http.intake import check_headers, read_body
from compaction_proxy.http.ownership import named_in_body
from compaction_proxy.http.passthrough import relay_as_sent
from compaction_proxy.http.upstream import buffered_response, client_headers, client_query
from compaction_proxy.metrics import (
    REQUESTS,
)
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.parsing.recent_bodies import Lineage
from compaction_proxy.security.object_references import NamedObject
from compaction_proxy.security.outbound import upstream_headers, upstream_url
from compaction_proxy.service.exchange import serve
from compaction_proxy.service.native_compaction import opened
from compaction_proxy.store import StoreUnavailable
from compaction_proxy.upstream_seam import UpstreamBroke, UpstreamCall, UpstreamUnreachable

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Session-Id"


def _session_id(headers: Mapping[str, str], *names: str) -> str | None:
    """The conversation's name from the first of ``SESSION_HEADER`` and ``names`` sent."""
    for name in (SESSION_HEADER, *names):
        value = headers.get(name)
        if value is None:
            continue
        if not is_valid_session_id(value):
            raise BadRequest(
                f"Invalid {name} header: use at most 128 characters of [A-Za-z0-9._:-].",
                param=name,
                code="invalid_session_id",
            )
        return value
    return None


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def endpoint(wire: WireFormat) -> Handler:
    """The handler of ``wire``'s endpoint (``POST /v1/chat/completions``, ``/v1/responses``,
    ``/v1/messages``): parsed by its adapter, compacted by the shared core, bad input answered
    in its error shape. A body whose history the provider holds (a Responses
    ``previous_response_id``) is forwarded as sent, and counted."""
    anthropic = wire.family is ApiFamily.ANTHROPIC

    async def handle(request: web.Request) -> web.StreamResponse:
        started = time.perf_counter()
        services = request.app[SERVICES]
        try:
            check_headers(request.headers)
            raw = await read_body(request, services.settings)
            session_id = _session_id(request.headers, *wire.session_headers)
            beta = tuple(request.headers.getall("anthropic-beta", ())) if anthropic else ()
            context = ParseContext(
                services.known_messages, services.recent_bodies, session_id, beta=beta
            )
            parsed = await off_loop_if(is_big(len(raw)), lambda: wire.parse(raw, context))
            if not isinstance(parsed, ProviderHeld) and parsed.carries_sealed:
                # A checkpoint the proxy sealed for the client: put back as the checkpoint
                # (found while parsing, so no other body is searched for one).
                sent, raw = raw, await opened(services, request.headers, raw, wire)
                if raw is not sent:
                    parsed = await off_loop_if(is_big(len(raw)), lambda: wire.parse(raw, context))
            if isinstance(parsed, ProviderHeld):
                named = await _named(request, raw, parsed.body)
                route = services.policies.for_model(parsed.model, wire.family).route
                REQUESTS.labels(route=route.model, outcome="stateful").inc()
                return await relay_as_sent(request, route, raw, named)
            named = await _named(request, raw, parsed.body, parsed.lineage)
        except BadRequest as error:
            REQUESTS.labels(route="", outcome=bad_request_outcome(error)).inc()
            return bad_request_response(error, wire=wire)
        except StoreUnavailable:  # the tenant secret, to read a compaction item, unknown yet
            return store_unavailable_response(wire)
        return await serve(services, EdgeLink(request), parsed, session_id, started, named)

    handle.__name__ = f"{wire.name}_endpoint"
    return handle


async def _named(
    request: web.Request, raw: bytes, body: Any, lineage: Lineage | None = None
) -> list[NamedObject]:
    """The stored objects the body names (``http.ownership.named_in_body``)."""
    return await off_loop_if(is_big(len(raw)), lambda: named_in_body(request, raw, body, lineage))


async def list_models(request: web.Request) -> web.StreamResponse:
    """``GET /v1/models``: the default route's list, or, asked by an Anthropic client, the
    Anthropic upstream's (in its shape)."""
    services, wire = request.app[SERVICES], caller_format(request)
    route = family_route_for(services.settings, None, wire.family)
    headers = upstream_headers(
        request.headers,
        route.api_key_env,
        proxy_keys=services.client_keys.required,
        anthropic=wire.family is ApiFamily.ANTHROPIC,
    )
    call = UpstreamCall("GET", upstream_url(route.base, "/models", client_query(request)), headers)
    try:
        async with services.upstream.open(call) as upstream:
            body = await upstream.read()
            return buffered_response(upstream.status, client_headers(upstream), body)
    except (UpstreamUnreachable, UpstreamBroke) as exc:
        return upstream_failed(route.base, exc.cause, wire=wire)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    try:
        await request.app[SERVICES].store.ping()
    except StoreUnavailable:
        return web.json_response({"status": "unavailable", "store": "down"}, status=503)
    return web.json_response({"status": "ready", "store": "up"})
