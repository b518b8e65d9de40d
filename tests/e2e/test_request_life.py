"""The request's life in the service layer, without a socket: the app's services started
without a server, every upstream call answered by ``testing.memory_upstream``, the client's
side a scripted ``ClientLink``. What is checked is what the service decides."""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
from aiohttp import web
from yarl import URL

from compaction_proxy.config.settings import Route, load_settings
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import ParseContext
from compaction_proxy.formats.wire_formats import CHAT
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.ops.app import create_app
from compaction_proxy.security.object_references import NamedObject
from compaction_proxy.service.exchange import AnswerBegan, Refusal, Reply, serve
from compaction_proxy.service.forwarded import Forwarded
from compaction_proxy.service.native_compaction import MadeAnswer
from compaction_proxy.service.services import Services
from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request, overflow_body
from compaction_proxy.testing.memory_upstream import MemoryAnswer, MemoryUpstream
from compaction_proxy.upstream_seam import Upstream, UpstreamCall
from tests.builders import agent_turns, system, user
from tests.helpers import MASKING_OFF, route

BASE = "http://upstream.invalid/v1"  # never reached: every call is answered in memory
MODEL = "small-model"
WINDOW = 16_000

# What the scripted client was answered with: the upstream's status and body.
Answered = tuple[int, bytes]


class ScriptedLink:
    """The client's side: no account binding, each attempt sent through the services'
    upstream and read whole."""

    def __init__(self, upstream: Upstream) -> None:
        self.upstream = upstream
        self.headers: dict[str, str] = {"Authorization": "Bearer sk-test"}
        self.query = ""

    async def refusal(self, route: Route, named: Any) -> Refusal[Answered] | None:
        return None

    def made_here(self, answer: MadeAnswer) -> Answered:
        return answer.status, answer.body

    async def send(
        self,
        route: Route,
        client_request: ClientRequest,
        forwarded: Forwarded,
        answer_began: AnswerBegan | None = None,
    ) -> Reply[Answered]:
        url = URL(f"{route.base}{client_request.wire.upstream_path}")
        call = UpstreamCall("POST", url, self.headers, forwarded.payload)
        async with self.upstream.open(call) as answer:
            if answer_began is not None:
                answer_began(answer.status)
            body = await answer.read()
        if answer.status >= 400:
            return Reply((answer.status, body), answer.status, error_body=body)
        return Reply((answer.status, body), answer.status, answer=body)


def chat_answer(text: str, prompt_tokens: int) -> MemoryAnswer:
    usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 40, "total_tokens": 0}
    message = {"role": "assistant", "content": text}
    body = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    return MemoryAnswer(200, (orjson.dumps({**body, "usage": usage}),))


@pytest.fixture
async def services() -> AsyncIterator[Services]:
    """The app's services, started as the app starts them, with no server listening."""
    settings = load_settings(
        None,
        upstream_base_url=BASE,
        tenant_secret="t-secret",
        # Only recovery compacts here: no pressure below the window, no background rounds.
        routes=[route(BASE, MODEL, WINDOW, auto=False, precompact_ratio=0, **MASKING_OFF)],
    )
    app = create_app(settings)
    runner = web.AppRunner(app)
    await runner.setup()
    await lazy_litellm.loaded()
    try:
        yield app[SERVICES]
    finally:
        await runner.cleanup()


def history() -> list[dict[str, Any]]:
    return [
        system(),
        user(f"FACT-5: ticket {uuid.uuid4().hex[:6]}. Make the importer idempotent."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
    ]


async def test_an_overflow_is_compacted_and_retried_with_every_upstream_call_in_memory(
    services: Services,
) -> None:
    """The upstream refuses the first attempt as over its window; the service summarizes
    (its summary call through the same seam), retries with the smaller body, and the client
    has the retry's answer. No socket is opened."""

    async def provider(call: UpstreamCall) -> MemoryAnswer:
        body = orjson.loads(call.body or b"{}")
        if is_summary_request(body):
            return chat_answer(fake_summary(body), 9_000)
        if len(call.body or b"") > 40_000:
            return MemoryAnswer(400, (overflow_body(WINDOW, 18_000),))
        return chat_answer("Resuming the importer.", 3_000)

    upstream = MemoryUpstream(fallback=provider)
    services = dataclasses.replace(services, upstream=upstream)
    raw = orjson.dumps({"model": MODEL, "messages": history()})
    request = CHAT.parse(raw, ParseContext(services.known_messages, services.recent_bodies))
    assert isinstance(request, ClientRequest)
    link = ScriptedLink(upstream)
    calls: list[tuple[str, bool]] = []

    status, body = await serve(services, link, request, None, time.perf_counter())

    assert status == 200 and b"Resuming the importer." in body
    for call in upstream.calls:
        sent = orjson.loads(call.body or b"{}")
        calls.append((call.url.path, is_summary_request(sent)))
    # The attempt, the summary calls, the retry: in that order, on the route's paths.
    assert {path for path, _ in calls} == {"/v1/chat/completions"}
    assert [summary for _, summary in calls] == [False, *[True] * (len(calls) - 2), False]
    assert len(calls) >= 3
    assert len(upstream.calls[2].body or b"") < len(raw) / 2
    assert upstream.calls[0].body == raw  # the first attempt went as the client sent it
    await services.pending_log_writes.settled_all()


async def test_a_request_resolves_its_policy_once(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Following one request through the service: the policy book is asked once."""
    upstream = MemoryUpstream()
    upstream.answer(chat_answer("ok", 100))
    services = dataclasses.replace(services, upstream=upstream)
    asked: list[str] = []
    resolve = services.policies.for_model

    def counted(model: str, *args: Any) -> Any:
        asked.append(model)
        return resolve(model, *args)

    monkeypatch.setattr(services.policies, "for_model", counted)
    raw = orjson.dumps({"model": MODEL, "messages": [user("hi")]})
    request = CHAT.parse(raw, ParseContext(services.known_messages, services.recent_bodies))
    assert isinstance(request, ClientRequest)
    named: list[NamedObject] = []
    status, _ = await serve(services, ScriptedLink(upstream), request, None, 0.0, named)
    assert status == 200
    assert asked == [MODEL]
    await services.pending_log_writes.settled_all()
