"""Compaction ahead of need: the request that reaches the threshold does not wait for a summary
call, because the checkpoint was prepared in the background from an earlier request. From
``must_compact`` on (the window less the room its answer needs; halfway from the threshold to
the window while nothing is known of the answers) a request that outgrew the round goes at once
with its older observations cut for it alone (the bridge); only one the bridge cannot fit, or
a history on first contact, waits for a summary."""

from __future__ import annotations

import asyncio
import signal
import time
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from compaction_proxy.compaction.summarize import framed_summary_text
from compaction_proxy.conversation.replacements import Prune
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, assistant, system, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, counter, route
from tests.processes import proxy_process
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

MODEL = "agent-model"
WINDOW = 16_000
SUMMARY_SECONDS = 1.0
THINK_SECONDS = 0.6  # an agent's time between requests (the model answering, tools running)


def routes(upstream_url: str, **policy: Any) -> list[dict[str, Any]]:
    return [route(upstream_url, MODEL, WINDOW, **{**MASKING_OFF, **policy})]


def lease_waits() -> float:
    return sum(
        counter("compaction_proxy_lease_waits_total", result=result)
        for result in ("released", "timed_out")
    )


def rounds_timed(outcome: str) -> tuple[float, float]:
    """Background rounds that ended with ``outcome``, and their seconds, as exposed."""
    name, labels = "compaction_proxy_precompaction_duration_seconds", {"outcome": outcome}
    count = counter(f"{name}_count", **labels)
    return count, counter(f"{name}_sum", **labels)


def tool_rounds(turns: int) -> list[dict[str, Any]]:
    """A conversation of ``turns`` tool rounds of about 480 tokens each: 24 turns are over the
    precompaction watermark (11,200 tokens), 27 over the threshold (12,800), 31 over
    ``must_compact`` (14,400)."""
    return [
        system(),
        user("Make the importer idempotent."),
        *agent_turns(turns, output="importer log line " * 150),
    ]


async def send(
    proxy: RunningProxy, messages: list[dict[str, Any]], **fields: Any
) -> tuple[str, float]:
    """The compaction status and the latency of one request."""
    started = time.perf_counter()
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
            **fields,
        )
    return raw.headers["x-compaction-status"], time.perf_counter() - started


def carries_a_checkpoint(fake: FakeUpstream) -> bool:
    body = fake.chat_requests[-1].body or {}
    return any(framed_summary_text(m) is not None for m in body.get("messages", []))


async def grow(proxy: RunningProxy, turns: int) -> tuple[list[str], list[float]]:
    """A conversation growing by one tool round (about 450 tokens) per request."""
    statuses, latencies = [], []
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        for turn in range(1, turns + 1):
            messages = tool_rounds(turn)
            started = time.perf_counter()
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
            )
            latencies.append(time.perf_counter() - started)
            statuses.append(raw.headers["x-compaction-status"])
            await asyncio.sleep(THINK_SECONDS)
    return statuses, latencies


