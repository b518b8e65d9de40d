"""Overflow recovery end to end: compact harder after the upstream's overflow, retry only on
evidence, otherwise hand the upstream's own error back byte for byte."""

from __future__ import annotations

import uuid
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, counter

pytest.importorskip("openai")

import openai

MODEL = "tight-model"
REAL_WINDOW = 16_000


def recoveries(result: str) -> float:
    return counter("compaction_proxy_overflow_recoveries_total", result=result)


@pytest.fixture
async def proxy(make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream) -> RunningProxy:
    """The route claims 128k; the upstream really has 16k, so pressure never fires first.
    Masking off: these tests are about the summaries recovery makes."""
    fake.windows[MODEL] = REAL_WINDOW
    return await make_proxy(routes=[tight_route(upstream_url, **MASKING_OFF)])


def tight_route(upstream_url: str, **policy: Any) -> dict[str, Any]:
    return {
        "model": "tight-*",
        "base_url": upstream_url,
        "context_window": 128_000,
        "policy": policy,
    }


def long_history(turns: int = 40, *, last: str = "Carry on.") -> list[dict[str, Any]]:
    """About 21k tokens of ordinary agent work: nothing for the pruner."""
    return [
        system(),
        user(f"FACT-9: run {uuid.uuid4().hex[:6]}. Port the scheduler to asyncio."),
        *agent_turns(turns, output="scheduler trace entry " * 150),
        user(last),
    ]


async def ask(proxy: RunningProxy, messages: list[dict[str, Any]], **options: Any) -> Any:
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-o", max_retries=0) as client:
        return await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            **options,  # type: ignore[arg-type]
        )


