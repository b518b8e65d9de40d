"""Anthropic-format clients compacted: the anthropic SDK runs an agent's history through a
16k window that it outgrows, and the proxy compacts it in Messages form (its summary call
too), the live turn as sent, the API's pairing rules kept, facts kept."""

from __future__ import annotations

import asyncio
import math
import uuid
from typing import Any

import pytest

from compaction_proxy.compaction import planning
from compaction_proxy.compaction.summarize import KEPT_NOTE
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.meter import counter_for
from compaction_proxy.testing.fake_answers import fake_summary, is_summary_request
from compaction_proxy.testing.fake_messages import shell_agent
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.bench.caching import Bill, BreakpointCache
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import ADMIN_AUTH, ADMIN_TOKEN, MASKING_OFF, admin, counter, route

pytest.importorskip("anthropic")

import anthropic

MODEL = "claude-small"
WINDOW = 16_000


def history(rounds: int = 30) -> list[dict[str, Any]]:
    """About 14k tokens: over the 12.8k threshold, inside the 16k window."""
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": f"FACT-5: ticket {uuid.uuid4().hex[:6]}. Fix the importer."}
    ]
    for index in range(rounds):
        call = f"toolu_{index:03d}"
        turns.append(
            {
                "role": "assistant",
                "content": [
                    {"type": "thinking", "thinking": f"Step {index}.", "signature": f"s{index}"},
                    {"type": "tool_use", "id": call, "name": "bash", "input": {"n": index}},
                ],
            }
        )
        result = {"type": "tool_result", "tool_use_id": call, "content": "importer log line " * 150}
        turns.append({"role": "user", "content": [result]})
    turns.append({"role": "user", "content": "Where are we?"})
    return turns


async def start(make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream) -> RunningProxy:
    fake.windows[MODEL] = WINDOW
    policy = {"precompact_ratio": 0, **MASKING_OFF}
    return await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW, **policy)])


def client_of(proxy: RunningProxy) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=proxy.url.removesuffix("/v1"),
        api_key=None,
        default_headers={"x-api-key": "sk-ant-own"},
        max_retries=0,
    )


@pytest.mark.parametrize("stream", [False, True])
async def test_a_long_history_is_compacted_in_messages_form(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, stream: bool
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    turns = history()
    summaries = counter("compaction_proxy_summary_duration_seconds_count", result="ok")
    labels = {"format": "messages", "status": "compacted"}
    compacted = counter("compaction_proxy_format_requests_total", **labels)
    async with client_of(proxy) as client:
        if stream:
            async with client.messages.stream(
                model=MODEL,
                max_tokens=512,
                messages=turns,  # type: ignore[arg-type]
            ) as answer:
                assert await answer.get_final_text() == "Done."
                status = answer.response.headers["x-compaction-status"]
        else:
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=512,
                messages=turns,  # type: ignore[arg-type]
            )
            parsed = await raw.parse()
            assert parsed.content[0].text == "Done."  # type: ignore[union-attr]
            status = raw.headers["x-compaction-status"]
    assert status == "compacted"
    assert counter("compaction_proxy_format_requests_total", **labels) == compacted + 1
    assert fake.messages.refused == []
    (summary,) = fake.messages.summary_requests
    # The summary call went as Messages, to the same host with the client's key.
    assert summary.headers["x-api-key"] == "sk-ant-own"
    # It starts as the conversation's next request would: the span as the client sent it
    # (thinking blocks included, as in any of its requests), then the instruction.
    carried = summary.body["messages"][:-1]
    assert carried == turns[: len(carried)] and len(carried) < len(turns) - 1
    assert is_summary_request(summary.body)
    assert counter("compaction_proxy_summary_duration_seconds_count", result="ok") == summaries + 1
    forwarded = fake.messages.received[-1].body
    sent = forwarded["messages"]
    assert "FACT-5" in str(sent[0]["content"])  # the checkpoint, a user turn, comes first
    assert sent[0]["role"] == "user"
    assert sent[-1] == turns[-1]  # the live turn as sent
    assert len(sent) < len(turns)
    assert forwarded["max_tokens"] == 512 and forwarded["model"] == MODEL


