"""``native_compaction: auto`` never serves what the upstream itself offers: to OpenAI's and
Anthropic's own APIs a ``compaction_trigger`` and ``context_management`` go as the client sent
them; to any other upstream the proxy serves them. Every upstream call is answered in memory
(``testing.memory_upstream``): the providers' hosts are named, never reached."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web

from compaction_proxy.config.settings import load_settings
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.formats.wire_formats import MESSAGES, RESPONSES
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.ops.app import create_app
from compaction_proxy.service.exchange import serve
from compaction_proxy.service.services import Services
from compaction_proxy.testing.memory_upstream import MemoryAnswer, MemoryUpstream
from compaction_proxy.upstream_seam import UpstreamCall
from tests.e2e.test_request_life import ScriptedLink
from tests.helpers import route

OPENAI = "https://api.openai.com/v1"
ANTHROPIC = "https://api.anthropic.com/v1"
LOCAL = "http://upstream.invalid/v1"


@pytest.fixture
async def services() -> AsyncIterator[Services]:
    settings = load_settings(
        None,
        upstream_base_url=LOCAL,
        tenant_secret="t-secret",
        routes=[
            route(OPENAI, "gpt-*", 128_000),
            route(ANTHROPIC, "claude-*", 200_000),
            route(LOCAL, "local-*", 16_000),
        ],
    )
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    await lazy_litellm.loaded()
    try:
        yield app[SERVICES]
    finally:
        await runner.cleanup()


async def sent(
    services: Services, wire: WireFormat, body: dict[str, Any]
) -> tuple[MemoryUpstream, bytes]:
    """``body`` served: the upstream calls it made (each answered ``{}``), and its answer."""

    async def empty(call: UpstreamCall) -> MemoryAnswer:
        return MemoryAnswer(200, (b"{}",))

    upstream = MemoryUpstream(fallback=empty)
    services = dataclasses.replace(services, upstream=upstream)
    raw = orjson.dumps(body)
    request = wire.parse(raw, ParseContext(services.known_messages, services.recent_bodies))
    assert isinstance(request, ClientRequest)
    _, answer = await serve(services, ScriptedLink(upstream), request, None, 0.0, [])
    await services.pending_log_writes.settled_all()
    return upstream, answer


TRIGGERED = {
    "input": [{"role": "user", "content": "Fix it."}, {"type": "compaction_trigger"}],
}
RESPONSES_OPTION = {
    "input": "Fix it.",
    "context_management": [{"type": "compaction", "compact_threshold": 1}],
}
MESSAGES_OPTION = {
    "max_tokens": 64,
    "messages": [{"role": "user", "content": "Fix it."}],
    "context_management": {"edits": [{"type": "compact_20260112"}]},
}


@pytest.mark.parametrize(
    ("wire", "body", "model"),
    [
        (RESPONSES, TRIGGERED, "gpt-5"),
        (RESPONSES, RESPONSES_OPTION, "gpt-5"),
        (MESSAGES, MESSAGES_OPTION, "claude-sonnet-4-5"),
    ],
    ids=["trigger to OpenAI", "Responses option to OpenAI", "edits to Anthropic"],
)
async def test_auto_relays_to_the_provider_that_offers_it_as_sent(
    services: Services, wire: WireFormat, body: dict[str, Any], model: str
) -> None:
    upstream, _ = await sent(services, wire, {"model": model, **body})
    (call,) = upstream.calls
    assert str(call.url).startswith(OPENAI if wire is RESPONSES else ANTHROPIC)
    assert orjson.loads(call.body or b"") == {"model": model, **body}


async def test_auto_serves_a_trigger_for_any_other_upstream(services: Services) -> None:
    upstream, answer = await sent(services, RESPONSES, {"model": "local-model", **TRIGGERED})
    assert all("compaction_trigger" not in (call.body or b"").decode() for call in upstream.calls)
    # Made here: the summary calls got no summary from this upstream, and the proxy says so.
    assert orjson.loads(answer)["error"]["code"] == "compaction_unavailable"