async def test_overflow_is_compacted_retried_and_the_checkpoint_reused(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    retried = recoveries("retried")
    overflow_compactions = (
        REGISTRY.get_sample_value(
            "compaction_proxy_compactions_total",
            {"trigger": "context-overflow", "mechanism": "summary", "outcome": "committed"},
        )
        or 0.0
    )
    messages = long_history()
    reply = await ask(proxy, messages)
    assert reply.parse().choices[0].message.content == "ok"
    assert reply.headers["x-compaction-status"] == "recovered"
    assert len(fake.overflows) == 1
    assert len(fake.chat_requests) == 2
    assert fake.summary_requests
    assert recoveries("retried") == retried + 1
    assert (
        REGISTRY.get_sample_value(
            "compaction_proxy_compactions_total",
            {"trigger": "context-overflow", "mechanism": "summary", "outcome": "committed"},
        )
        or 0.0
    ) > overflow_compactions
    retried_body = fake.chat_requests[-1].body
    assert retried_body is not None
    assert retried_body["messages"][0] == system()
    assert "<compacted-summary>" in retried_body["messages"][1]["content"]
    assert retried_body["messages"][-1] == user("Carry on.")

    summaries = len(fake.summary_requests)
    later = [*messages, assistant("Ported the first module."), user("Next module.")]
    again = await ask(proxy, later)
    assert again.headers["x-compaction-status"] in {"none", "compacted"}
    assert len(fake.overflows) == 1  # no new overflow: the checkpoint is reused
    assert len(fake.summary_requests) == summaries
    assert "<compacted-summary>" in fake.chat_requests[-1].body["messages"][1]["content"]


async def test_streaming_request_that_overflows_gets_a_normal_stream(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    fake.reply = lambda body: "streamed after recovery"
    raw = await ask(proxy, long_history(), stream=True)
    assert raw.headers["x-compaction-status"] == "recovered"
    text = ""
    async for chunk in raw.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "streamed after recovery"
    assert len(fake.overflows) == 1


async def test_nothing_compactable_returns_the_original_error(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    passed = recoveries("passed_through")
    messages = [system(), user("lorem ipsum " * 9_000)]
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, messages)
    assert caught.value.response.content == fake.overflows[0]
    assert caught.value.response.headers["content-type"] == "application/json"
    assert len(fake.received) == 1
    assert recoveries("passed_through") == passed + 1


async def test_failed_summary_after_a_committed_prune_still_retries(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    fake.summary_failures = 1
    bulky = " ".join(f"frame{i % 89}" for i in range(9_000))
    messages = [
        *long_history(turns=28, last="What broke?")[:-1],
        assistant(None, ("big", "bash", '{"command": "dump"}')),
        tool("big", bulky),
        assistant("The dump shows a crash in the frame walker."),
        user("What broke?"),
    ]
    reply = await ask(proxy, messages)
    assert reply.headers["x-compaction-status"] == "recovered"
    assert len(fake.summary_requests) == 1  # it failed
    assert len(fake.chat_requests) == 2
    forwarded = fake.chat_requests[-1].body
    assert forwarded is not None
    assert "characters removed by compaction-proxy" in forwarded["messages"][-3]["content"]
    assert forwarded["messages"][-2:] == messages[-2:]


async def test_failed_summary_and_nothing_pruned_returns_the_original_error(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    fake.summary_failures = 1
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, long_history())
    assert caught.value.response.content == fake.overflows[0]
    assert len(fake.chat_requests) == 1
    assert len(fake.summary_requests) == 1


async def test_retry_that_overflows_again_returns_the_second_error(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    # The live turn fits the window, but not with the reply room the client asks for.
    messages = long_history(turns=10, last="review this: " + "tok " * 15_000)
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, messages, max_tokens=2_000)
    assert len(fake.overflows) == 2
    assert fake.overflows[0] != fake.overflows[1]
    assert caught.value.response.content == fake.overflows[1]
    assert len(fake.chat_requests) == 2  # no third request


async def test_a_live_turn_larger_than_the_window_gets_the_upstreams_own_error(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    messages = long_history(turns=10, last="review this: " + "tok " * 17_000)
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, messages)
    assert caught.value.response.content == fake.overflows[0]
    assert len(fake.chat_requests) == 1  # sent as the client sent it, and not again
    assert fake.chat_requests[0].body == {"model": MODEL, "messages": messages}
    assert fake.summary_requests == []


@pytest.mark.parametrize(
    ("status", "body"),
    [
        (
            400,
            b'{"error":{"message":"Invalid value for \'temperature\'","type":'
            b'"invalid_request_error","param":"temperature","code":"invalid_value"}}',
        ),
        (
            429,
            b'{"error":{"message":"Request too large for gpt-4o in organization org-x on tokens '
            b'per min (TPM): Limit 30000, Requested 45000.","type":"tokens","param":null,'
            b'"code":"rate_limit_exceeded"}}',
        ),
    ],
)
async def test_other_errors_pass_through_without_compaction(
    proxy: RunningProxy, fake: FakeUpstream, status: int, body: bytes
) -> None:
    fake.fail_next(status, body)
    with pytest.raises(openai.APIStatusError) as caught:
        await ask(proxy, long_history())
    assert caught.value.status_code == status
    assert caught.value.response.content == body
    assert fake.summary_requests == []
    conversation = caught.value.response.headers["x-compaction-conversation"]
    assert (await proxy.store.load(conversation)).records == ()


async def test_engine_claiming_success_without_a_commit_never_causes_a_retry(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    calls = 0
    engine = proxy.app[SERVICES].engine

    async def pruned_nothing_but_says_so(job: Any, state: Any, surface: Any, trigger: str) -> Any:
        nonlocal calls
        calls += 1
        return state, surface, True

    async def summarized_nothing_but_says_so(job: Any, state: Any, *args: Any) -> Round:
        nonlocal calls
        calls += 1
        return Round(Outcome.COMMITTED, state=state)

    engine.prune = pruned_nothing_but_says_so  # type: ignore[method-assign]
    engine.summarize_round = summarized_nothing_but_says_so  # type: ignore[method-assign]
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, long_history())
    assert calls >= 2
    assert caught.value.response.content == fake.overflows[0]
    assert len(fake.received) == 1


async def test_zero_overflow_retries_disables_recovery(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = REAL_WINDOW
    proxy = await make_proxy(
        routes=[
            {
                "model": "tight-*",
                "base_url": upstream_url,
                "context_window": 128_000,
                "policy": {"max_overflow_retries": 0, **MASKING_OFF},
            }
        ]
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await ask(proxy, long_history())
    assert orjson.loads(caught.value.response.content)["error"]["code"] == (
        "context_length_exceeded"
    )
    assert len(fake.received) == 1


async def test_overflow_without_a_stated_limit_on_an_unknown_model_recovers(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """No window configured, none in litellm's map, none in the error: the failed request's
    own size bounds the summary calls, and the bound shrinks when a summary call overflows."""
    fake.windows["mystery-model"] = REAL_WINDOW
    fake.overflow_states_limit = False
    proxy = await make_proxy(
        routes=[{"model": "mystery-*", "base_url": upstream_url, "policy": MASKING_OFF}]
    )
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-o", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="mystery-model",
            messages=long_history(),  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "recovered"
    assert b"exceeds the context window" in fake.overflows[0]
    fits = [r.prompt_tokens + cap_of(r) <= REAL_WINDOW for r in fake.summary_requests]
    assert fits[-1]  # the summary that committed fit the real window
    assert len(fake.overflows) == 1 + fits.count(False)  # the request's, then too-large guesses


def cap_of(received: Any) -> int:
    body = received.body or {}
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)


async def test_an_overflow_is_recovered_by_masking_without_a_summary(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Masking on (the default): the cheapest relief that fits comes first in recovery too."""
    fake.windows[MODEL] = REAL_WINDOW
    proxy = await make_proxy(routes=[tight_route(upstream_url)])
    history = long_history(turns=40)
    for index in range(3, 40, 2):  # bigger outputs: clearing the old ones frees plenty
        history[index] = {**history[index], "content": history[index]["content"] * 2}
    raw = await ask(proxy, history)
    assert raw.headers["x-compaction-status"] == "recovered"
    assert fake.summary_requests == [] and len(fake.overflows) == 1
    sent = fake.chat_requests[-1].body["messages"]
    assert any("compaction-proxy cleared this output of bash(" in str(m["content"]) for m in sent)
    assert sent[-1] == history[-1]
