"""The relayed paths that carry compaction: ``/v1/responses/compact``, ``/v1/responses/
input_tokens`` and ``/v1/messages/count_tokens``.

All three are relayed by ``http.passthrough``. On the way, a checkpoint the proxy sealed for
the client is opened (``service.native_compaction.opened``): the upstream could not read it.
Where the route's upstream lacks the providers' compaction (``config.native_compaction``):
``/v1/responses/compact`` is answered by the proxy (the body read as a Responses request ending
with a ``compaction_trigger``: its user messages and one compaction item), and a
``count_tokens`` body's ``context_management`` is taken out on the way, the count answered
with the ``original_input_tokens`` the API adds (nothing is cleared for a count: both are the
upstream's count).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.request import ProviderHeld
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.formats.wire_formats import MESSAGES, RESPONSES
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.upstream import client_query
from compaction_proxy.parsing import jsonio
from compaction_proxy.service.native_compaction import NativeCompaction, opened

COMPACT_TEMPLATE = "/v1/responses/compact"
COUNT_TOKENS_TEMPLATE = "/v1/messages/count_tokens"
CARRYING: dict[str, WireFormat] = {
    COMPACT_TEMPLATE: RESPONSES,
    "/v1/responses/input_tokens": RESPONSES,
    COUNT_TOKENS_TEMPLATE: MESSAGES,
}
PROVIDER_HELD = ("previous_response_id", "conversation")

# Reads a whole successful answer's bytes into what the client gets (``passthrough``).
Reading = Callable[[bytes], Awaitable[bytes]]


def served_here(template: str, method: str, route: Route, body: Any) -> bool:
    """Whether the proxy answers this request itself: ``/v1/responses/compact`` on a route
    whose upstream lacks it, for a history the body holds. One the provider holds
    (``previous_response_id``, ``conversation``) the proxy cannot read: relayed, as without
    the proxy (bound to the account like any other)."""
    if template != COMPACT_TEMPLATE or method != "POST" or not serves_compaction(route):
        return False
    return isinstance(body, dict) and not any(body.get(field) for field in PROVIDER_HELD)


async def opened_on_the_way(request: web.Request, template: str, body: bytes) -> bytes:
    """``body`` with the proxy's sealed checkpoints opened, on the paths that carry them."""
    wire = CARRYING.get(template)
    if wire is None:
        return body
    return await opened(request.app[SERVICES], request.headers, body, wire)


def counted_as_asked(template: str, route: Route, body: bytes) -> tuple[bytes, Reading | None]:
    """A ``count_tokens`` body asking for ``context_management`` on a route whose upstream
    lacks it: without it, and the reading that adds ``original_input_tokens`` to the count."""
    if template != COUNT_TOKENS_TEMPLATE or not serves_compaction(route):
        return body, None
    try:
        parsed = jsonio.loads(body)
    except (ValueError, RecursionError):
        return body, None
    if not isinstance(parsed, dict) or "context_management" not in parsed:
        return body, None
    stripped = {k: v for k, v in parsed.items() if k != "context_management"}
    return jsonio.dumps(stripped), _with_original_count


async def _with_original_count(answer: bytes) -> bytes:
    try:
        counted = orjson.loads(answer)
    except orjson.JSONDecodeError:
        return answer
    tokens = counted.get("input_tokens") if isinstance(counted, dict) else None
    if not isinstance(tokens, int):
        return answer
    return orjson.dumps({**counted, "context_management": {"original_input_tokens": tokens}})


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
    return web.Response(
        status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type}
    )