CACHED = {"type": "ephemeral"}
CLAUDE_CODE_LIKE = {
    "system": [
        {"type": "text", "text": "You are a coding agent."},
        {"type": "text", "text": "Project notes. " * 40, "cache_control": CACHED},
    ],
    "tools": [
        {"name": "bash", "description": "Run a command.", "input_schema": {"type": "object"}},
        {
            "name": "read",
            "description": "Read a file.",
            "input_schema": {"type": "object"},
            "cache_control": CACHED,
        },
    ],
    "thinking": {"type": "enabled", "budget_tokens": 1024},
}


def claude_code_like() -> list[dict[str, Any]]:
    """``history()`` with a breakpoint on the newest user block, as Claude Code places it."""
    turns = history()
    turns[-1] = {
        "role": "user",
        "content": [{"type": "text", "text": "Where are we?", "cache_control": CACHED}],
    }
    return turns


async def test_a_summary_call_starts_as_the_clients_next_request_would_to_read_its_cache(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    turns = claude_code_like()
    async with client_of(proxy) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=2048,
            messages=turns,
            **CLAUDE_CODE_LIKE,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "compacted"
    (summary,) = fake.messages.summary_requests
    call = summary.body
    for field in ("system", "tools", "thinking"):  # Anthropic's cache key, as the client sent it
        assert call[field] == CLAUDE_CODE_LIKE[field]
    assert "tool_choice" not in call  # a changed tool_choice would drop the cached turns
    assert call["max_tokens"] > 1024  # room for the summary after the thinking budget
    carried = call["messages"][:-1]
    assert carried[:-1] == turns[: len(carried) - 1]
    # The prefix ends in a breakpoint: the longest prefix the client's requests wrote is read.
    *blocks, last = carried[-1]["content"]
    assert last == {**turns[len(carried) - 1]["content"][-1], "cache_control": CACHED}
    assert blocks == turns[len(carried) - 1]["content"][:-1]
    assert fake.messages.refused == []


async def test_a_summary_call_answered_with_a_tool_call_is_made_again_rebuilt(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    fake.messages.summary_tool_calls = 1
    async with client_of(proxy) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=2048,
            messages=claude_code_like(),
            **CLAUDE_CODE_LIKE,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "compacted"
    cache_safe, rebuilt = fake.messages.summary_requests
    assert "tool_choice" not in cache_safe.body
    assert rebuilt.body["tool_choice"] == {"type": "none"}  # no tool call this time
    assert "thinking" not in str(rebuilt.body["messages"])


async def test_either_summary_call_names_the_end_user_the_clients_request_names(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Claude Code names its user and session in ``metadata.user_id``, by which Anthropic
    attributes what a request asks: the summary calls of that conversation, cache-safe and
    rebuilt, name them too."""
    proxy = await start(make_proxy, upstream_url, fake)
    fake.messages.summary_tool_calls = 1  # the cache-safe call answers with a call: rebuilt
    metadata = {"user_id": "user_5f2e_account_0c1d_session_77ab"}
    async with client_of(proxy) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=2048,
            messages=claude_code_like(),
            metadata=metadata,  # type: ignore[arg-type]
            **CLAUDE_CODE_LIKE,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "compacted"
    cache_safe, rebuilt = fake.messages.summary_requests
    assert cache_safe.body["metadata"] == rebuilt.body["metadata"] == metadata
    assert fake.messages.refused == []


async def test_the_next_request_reuses_the_checkpoint_anchored_on_streamed_usage(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The first answer streams its usage in two events (``message_start`` with the prompt's,
    ``message_delta`` with the answer's); the next request is measured from it."""
    proxy = await start(make_proxy, upstream_url, fake)
    turns = history()
    async with client_of(proxy) as client:
        async with client.messages.stream(
            model=MODEL,
            max_tokens=512,
            messages=turns,  # type: ignore[arg-type]
        ) as first:
            await first.get_final_text()
        more = [
            *turns,
            {"role": "assistant", "content": "On it."},
            {"role": "user", "content": "And?"},
        ]
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=512,
            messages=more,  # type: ignore[arg-type]
        )
    assert raw.headers["x-compaction-status"] == "compacted"  # the checkpoint, reused
    assert len(fake.messages.summary_requests) == 1
    assert "<compacted-summary>" in str(fake.messages.received[-1].body["messages"][0])
    events = await proxy.read_log(raw.headers["x-compaction-conversation"])
    usage = [e for e in events if e["type"] == "usage"]
    assert usage[0]["prompt_tokens"] == fake.messages.input_tokens(
        fake.messages.received[-2].body  # what the upstream counted of the first request
    )
    assert usage[0]["completion_tokens"] == 3
    requests = [e for e in events if e["type"] == "request"]
    assert requests[-1]["anchored"] is True


async def test_bad_input_is_answered_in_anthropics_error_shape(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    async with client_of(proxy) as client:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(
                model=MODEL,
                max_tokens=16,
                messages=[{"role": "user", "content": [{"text": "no type"}]}],  # type: ignore[list-item]
            )
    body = refused.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert fake.messages.received == []


async def test_the_1m_context_beta_header_raises_the_window_compaction_starts_at(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """claude-sonnet-4-5 has 200k in the model map: a 190k-token history is over its 160k
    threshold. Sent with ``anthropic-beta: context-1m-...`` it is far below 1M: as sent."""
    sonnet = "claude-sonnet-4-5"
    fake.windows[sonnet] = 1_000_000
    proxy = await make_proxy(
        routes=[route(upstream_url, "claude-*", precompact_ratio=0, **MASKING_OFF)]
    )
    turns: list[dict[str, Any]] = [{"role": "user", "content": "Read the logs."}]
    for index in range(60):
        call = f"toolu_{index:03d}"
        use = {"type": "tool_use", "id": call, "name": "bash", "input": {"n": index}}
        turns.append({"role": "assistant", "content": [use]})
        log = f"log {index} " + "line of the importer's log " * 480
        turns.append(
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call, "content": log}],
            }
        )
    turns.append({"role": "user", "content": "Where are we?"})
    statuses = {}
    async with client_of(proxy) as client:
        for beta in ("context-1m-2025-08-07", None):
            headers = {"anthropic-beta": f"interleaved-thinking-2025-05-14, {beta}"} if beta else {}
            raw = await client.messages.with_raw_response.create(
                model=sonnet,
                max_tokens=512,
                messages=turns,  # type: ignore[arg-type]
                extra_headers=headers,
            )
            statuses[beta] = raw.headers["x-compaction-status"]
            if beta:  # over 200k's threshold as sent
                assert int(raw.headers["x-compaction-tokens"]) > 160_000
    assert statuses["context-1m-2025-08-07"] == "none"
    assert statuses[None] != "none"
    assert fake.messages.refused == []


BASH = {
    "name": "bash",
    "description": "Run a shell command.",
    "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}},
}
FILES = [f"data_{index}.csv" for index in range(12)]


def data_file(name: str) -> str:
    """About 2.5k tokens of one data file, as the shell tool prints it."""
    return "\n".join(f"{name} row {row}: " + "value " * 10 for row in range(160))


def next_turns(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The assistant's turn as the SDK returned it, and the tool results answering it."""
    turns = [{"role": "assistant", "content": blocks}]
    results = [
        {"type": "tool_result", "tool_use_id": b["id"], "content": data_file(b["input"]["command"])}
        for b in blocks
        if b["type"] == "tool_use"
    ]
    return turns + ([{"role": "user", "content": results}] if results else [])


Sent = list[list[dict[str, Any]]]  # the turns of every request the agent made


def sync_loop(base: str, first: str) -> Sent:
    """The agent loop with the synchronous client (run in a thread: the proxy serves in the
    test's event loop)."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": first}]
    sent: Sent = []
    with anthropic.Anthropic(base_url=base, api_key="sk-ant-own", max_retries=0) as client:
        while turns[-1]["role"] == "user":
            sent.append(list(turns))
            reply = client.messages.create(
                model=MODEL,
                max_tokens=2048,
                thinking={"type": "enabled", "budget_tokens": 1024},
                tools=[BASH],  # type: ignore[list-item]
                messages=turns,  # type: ignore[arg-type]
            )
            turns += next_turns([b.model_dump(exclude_none=True) for b in reply.content])
    return [*sent, turns]


async def async_loop(base: str, first: str, stream: bool) -> Sent:
    turns: list[dict[str, Any]] = [{"role": "user", "content": first}]
    sent: Sent = []
    async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant-own", max_retries=0) as c:
        while turns[-1]["role"] == "user":
            sent.append(list(turns))
            ask: dict[str, Any] = {
                "model": MODEL,
                "max_tokens": 2048,
                "thinking": {"type": "enabled", "budget_tokens": 1024},
                "tools": [BASH],
                "messages": turns,
            }
            if stream:
                async with c.messages.stream(**ask) as answer:
                    reply = await answer.get_final_message()
            else:
                reply = await c.messages.create(**ask)
            turns += next_turns([b.model_dump(exclude_none=True) for b in reply.content])
    return [*sent, turns]


@pytest.mark.parametrize("client", ["sync", "async", "streamed"])
async def test_an_sdk_agent_loop_with_thinking_and_tools_is_compacted_and_never_refused(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, client: str
) -> None:
    """Twelve files of 2.5k tokens through a 16k window: the history outgrows it three times
    over. The thinking of the round in progress must reach the upstream as signed."""
    proxy = await start(make_proxy, upstream_url, fake)
    fake.messages.script = shell_agent(FILES, tool="bash")
    base = proxy.url.removesuffix("/v1")
    first = f"FACT-7: the ticket is {uuid.uuid4().hex[:6]}. Print every data file."
    if client == "sync":
        *asked, turns = await asyncio.to_thread(sync_loop, base, first)
    else:
        *asked, turns = await async_loop(base, first, stream=client == "streamed")
    assert turns[-1]["content"][-1]["text"].startswith("Read all")
    assert fake.messages.refused == [] and fake.messages.overflows == []
    forwarded = [r.body for r in fake.messages.received if not is_summary_request(r.body)]
    assert fake.messages.summary_requests, "the history outgrew the window: compacted"
    assert any("<compacted-summary>" in str(body["messages"]) for body in forwarded)
    assert len(forwarded) == len(asked)
    for body, history in zip(forwarded, asked, strict=True):
        # The round in progress as sent: the call, its thinking as signed, and the results.
        live = history[-2:] if len(history) > 1 else history
        assert body["messages"][-len(live) :] == live
    assert "FACT-7" in str(forwarded[-1]["messages"])


async def test_the_meter_is_never_far_under_on_first_contact_and_close_once_anchored(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The upstream counts with a tokenizer the proxy lacks: 1.3 times the count of the
    proxy's stand-in for Claude. First contact: never more than 10 % under (about 20 % without
    calibration). Anchored: within 5 %. A new conversation of the same model starts from what
    the first one taught: within 5 % too."""
    proxy = await make_proxy(
        routes=[route(upstream_url, "claude-*", precompact_ratio=0, **MASKING_OFF)]
    )
    await lazy_litellm.loaded()
    stand_in = counter_for("claude-sonnet-4-5")
    fake.messages.count_text = lambda text: math.ceil(1.3 * stand_in(text))
    sonnet = "claude-sonnet-4-5"
    errors = []
    async with client_of(proxy) as client:
        for conversation in range(2):
            turns = history(rounds=8)
            turns[0]["content"] += f" (conversation {conversation})"
            for extra in range(2):
                raw = await client.messages.with_raw_response.create(
                    model=sonnet,
                    max_tokens=512,
                    messages=turns,  # type: ignore[arg-type]
                )
                counted = fake.messages.input_tokens(fake.messages.received[-1].body)
                errors.append(int(raw.headers["x-compaction-tokens"]) / counted - 1)
                more = {"role": "user", "content": f"More, part {extra}. " * 200}
                turns = [*turns, {"role": "assistant", "content": "Next."}, more]
    first_contact, anchored, learned, anchored_again = errors
    assert first_contact > -0.10
    assert abs(anchored) < 0.05 and abs(anchored_again) < 0.05
    assert abs(learned) < 0.05


async def test_manual_compaction_of_a_messages_conversation_summarizes_in_messages_form(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = 64_000
    proxy = await make_proxy(
        admin_token=ADMIN_TOKEN, routes=[route(upstream_url, "claude-*", 64_000, **MASKING_OFF)]
    )
    turns = history(rounds=10)  # well under the threshold: nothing compacted on its own
    async with client_of(proxy) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=512,
            messages=turns,  # type: ignore[arg-type]
        )
        conversation = raw.headers["x-compaction-conversation"]
        headers = {**ADMIN_AUTH, "X-Upstream-Api-Key": "sk-ant-operator"}
        status, result = await admin(
            proxy, "POST", f"/conversations/{conversation}/compact", headers=headers
        )
        assert (status, result["outcome"]) == (200, "committed")
        (summary,) = fake.messages.summary_requests
        assert summary.path == "/v1/messages"
        assert summary.headers["x-api-key"] == "sk-ant-operator"
        await client.messages.create(
            model=MODEL,
            max_tokens=512,
            messages=[
                *turns,
                {"role": "assistant", "content": "Ok."},
                {"role": "user", "content": "Go on."},
            ],  # type: ignore[list-item]
        )
    sent = fake.messages.received[-1].body["messages"]
    assert "<compacted-summary>" in str(sent[0]) and "FACT-5" in str(sent[0])
    assert fake.messages.refused == []


async def test_prompt_is_too_long_is_recovered_from_and_the_window_learned(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """The route says 64k, the upstream holds 16k: the first request goes as sent and is
    refused ("prompt is too long: N tokens > 16000 maximum"); the proxy compacts under the
    window stated and retries once, and the next request is compacted before it goes."""
    fake.windows[MODEL] = WINDOW
    proxy = await make_proxy(
        routes=[route(upstream_url, "claude-*", 64_000, precompact_ratio=0, **MASKING_OFF)]
    )
    retried = counter("compaction_proxy_overflow_recoveries_total", result="retried")
    turns = history(rounds=40)
    async with client_of(proxy) as client:
        raw = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=512,
            messages=turns,  # type: ignore[arg-type]
        )
        assert (await raw.parse()).content[0].text == "Done."  # type: ignore[union-attr]
        assert raw.headers["x-compaction-status"] == "recovered"
        refused_first = len(fake.messages.received)
        more = [*turns, {"role": "assistant", "content": "Ok."}, {"role": "user", "content": "On."}]
        again = await client.messages.with_raw_response.create(
            model=MODEL,
            max_tokens=512,
            messages=more,  # type: ignore[arg-type]
        )
    assert counter("compaction_proxy_overflow_recoveries_total", result="retried") == retried + 1
    assert again.headers["x-compaction-status"] != "recovered"
    assert len(fake.messages.received) == refused_first + 1  # no overflow the second time
    assert fake.messages.refused == []


def observation_style(rounds: int) -> list[dict[str, Any]]:
    """An observation-style agent's turns (mini-SWE-agent's): every answer a command in its
    text, every observation a user message."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": "FACT-5: fix the importer."}]
    for index in range(rounds):
        command = (
            f"THOUGHT: step {index}. {'I weigh it. ' * 95}\n```bash\ncat part_{index}.log\n```"
        )
        turns.append({"role": "assistant", "content": command})
        log = "importer log line " * 75
        output = f"<returncode>0</returncode>\n<output>part {index}: {log}</output>"
        turns.append({"role": "user", "content": output})
    return turns


def cached_at_its_end(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``turns`` with a breakpoint on the newest block, where a caching client puts it."""
    text = {"type": "text", "text": turns[-1]["content"], "cache_control": CACHED}
    return [*turns[:-1], {"role": "user", "content": [text]}]


async def test_a_summary_call_ending_on_an_answer_reads_through_to_the_prompt_that_sent_it(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Anthropic reads its cache only where a prompt set a breakpoint: a span ending on the
    model's answer is carried on through the observation after it, where the client's last
    prompt ended, so the summary call writes nothing the conversation had cached."""
    fake.windows[MODEL] = WINDOW
    policy = {"precompact_ratio": 0, "max_tokens": 1024, **MASKING_OFF}  # room in the call
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW, **policy)])
    statuses = []
    async with client_of(proxy) as client:
        for rounds in range(15, 40):  # one prompt a step, from under the threshold
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=512,
                messages=cached_at_its_end(observation_style(rounds)),  # type: ignore[arg-type]
                system=CLAUDE_CODE_LIKE["system"],  # type: ignore[arg-type]
            )
            statuses.append(raw.headers["x-compaction-status"])
            if fake.messages.summary_requests:
                break
    assert statuses[0] == "none" and statuses[-1] == "compacted"
    (summary,) = fake.messages.summary_requests
    *carried, instruction = summary.body["messages"]
    assert KEPT_NOTE in instruction["content"]
    # The prefix ends on an observation, which some prompt of the client ended on.
    kept = carried[-1]["content"][-1]
    assert carried[-2]["role"] == "assistant" and kept["cache_control"] == CACHED
    cache, bills = BreakpointCache(fake), []
    for received in fake.messages.received:
        bills.append(Bill())
        cache.send("one", received.body, bills[-1])
    bill = bills[fake.messages.received.index(summary)]
    assert bill.uncached == 0  # the prefix all read: nothing written again
    assert bill.plain == fake.messages.block_tokens(
        {"type": "text", "text": instruction["content"]}
    )
    # The checkpoint leaves out what stays after it, and the conversation goes on whole.
    forwarded = fake.messages.received[-1].body["messages"]
    texts = [
        text
        for turn in forwarded
        for text in (
            [turn["content"]]
            if isinstance(turn["content"], str)
            else [block.get("text") for block in turn["content"]]
        )
    ]
    assert kept["text"] in texts[1:]
    assert fake_summary(summary.body) in texts[0]
    assert fake.messages.refused == []


async def test_a_round_prepared_beside_its_request_reads_through_once_that_prompt_is_answered(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """A checkpoint prepared in the background keeps little more than the live turn, so its
    span ends on the answer before it. The round waits for the request it was started beside
    to be answered, then reads its prompt whole, where the client's breakpoint wrote it."""
    fake.windows[MODEL] = WINDOW
    # Precompaction on, as by default; no tail beyond the live turn, as a round prepared just
    # under the threshold keeps.
    policy = {"max_tokens": 1024, "retain_tokens": 0, **MASKING_OFF}
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW, **policy)])
    statuses = []
    async with client_of(proxy) as client:
        for rounds in range(15, 40):
            sent = cached_at_its_end(observation_style(rounds))
            raw = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=512,
                messages=sent,  # type: ignore[arg-type]
                system=CLAUDE_CODE_LIKE["system"],  # type: ignore[arg-type]
            )
            statuses.append(raw.headers["x-compaction-status"])
            await proxy.app[SERVICES].background.idle()
            if fake.messages.summary_requests:
                break
    assert statuses[-1] == "precompacting"
    (summary,) = fake.messages.summary_requests
    *carried, instruction = summary.body["messages"]
    assert KEPT_NOTE in instruction["content"]
    assert carried == [*sent[:-1], carried[-1]]  # the request it was started beside, whole
    assert carried[-1]["content"][-1] == sent[-1]["content"][-1]
    started_beside = fake.messages.received.index(summary) - 1
    assert fake.messages.received[started_beside].body["messages"] == sent
    cache, bills = BreakpointCache(fake), []
    for received in fake.messages.received:
        bills.append(Bill())
        cache.send("one", received.body, bills[-1])
    assert bills[started_beside + 1].uncached == 0  # the summary call: all read


