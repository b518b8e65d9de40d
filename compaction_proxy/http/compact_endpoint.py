"""The relayed paths that carry compaction: ``/v1/responses/compact``, ``/v1/responses/
input_tokens`` and ``/v1/messages/count_tokens``.

All three are relayed by ``http.passthrough``. On the way, a checkpoint the proxy sealed for
the client is opened (``service.native_compaction.opened``): the upstream could not read it.
Where the route's upstream lacks the providers' compaction (``config.native_compaction``):
``/v1/responses/compact`` is answered by the proxy (the body read as a Responses request ending
with a ``compaction_trigger``: its user messages and one compaction item), and a
``count_tokens`` body with ``context_management`` is counted by the upstream without it: as
sent (``original_input_tokens``), and as its clearing edits would leave it (``input_tokens``).
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.asked_compaction import AskedCompaction
from compaction_proxy.formats.request import ProviderHeld
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.formats.wire_formats import MESSAGES, RESPONSES
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.errors import upstream_failed
from compaction_proxy.http.upstream import client_query
from compaction_proxy.parsing import jsonio
from compaction_proxy.security.outbound import upstream_headers, upstream_url
from compaction_proxy.service.native_compaction import NativeCompaction, opened
from compaction_proxy.upstream_seam import UpstreamBroke, UpstreamCall, UpstreamUnreachable

COMPACT_TEMPLATE = "/v1/responses/compact"
COUNT_TOKENS_TEMPLATE = "/v1/messages/count_tokens"
CARRYING: dict[str, WireFormat] = {
    COMPACT_TEMPLATE: RESPONSES,
    "/v1/responses/input_tokens": RESPONSES,
    COUNT_TOKENS_TEMPLATE: MESSAGES,
}


def served_here(template: str, method: str, route: Route, body: Any) -> bool:
    """Whether the proxy answers this request itself: ``/v1/responses/compact`` on a route
    whose upstream lacks it, for a history the body holds. One the provider holds
    (``previous_response_id``, ``conversation``) the proxy cannot read: relayed, as without
    the proxy (bound to the account like any other)."""
    if template != COMPACT_TEMPLATE or method != "POST" or not serves_compaction(route):
        return False
    return isinstance(body, dict) and not RESPONSES.provider_holds(body)


async def opened_on_the_way(request: web.Request, template: str, body: bytes) -> bytes:
    """``body`` with the proxy's sealed checkpoints opened, on the paths that carry them."""
    wire = CARRYING.get(template)
    if wire is None:
        return body
    return await opened(request.app[SERVICES], request.headers, body, wire)


def served_count(template: str, route: Route, body: Any) -> AskedCompaction | None:
    """What a ``count_tokens`` body asks of ``context_management`` on a route whose upstream
    lacks it (then the proxy counts it); None otherwise. BadRequest for an edit the API
    would refuse."""
    if template != COUNT_TOKENS_TEMPLATE or not serves_compaction(route):
        return None
    if not isinstance(body, dict) or "context_management" not in body:
        return None
    return MESSAGES.asked_compaction(body)


async def serve_count(
    request: web.Request, route: Route, body: dict[str, Any], asked: AskedCompaction
) -> web.StreamResponse:
    """The count of ``body`` as its edits would leave it, and ``original_input_tokens``,
    the count of it as sent: one or two counts by the upstream, without the option."""
    plain = MESSAGES.count_bodies(body, asked, None)
    assert plain is not None
    try:
        status, answer = await _counted(request, route, plain)
        original = _input_tokens(answer) if status == 200 else None
        if original is None:
            return web.Response(status=status, body=answer, content_type="application/json")
        counted: int | None = original
        cleared = MESSAGES.count_bodies(body, asked, original)
        if cleared is not None:
            status, answer = await _counted(request, route, cleared)
            counted = _input_tokens(answer) if status == 200 else None
        if counted is None:
            return web.Response(status=status, body=answer, content_type="application/json")
    except (UpstreamUnreachable, UpstreamBroke) as exc:
        return upstream_failed(route.base, exc.cause, wire=MESSAGES)
    management = {"original_input_tokens": original}
    return web.json_response({"input_tokens": counted, "context_management": management})


async def _counted(request: web.Request, route: Route, body: dict[str, Any]) -> tuple[int, bytes]:
    services = request.app[SERVICES]
    headers = upstream_headers(
        request.headers,
        route.api_key_env,
        proxy_keys=services.client_keys.required,
        anthropic=True,
    )
    headers["Content-Type"] = "application/json"
    url = upstream_url(route.base, "/messages/count_tokens", client_query(request))
    async with services.upstream.open(
        UpstreamCall("POST", url, headers, jsonio.dumps(body))
    ) as answer:
        return answer.status, await answer.read()


def _input_tokens(answer: bytes) -> int | None:
    try:
        counted = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return None
    tokens = counted.get("input_tokens") if isinstance(counted, dict) else None
    return tokens if isinstance(tokens, int) else None


async def serve_compact(request: web.Request, body: bytes) -> web.StreamResponse:
    """Answer ``/v1/responses/compact`` from the proxy's engine (``body``: opened)."""
    services = request.app[SERVICES]
    raw = RESPONSES.compact_request(jsonio.loads(body))
    context = ParseContext(services.known_messages, services.recent_bodies)
    parsed = RESPONSES.parse(raw, context)
    assert not isinstance(parsed, ProviderHeld)  # ``served_here`` relays those
    model_policy = services.policies.for_model(parsed.model, ApiFamily.OPENAI)
    native = NativeCompaction(
        services, parsed, model_policy, None, request.headers, client_query(request)
    )
    answer = await native.compact_answer()
    return web.Response(status=answer.status, body=answer.body, headers=answer.headers)