@pytest.mark.slow  # a process, or a latency compared over many requests
async def test_the_threshold_request_finds_its_checkpoint_ready(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = SUMMARY_SECONDS
    proxy = await make_proxy(routes=routes(upstream_url))
    waits_before, timed_before = lease_waits(), rounds_timed("committed")
    statuses, latencies = await grow(proxy, 32)
    await proxy.app[SERVICES].background.idle()
    assert "precompacting" in statuses and fake.summary_requests
    count, seconds = (a - b for a, b in zip(rounds_timed("committed"), timed_before, strict=True))
    assert count == len(fake.summary_requests) and seconds >= count * SUMMARY_SECONDS
    # No request waited on a summary call: every summary was a background round's, none
    # waited on the lease of one (and, loosely, none took as long as one summary call).
    assert lease_waits() == waits_before
    assert max(latencies) < SUMMARY_SECONDS, latencies
    # Every request after the first that carried the checkpoint still carries one, says so,
    # and none was forwarded at or above the threshold.
    carried = [
        any(framed_summary_text(m) is not None for m in (r.body or {}).get("messages", []))
        for r in fake.chat_requests
    ]
    assert all(carried[carried.index(True) :])
    assert [status == "compacted" for status in statuses] == carried
    assert all(r.prompt_tokens < 0.8 * WINDOW for r in fake.chat_requests)


async def test_one_tenant_running_many_agents_leaves_a_background_slot_for_another(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Four slots, a tenant's share one. Tenant A's four conversations crossing the
    precompaction watermark together start three rounds, not four; tenant B's, crossing it
    while they run, gets the slot left and its checkpoint prepared ahead (it would compact at
    its threshold, waiting for a summary call, were every slot A's)."""
    fake.summary_delay = 3.0
    proxy = await make_proxy(routes=routes(upstream_url), precompact_concurrency=4)

    async def cross_the_watermark(key: str, task: str) -> str:
        messages = tool_rounds(25)  # over the watermark (11,200 tokens), under the threshold
        messages[1] = user(task)
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key=key, max_retries=0) as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
            )
        return raw.headers["x-compaction-status"]

    statuses = [
        await cross_the_watermark("sk-a", f"Agent {n}: fix the importer.") for n in range(4)
    ]
    assert statuses == ["precompacting"] * 3 + ["none"]
    assert await cross_the_watermark("sk-b", "Fix the exporter.") == "precompacting"


@pytest.mark.slow  # a process, or a latency compared over many requests
async def test_without_precompaction_the_threshold_request_waits(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The same conversation with precompaction off: the baseline the first test beats."""
    fake.summary_delay = SUMMARY_SECONDS
    proxy = await make_proxy(routes=routes(upstream_url, precompact_ratio=0))
    statuses, latencies = await grow(proxy, 32)
    assert "compacted" in statuses and "precompacting" not in statuses
    assert max(latencies) >= SUMMARY_SECONDS


async def test_a_background_round_cut_short_by_shutdown_frees_its_lease(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = 30  # still summarizing when the proxy stops
    proxy = await make_proxy(routes=routes(upstream_url))
    log_lines = "importer log line " * 150
    messages = [system(), user("Make it idempotent."), *agent_turns(26, output=log_lines)]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "precompacting"
    conversation = raw.headers["x-compaction-conversation"]
    await asyncio.sleep(0.2)
    assert proxy.app[SERVICES].background.in_flight == 1
    assert (await proxy.store.load(conversation)).lease_owner is not None
    cancelled_before, _ = rounds_timed("cancelled")
    await proxy.app[SERVICES].background.close()  # what the app's cleanup does on SIGTERM
    assert rounds_timed("cancelled")[0] == cancelled_before + 1
    state = await proxy.store.load(conversation)
    assert state.lease_owner is None
    log = await proxy.read_log(conversation, limit=1000)
    # Cancelled, not failed: the round went before the HTTP client it was calling through.
    assert log[-1]["type"] == "compaction/end" and log[-1]["outcome"] == "cancelled"


async def test_two_replicas_prepare_one_checkpoint_per_span(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    fake.summary_delay = 1.0
    replicas = [
        await make_proxy(routes=routes(upstream_url), store_url=private_redis.url) for _ in range(2)
    ]
    log_lines = "importer log line " * 150
    messages = [system(), user("Make it idempotent."), *agent_turns(26, output=log_lines)]

    async def send(proxy: RunningProxy) -> str:
        async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as c:
            raw = await c.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=messages,  # type: ignore[arg-type]
            )
        return raw.headers["x-compaction-status"]

    statuses = await asyncio.gather(*(send(proxy) for proxy in replicas))
    assert "precompacting" in statuses
    for proxy in replicas:
        await proxy.app[SERVICES].background.idle()
    assert len(fake.summary_requests) == 1


async def round_in_flight(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    *,
    summary_seconds: float,
    rounds: int,
    **policy: Any,
) -> tuple[RunningProxy, float]:
    """A proxy whose conversation (``rounds`` tool rounds) has just started a background round
    that summarizes for ``summary_seconds``; and the lease waits counted before it."""
    fake.summary_delay = summary_seconds
    proxy = await make_proxy(routes=routes(upstream_url, **policy))
    waits_before = lease_waits()
    assert (await send(proxy, tool_rounds(rounds)))[0] == "precompacting"
    return proxy, waits_before


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_a_request_that_outgrew_the_round_in_flight_goes_at_once_over_the_threshold(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy, waits_before = await round_in_flight(
        make_proxy, upstream_url, fake, summary_seconds=2.0, rounds=26
    )
    status, latency = await send(proxy, tool_rounds(29))  # the round is still summarizing
    assert status == "none" and latency < fake.summary_delay
    assert 0.8 * WINDOW <= fake.chat_requests[-1].prompt_tokens < 0.9 * WINDOW
    assert not carries_a_checkpoint(fake) and lease_waits() == waits_before
    await proxy.app[SERVICES].background.idle()
    assert (await send(proxy, tool_rounds(30)))[0] == "compacted"  # the round's checkpoint
    assert carries_a_checkpoint(fake) and fake.chat_requests[-1].prompt_tokens < 0.8 * WINDOW
    assert len(fake.summary_requests) == 1


async def test_an_observation_to_prune_does_not_wait_for_the_round_in_flight(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Pruning takes the lease too; under ``must_compact`` a busy lease is not waited for."""
    proxy, waits_before = await round_in_flight(
        make_proxy, upstream_url, fake, summary_seconds=2.0, rounds=24, retain_tokens=500
    )
    big_read = [
        assistant(None, ("call_read", "bash", '{"command": "cat importer.log"}')),
        tool("call_read", "importer log line " * 460),  # over the pruner's 8,192 characters
    ]
    for i in range(3):  # enough after it that it lies outside the retain budget
        big_read.append(assistant(None, (f"call_ls{i}", "bash", '{"command": "ls"}')))
        big_read.append(tool(f"call_ls{i}", "importer.py " * 100))
    status, latency = await send(proxy, [*tool_rounds(24), *big_read])
    assert status == "none" and latency < fake.summary_delay
    assert 0.8 * WINDOW <= fake.chat_requests[-1].prompt_tokens < 0.9 * WINDOW
    assert lease_waits() == waits_before


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_a_turn_that_jumps_both_watermarks_is_compacted_behind_it(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.summary_delay = 2.0
    proxy = await make_proxy(routes=routes(upstream_url))
    status, latency = await send(proxy, tool_rounds(29))  # first contact, over the threshold
    assert status == "precompacting" and latency < fake.summary_delay
    await proxy.app[SERVICES].background.idle()
    await send(proxy, tool_rounds(30))
    assert carries_a_checkpoint(fake) and fake.chat_requests[-1].prompt_tokens < 0.8 * WINDOW


def cut_by_the_proxy(message: dict[str, Any]) -> bool:
    return (
        isinstance(message.get("content"), str)
        and "removed by compaction-proxy" in message["content"]
    )


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_from_must_compact_on_a_request_goes_at_once_with_older_observations_cut_for_it(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The bridge: too close to the window to go as it is, while the round is summarizing,
    the request goes at once with its oldest observations cut harder, as few as it takes;
    nothing is committed, and the request after the checkpoint carries no cut."""
    proxy, waits_before = await round_in_flight(
        make_proxy, upstream_url, fake, summary_seconds=1.5, rounds=26
    )
    status, latency = await send(proxy, tool_rounds(34))  # too close to the window
    assert status == "pruned" and latency < 1.0 and lease_waits() == waits_before
    bridged = fake.chat_requests[-1]
    assert 0.8 * WINDOW <= bridged.prompt_tokens < WINDOW - WINDOW // 32
    tools = [m for m in (bridged.body or {})["messages"] if m["role"] == "tool"]
    cut = [cut_by_the_proxy(m) for m in tools]
    assert cut[0] and not all(cut), "the oldest observations are cut, not every one"
    assert cut == sorted(cut, reverse=True), "oldest first"
    assert tools[-1]["content"] == tool_rounds(34)[-1]["content"], "the live turn is whole"
    conversation = (await proxy.store.list_conversations())[0].conversation
    records = (await proxy.store.load(conversation)).records
    assert not any(isinstance(r, Prune) for r in records), "the cuts are not committed"
    await proxy.app[SERVICES].background.idle()
    assert (await send(proxy, tool_rounds(35)))[0] == "compacted"
    after = (fake.chat_requests[-1].body or {})["messages"]
    assert carries_a_checkpoint(fake) and not any(cut_by_the_proxy(m) for m in after)
    assert len(fake.summary_requests) == 1, "it did not start a second round"


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_from_must_compact_on_a_request_the_bridge_cannot_fit_waits_for_the_round(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Observations (2,700 characters) below what the bridge cuts (twice the 2,500 it
    keeps): nothing to cut, so the request waits on the round in flight, not another."""
    proxy, waits_before = await round_in_flight(
        make_proxy,
        upstream_url,
        fake,
        summary_seconds=1.5,
        rounds=26,
        pruner={"bridge_head_chars": 2_000, "bridge_tail_chars": 500},
    )
    status, latency = await send(proxy, tool_rounds(34))
    assert latency >= 1.0 and lease_waits() == waits_before + 1
    assert status == "compacted", "the client waited for a summary: the status says so"
    assert carries_a_checkpoint(fake) and fake.chat_requests[-1].prompt_tokens < 0.8 * WINDOW
    assert len(fake.summary_requests) == 1, "it waited for the round rather than start another"
    samples = {"trigger": "pressure", "mechanism": "bridge", "outcome": "not_enough"}
    assert REGISTRY.get_sample_value("compaction_proxy_compactions_total", samples)


async def test_on_first_contact_a_history_past_must_compact_goes_at_once_and_is_summarized_behind(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """No answer yet in this conversation (new to the proxy, resumed, or its state lost): it
    does not wait on a summary. It goes at once with older observations cut for it alone, and
    its checkpoint is prepared in the background for the next request."""
    fake.summary_delay = 1.0
    proxy = await make_proxy(routes=routes(upstream_url))
    status, latency = await send(proxy, tool_rounds(34))
    assert status == "pruned" and latency < fake.summary_delay
    sent = (fake.chat_requests[-1].body or {})["messages"]
    assert any(cut_by_the_proxy(m) for m in sent) and not carries_a_checkpoint(fake)
    assert fake.chat_requests[-1].prompt_tokens < WINDOW
    await proxy.app[SERVICES].background.idle()
    assert (await send(proxy, tool_rounds(35)))[0] == "compacted"
    assert carries_a_checkpoint(fake) and len(fake.summary_requests) == 1


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_on_first_contact_a_history_the_cuts_cannot_fit_goes_at_once_masked(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Observations cut to their head and tail are still too many for the window, and the
    store holds nothing of the conversation (new, or lost): its oldest observations are
    cleared to placeholders for this request (even with masking off on the route: the only
    step left would leave out whole turns), every turn of the agent's kept, and it goes at
    once within its window while its checkpoint is prepared behind it (it waited on rounds of
    summaries before: seconds, 14 to 28 after a store wipe)."""
    fake.summary_delay = 1.0
    proxy = await make_proxy(routes=routes(upstream_url))
    messages = tool_rounds(120)
    status, latency = await send(proxy, messages)
    assert status == "masked" and latency < 1.0
    sent = fake.chat_requests[-1]
    assert sent.prompt_tokens < WINDOW and not carries_a_checkpoint(fake)
    assert sent.body is not None
    forwarded = sent.body["messages"]
    assert len(forwarded) == len(messages) and forwarded[-3:] == messages[-3:]
    calls = [m for m in messages if m["role"] == "assistant"]
    assert [m for m in forwarded if m["role"] == "assistant"] == calls
    assert "cleared this output of bash" in forwarded[3]["content"]
    await proxy.app[SERVICES].background.idle()
    assert len(fake.summary_requests) >= 1  # the checkpoint, prepared behind it
    status, _ = await send(proxy, tool_rounds(121))
    assert status == "compacted" and carries_a_checkpoint(fake)


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_on_first_contact_a_history_even_masks_cannot_fit_goes_at_once_trimmed(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Every observation cleared is still too much: the oldest turns are left out besides,
    for a marker, and the turns kept keep their placeholders; the request goes at once."""
    fake.summary_delay = 1.0
    proxy = await make_proxy(routes=routes(upstream_url))
    messages = tool_rounds(300)
    status, latency = await send(proxy, messages)
    assert status == "trimmed" and latency < 2.0
    sent = fake.chat_requests[-1]
    assert sent.prompt_tokens < WINDOW and not carries_a_checkpoint(fake)
    assert sent.body is not None
    forwarded = sent.body["messages"]
    assert forwarded[:2] == messages[:2] and "earlier turns" in forwarded[2]["content"]
    assert forwarded[-3:] == messages[-3:]  # the newest observations kept whole
    assert "cleared this output of bash" in forwarded[4]["content"]
    await proxy.app[SERVICES].background.idle()
    assert len(fake.summary_requests) >= 1


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_after_small_answers_a_request_goes_at_once_until_the_window_less_its_answer(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The fake's answers are a few tokens, so the reserve shrinks to a 32nd of the window and
    a request beyond the old halfway mark (14,400) still does not wait for the round."""
    proxy, waits_before = await round_in_flight(
        make_proxy, upstream_url, fake, summary_seconds=2.0, rounds=26
    )
    status, latency = await send(proxy, tool_rounds(32))
    assert status == "none" and latency < fake.summary_delay
    assert 0.9 * WINDOW <= fake.chat_requests[-1].prompt_tokens < WINDOW - WINDOW // 32
    assert not carries_a_checkpoint(fake) and lease_waits() == waits_before
    await proxy.app[SERVICES].background.idle()
    assert (await send(proxy, tool_rounds(33)))[0] == "compacted"
    assert carries_a_checkpoint(fake) and len(fake.summary_requests) == 1


@pytest.mark.slow  # seconds of examples or waits: the full run has it
async def test_a_request_whose_declared_answer_would_not_fit_is_bridged_to_leave_it_room(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Over the threshold with ``max_tokens`` 3,000, the prompt as sent leaves less than the
    answer may take (the provider would refuse it): the bridge cuts it to leave that room,
    and it goes at once instead of waiting for the round in flight."""
    proxy, waits_before = await round_in_flight(
        make_proxy, upstream_url, fake, summary_seconds=1.5, rounds=26
    )
    status, latency = await send(proxy, tool_rounds(29), max_tokens=3_000)
    assert status == "pruned" and latency < 1.0 and lease_waits() == waits_before
    assert fake.chat_requests[-1].prompt_tokens + 3_000 <= WINDOW
    assert not carries_a_checkpoint(fake)
    await proxy.app[SERVICES].background.idle()
    assert len(fake.summary_requests) == 1


@pytest.mark.slow  # a process, or a latency compared over many requests
async def test_sigterm_during_a_background_summary_frees_the_lease_and_exits(
    upstream_url: str, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """On a real process: SIGTERM while a background round is summarizing. The process exits
    well inside its shutdown timeout, the attempt is closed in the log and the lease is free,
    so the next request (from any replica) compacts at once."""
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 60.0
    env = {
        "REDIS_URL": private_redis.url,
        "COMPACTION_PROXY_TENANT_SECRET": "sigterm-secret",
        "COMPACTION_PROXY_ROUTES": orjson.dumps(routes(upstream_url)).decode(),
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
    }
    async with proxy_process(env) as (process, base):
        async with openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="sk-a") as client:
            raw = await client.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=tool_rounds(26),  # type: ignore[arg-type]
            )
        assert raw.headers["x-compaction-status"] == "precompacting"
        conversation = raw.headers["x-compaction-conversation"]
        while not fake.summary_requests:
            await asyncio.sleep(0.05)
        started = time.monotonic()
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 20) == 0
        assert time.monotonic() - started < 10
    store = RedisStore(private_redis.url)
    try:
        state = await store.load(conversation)
        log = [e for _, e in (await store.read_log(conversation, limit=1000)).events]
    finally:
        await store.close()
    assert state.lease_owner is None
    # Cancelled, not failed: the round went before the HTTP client it was calling through.
    assert log[-1]["type"] == "compaction/end" and log[-1]["outcome"] == "cancelled"