async def test_a_round_beside_a_long_streamed_answer_reads_through_while_it_streams(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A streamed answer may run for minutes (thinking, long edits); Anthropic reads the
    prefix its prompt wrote once that answer has begun. The round prepared beside it reads
    through as soon as the answer begins, not when it ends: past the round's wait for it, a
    long answer would leave the summary call writing the prefix again."""
    monkeypatch.setattr(planning, "ANSWER_WAIT_SECONDS", 0.5)
    fake.windows[MODEL] = WINDOW
    fake.messages.hold_streams = hold = asyncio.Event()
    policy = {"max_tokens": 1024, "retain_tokens": 0, **MASKING_OFF}
    proxy = await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW, **policy)])
    statuses, called_while_streaming = [], False
    async with client_of(proxy) as client:
        for rounds in range(15, 40):
            sent = cached_at_its_end(observation_style(rounds))
            hold.clear()
            async with client.messages.with_streaming_response.create(
                model=MODEL,
                max_tokens=512,
                messages=sent,  # type: ignore[arg-type]
                system=CLAUDE_CODE_LIKE["system"],  # type: ignore[arg-type]
                stream=True,
            ) as streaming:
                statuses.append(streaming.headers["x-compaction-status"])
                for _ in range(100 if statuses[-1] == "precompacting" else 0):
                    if fake.messages.summary_requests:
                        break
                    await asyncio.sleep(0.05)  # the answer held, as a model still writing it
                called_while_streaming = bool(fake.messages.summary_requests)
                hold.set()
                await streaming.read()
            await proxy.app[SERVICES].background.idle()
            if fake.messages.summary_requests:
                break
    assert statuses[-1] == "precompacting" and called_while_streaming
    (summary,) = fake.messages.summary_requests
    *carried, instruction = summary.body["messages"]
    assert KEPT_NOTE in instruction["content"]
    assert carried[-1]["content"][-1] == sent[-1]["content"][-1]
    cache, bills = BreakpointCache(fake), []
    for received in fake.messages.received:
        bills.append(Bill())
        cache.send("one", received.body, bills[-1])
    assert bills[fake.messages.received.index(summary)].uncached == 0  # all read


async def test_a_summary_call_in_another_model_plans_no_read_through(
    make_proxy: ProxyFactory,
    upstream_url: str,
    fake: FakeUpstream,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only a call made as the client's next request would be reads the client's cache: a
    summary model other than the request's neither plans a read-through nor waits for one."""
    planned: list[object] = []
    read_through_end = planning.read_through_end

    def counted(*args: Any, **kwargs: Any) -> int | None:
        planned.append(args)
        return read_through_end(*args, **kwargs)

    monkeypatch.setattr(planning, "read_through_end", counted)
    fake.windows[MODEL] = WINDOW
    policy = {"precompact_ratio": 0, "max_tokens": 1024, "summary_model": "claude-other"}
    proxy = await make_proxy(
        routes=[route(upstream_url, "claude-*", WINDOW, **policy, **MASKING_OFF)]
    )
    async with client_of(proxy) as client:
        for rounds in range(15, 40):
            await client.messages.create(
                model=MODEL,
                max_tokens=512,
                messages=cached_at_its_end(observation_style(rounds)),  # type: ignore[arg-type]
                system=CLAUDE_CODE_LIKE["system"],  # type: ignore[arg-type]
            )
            if fake.messages.summary_requests:
                break
    (summary,) = fake.messages.summary_requests
    assert summary.body["model"] == "claude-other"
    assert KEPT_NOTE not in str(summary.body["messages"][-1]["content"])
    assert planned == []
