"""Shapes real agents send that the proxy's own tests did not: big live observations, one
message too large for a summary call, a smaller summary model, moved ``cache_control``, and
conversations that share their first message."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from compaction_proxy.compaction.summarize import framed_summary_text
from compaction_proxy.testing.fake_answers import pairing_error
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, chat, counter, route
from tests.synthetic import agent_conversation
from tests.transcripts import replay_requests

MODEL = "agent-model"
Message = dict[str, Any]
MARKER = "characters removed by compaction-proxy"


def synchronous(
    upstream_url: str, window: int, model: str = MODEL, **policy: Any
) -> dict[str, Any]:
    """Precompaction off: these tests look at the request that compacts."""
    return route(upstream_url, model, window, **{"precompact_ratio": 0, **MASKING_OFF, **policy})


async def post(proxy: RunningProxy, messages: list[Message], **extra: Any) -> Any:
    return await chat(proxy.url, messages, MODEL, "sk-agent", **extra)


async def replay(
    proxy: RunningProxy,
    messages: list[Message],
    shape: Callable[[list[Message]], list[Message]] = lambda m: m,
) -> list[str]:
    """Post every request the agent made (shaped as the client sends it); the statuses."""
    statuses = []
    for history in replay_requests(messages):
        reply = await post(proxy, shape(history))
        assert reply.parse().choices[0].message.content == "ok"
        statuses.append(reply.headers["x-compaction-status"])
    return statuses


def assert_provider_accepted_everything(fake: FakeUpstream, window: int) -> None:
    assert fake.rejected == [] and fake.overflows == []
    for received in fake.received:
        assert received.body is not None
        cap = received.body.get("max_tokens") or received.body.get("max_completion_tokens") or 0
        assert received.prompt_tokens + cap <= window
        assert pairing_error(received.body["messages"]) is None


async def test_a_big_file_read_under_pressure_reaches_the_model_whole(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[synchronous(upstream_url, 16_000)])
    fake.windows[MODEL] = 16_000
    file = "\n".join(f"{n:5}\tdef handler_{n}(request, cache, index):" for n in range(500))
    assert len(file) > 20_000
    history = [
        system(),
        user("Fix the request cache."),
        *agent_turns(12, output="cache trace line " * 170),
        assistant(None, ("read", "bash", '{"command": "cat -n src/handlers.py"}')),
        tool("read", file),
    ]
    reply = await post(proxy, history)
    assert reply.headers["x-compaction-status"] == "compacted"
    assert fake.chat_requests[-1].body is not None
    assert fake.chat_requests[-1].body["messages"][-1] == history[-1]  # whole, as sent

    later = [*history, assistant("The handlers share one cache."), user("Fix it.")]
    await post(proxy, later)
    forwarded = fake.chat_requests[-1].body
    assert forwarded is not None and forwarded["messages"][-2:] == later[-2:]
    assert_provider_accepted_everything(fake, 16_000)


async def test_a_message_too_big_for_the_summary_call_is_cut_inside_it_only(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    # User observations are not pruned here, so an 11k-token observation stays in the history
    # and lands in a span next to the first checkpoint.
    window = 16_000
    fake.windows[MODEL] = window
    policy = {"pruner": {"user_messages": False}}
    proxy = await make_proxy(routes=[synchronous(upstream_url, window, **policy)])
    messages = agent_conversation(
        7, turns=30, observation_style=True, parallel_every=0, big_reads={8: 40_000}
    )
    statuses = await replay(proxy, messages)
    assert_provider_accepted_everything(fake, window)
    big = messages[2 + 2 * 8 + 1]["content"]
    cut_in_a_summary_call = [
        r
        for r in fake.summary_requests
        if r.body is not None
        and any(
            big[:2000] in str(m["content"]) and MARKER in m["content"] for m in r.body["messages"]
        )
    ]
    assert cut_in_a_summary_call, "the oversized observation never went into a summary call"
    assert statuses.count("compacted") >= 2
    # The conversation itself never saw the cut: no prune records, the checkpoints replaced it.
    last = fake.chat_requests[-1].body
    assert last is not None and all(MARKER not in str(m["content"]) for m in last["messages"])


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_summary_calls_fit_a_summary_model_with_a_smaller_window(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = 32_000
    fake.windows["small-summarizer"] = 8_000
    proxy = await make_proxy(
        routes=[
            synchronous(upstream_url, 32_000, summary_model="small-summarizer"),
            synchronous(upstream_url, 8_000, model="small-summarizer"),
        ]
    )
    statuses = await replay(proxy, agent_conversation(3, turns=45))
    assert fake.summary_requests and {"compacted", "precompacting"} & set(statuses)
    for received in fake.summary_requests:
        assert received.body is not None and received.body["model"] == "small-summarizer"
        assert received.body["max_tokens"] <= 2_000  # a quarter of the summarizer's window
    assert_provider_accepted_everything(fake, 32_000)
    assert all(r.prompt_tokens + 2_000 <= 8_000 for r in fake.summary_requests)


def caching_client(history: list[Message]) -> list[Message]:
    """Anthropic-style caching through the OpenAI format, as some coding agents do it: the two
    newest user messages carry cache breakpoints as text parts; every earlier message goes back
    to a plain string."""
    users = [i for i, m in enumerate(history) if m["role"] == "user"][-2:]
    shaped = list(history)
    for i in users:
        text = str(history[i]["content"])
        part = {"type": "text", "text": text, "cache_control": {"type": "ephemeral"}}
        shaped[i] = {**history[i], "content": [part]}
    return shaped


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_a_moving_cache_breakpoint_keeps_checkpoints_applying(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    window = 16_000
    fake.windows[MODEL] = window
    # Nothing retained beyond the live turn (and a small summary cap, so a span is never cut
    # short to fit the call): spans end at a message that still carried a breakpoint when it
    # was summarized, and has lost it by the next request.
    policy = {"retain_tokens": 0, "max_tokens": 1024}
    proxy = await make_proxy(routes=[synchronous(upstream_url, window, **policy)])
    misses = counter("compaction_proxy_checkpoint_misses_total")
    messages = agent_conversation(4, turns=40, observation_style=True, parallel_every=0)
    await replay(proxy, messages, caching_client)
    assert_provider_accepted_everything(fake, window)
    assert counter("compaction_proxy_checkpoint_misses_total") == misses
    carried = [
        received.body is not None
        and any(framed_summary_text(m) is not None for m in received.body["messages"])
        for received in fake.chat_requests
    ]
    first = carried.index(True)
    assert all(carried[first:])
    for received in fake.chat_requests[first:]:
        assert received.body is not None
        newest = received.body["messages"][-1]
        assert newest["content"][0]["cache_control"] == {"type": "ephemeral"}
    assert len(fake.summary_requests) * 4 < len(fake.chat_requests)


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_conversations_sharing_their_first_message_never_stop_each_other(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    # An agent with fixed instructions: every run starts with the same messages, so runs
    # without a session id share one conversation id.
    window = 16_000
    fake.windows[MODEL] = window
    proxy = await make_proxy(routes=[synchronous(upstream_url, window)])
    stopped = counter("compaction_proxy_proactive_compaction_stopped_total")
    first_run = agent_conversation(5, turns=35)
    second_run = [*first_run[:2], *agent_conversation(6, turns=35)[2:]]
    await replay(proxy, first_run)
    summaries_before = len(fake.summary_requests)
    statuses = await replay(proxy, second_run)
    assert counter("compaction_proxy_proactive_compaction_stopped_total") == stopped
    assert "compacted" in statuses and len(fake.summary_requests) > summaries_before
    assert_provider_accepted_everything(fake, window)


def over_threshold(reason: str) -> float:
    return counter("compaction_proxy_over_threshold_requests_total", route=MODEL, reason=reason)


async def test_a_request_left_over_its_threshold_is_counted_and_logged_once_per_reason(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    caplog: Any,
) -> None:
    fake.summary_failures = 10
    proxy = await make_proxy(routes=[synchronous(upstream_url, 16_000)])
    before = {r: over_threshold(r) for r in ("summary_failed", "breaker")}
    history = [system(), user("Port the scheduler."), *agent_turns(35, output="trace " * 400)]
    for extra in range(3):
        await post(proxy, [*history, *agent_turns(extra + 1, output="more " * 50)])
    assert len(fake.summary_requests) == 1  # then the summarizer's breaker holds it back
    assert over_threshold("summary_failed") == before["summary_failed"] + 1
    assert over_threshold("breaker") == before["breaker"] + 2
    logged = [r for r in caplog.records if "at or above its threshold" in r.getMessage()]
    assert [r.getMessage().rsplit(": ", 1)[1] for r in logged] == [
        "the summary call failed",
        "the summary route failed recently (its breaker is open)",
    ]


async def test_a_live_turn_that_cannot_fit_is_forwarded_as_sent_without_a_summary(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[synchronous(upstream_url, 8_000)])
    before = over_threshold("live_turn")
    history = [
        system(),
        user("Review the patch."),
        *agent_turns(10, output="trace " * 100),
        user("The patch:\n" + "diff line\n" * 6_000),
    ]
    reply = await post(proxy, history)
    assert reply.headers["x-compaction-status"] == "none"
    assert fake.chat_requests[-1].body == {"model": MODEL, "messages": history}
    assert fake.summary_requests == []
    assert over_threshold("live_turn") == before + 1


async def test_integers_beyond_64_bits_survive_a_compacted_request(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(routes=[synchronous(upstream_url, 16_000)])
    big = 123456789012345678901234567890
    history = [system(), user("Port the scheduler."), *agent_turns(35, output="trace " * 400)]
    history.append({**user("Go on."), "x_sequence": big})  # a field of a message kept as sent
    reply = await post(proxy, history, extra_body={"metadata": {"trace": big}})
    assert reply.headers["x-compaction-status"] == "compacted"  # the body was re-serialized
    forwarded = fake.chat_requests[-1].body
    assert forwarded is not None and forwarded["metadata"] == {"trace": big}
    assert forwarded["messages"][-1] == history[-1]
    assert isinstance(forwarded["messages"][-1]["x_sequence"], int)


async def test_a_lone_surrogate_goes_on_as_sent_and_its_conversation_compacts(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, store_url: str
) -> None:
    """A JavaScript agent that cuts a string between the two halves of an emoji sends a lone
    surrogate escape: valid JSON, which some providers take. The proxy reads it, compacts
    around it and sends it on as it came."""
    proxy = await make_proxy(routes=[synchronous(upstream_url, 16_000)], store_url=store_url)
    cut = "deploy log \U0001f680 " * 3 + "\ud83d"  # ends on half an emoji
    history = [
        system(),
        user(f"Fix the deploy script ({uuid.uuid4().hex})."),
        *agent_turns(35, output="trace " * 400 + cut),
        user("Go on."),
    ]
    raw = json.dumps({"model": MODEL, "messages": history}).encode()  # the half as an escape
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-agent"}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"{proxy.url}/chat/completions", data=raw, headers=headers) as response,
    ):
        assert response.status == 200, await response.text()
        assert response.headers["X-Compaction-Status"] == "compacted"
    forwarded = fake.chat_requests[-1].body
    assert forwarded is not None
    assert forwarded["messages"][-2:] == history[-2:]
    assert "\ud83d" in forwarded["messages"][-2]["content"]
    assert len(fake.summary_requests) == 1
