"""``/v1/responses/compact`` and ``/v1/responses/input_tokens`` at the edge.

Both are relayed by ``http.passthrough``. On the way, a compaction item the proxy made is
opened into its checkpoint (``service.native_compaction.opened``): the upstream could not read
it. Where the route's upstream lacks the compact endpoint (``config.native_compaction``), the
proxy answers it itself: the body is read as a Responses request ending with a
``compaction_trigger``, and answered with its user messages and one compaction item.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.compaction_items import TRIGGER_TYPE
from compaction_proxy.formats.request import ProviderHeld
from compaction_proxy.formats.wire import ParseContext
from compaction_proxy.formats.wire_formats import RESPONSES
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.http.upstream import client_query
from compaction_proxy.parsing import jsonio
from compaction_proxy.service.native_compaction import answer_compact, opened

COMPACT_TEMPLATE = "/v1/responses/compact"
ITEM_READING_TEMPLATES = frozenset({COMPACT_TEMPLATE, "/v1/responses/input_tokens"})
# What a compact body keeps when read as a Responses request: the rest (reasoning options,
# ``store``, streaming) means nothing to a summary.
KEPT_FIELDS = ("model", "instructions", "tools")
PROVIDER_HELD = ("previous_response_id", "conversation")


def served_here(template: str, method: str, route: Route, body: Any) -> bool:
    """Whether the proxy answers this request itself: ``/v1/responses/compact`` on a route
    whose upstream lacks it, for a history the body holds. One the provider holds
    (``previous_response_id``, ``conversation``) the proxy cannot read: relayed, as without
    the proxy (bound to the account like any other)."""
    if template != COMPACT_TEMPLATE or method != "POST" or not serves_compaction(route):
        return False
    return isinstance(body, dict) and not any(body.get(field) for field in PROVIDER_HELD)


async def opened_on_the_way(request: web.Request, template: str, body: bytes) -> bytes:
    """``body`` with the proxy's compaction items opened, on the paths that read them."""
    if template not in ITEM_READING_TEMPLATES:
        return body
    return await opened(request.app[SERVICES], request.headers, body)


def compact_request_body(body: dict[str, Any]) -> bytes:
    """A compact body (``served_here``) as a Responses request ending with a
    ``compaction_trigger``; BadRequest for an ``input`` that is none."""
    given = body.get("input")
    if isinstance(given, str):
        items: list[Any] = [{"role": "user", "content": given}]
    elif isinstance(given, list):
        items = list(given)
    else:
        raise BadRequest(
            "Invalid 'input': expected a string or an array of items.",
            param="input",
            code="invalid_type",
        )
    kept = {field: body[field] for field in KEPT_FIELDS if field in body}
    return jsonio.dumps({**kept, "input": [*items, {"type": TRIGGER_TYPE}], "store": False})


async def serve_compact(request: web.Request, body: bytes) -> web.StreamResponse:
    """Answer ``/v1/responses/compact`` from the proxy's engine (``body``: opened)."""
    services = request.app[SERVICES]
    raw = compact_request_body(jsonio.loads(body))
    context = ParseContext(services.known_messages, services.recent_bodies)
    parsed = RESPONSES.parse(raw, context)
    assert not isinstance(parsed, ProviderHeld)  # refused above
    model_policy = services.policies.for_model(parsed.model, ApiFamily.OPENAI)
    answer = await answer_compact(
        services, parsed, model_policy, None, request.headers, client_query(request)
    )
    return web.Response(
        status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type}
    )
