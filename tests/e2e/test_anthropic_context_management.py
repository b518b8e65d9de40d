"""Anthropic's ``context_management`` through the anthropic SDK's beta surface, against an
Anthropic-compatible upstream that has none (the fake refuses the field, as such endpoints
do): the proxy serves ``compact_20260112`` (the compaction block first, streamed too,
``usage.iterations``, ``pause_after_compaction``, the client's ``instructions``) and
``clear_tool_uses_20250919`` (its parameters, ``applied_edits``), and the block, sent back,
is the checkpoint."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from compaction_proxy.testing.fake_messages import sign
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import MASKING_OFF, route

pytest.importorskip("anthropic")

import anthropic

MODEL = "claude-small"
WINDOW = 64_000
FACT = "FACT-3: the importer's lock file is /var/run/importer.lock"
BETAS = ["context-management-2025-06-27", "compact-2026-01-12"]


def history(rounds: int = 20) -> list[dict[str, Any]]:
    """A task naming a fact, ``rounds`` tool rounds (about 230 tokens each), a question."""
    turns: list[dict[str, Any]] = [
        {"role": "user", "content": f"{FACT}. Ticket {uuid.uuid4().hex[:6]}: fix the importer."}
    ]
    for index in range(rounds):
        call = f"toolu_{index:03d}"
        use = {"type": "tool_use", "id": call, "name": "bash", "input": {"n": index}}
        turns.append({"role": "assistant", "content": [use]})
        result = {"type": "tool_result", "tool_use_id": call, "content": "log line " * 100}
        turns.append({"role": "user", "content": [result]})
    turns.append({"role": "user", "content": "Where are we?"})
    return turns


async def start(make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream) -> RunningProxy:
    fake.windows[MODEL] = WINDOW
    policy = {"precompact_ratio": 0, **MASKING_OFF}
    return await make_proxy(routes=[route(upstream_url, "claude-*", WINDOW, **policy)])


def client_of(base: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(
        base_url=base.removesuffix("/v1"),
        api_key=None,
        default_headers={"x-api-key": "sk-ant-own"},
        max_retries=0,
    )


def compact(trigger: int = 1_000, **fields: Any) -> dict[str, Any]:
    edit = {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": trigger}}
    return {"edits": [{**edit, **fields}]}


async def test_without_the_proxy_the_upstream_refuses_context_management(
    fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    async with client_of(upstream_url) as client:
        with pytest.raises(anthropic.BadRequestError):
            await client.beta.messages.create(
                model=MODEL,
                max_tokens=512,
                messages=history(),  # type: ignore[arg-type]
                context_management=compact(),  # type: ignore[arg-type]
                betas=BETAS,
            )


@pytest.mark.parametrize("stream", [False, True])
async def test_compact_puts_the_compaction_block_first_and_sends_the_checkpoint(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, stream: bool
) -> None:
    """Over its trigger: the upstream (never seeing the option) gets the checkpoint and the
    live turn; the answer's content is the compaction block, then the model's answer, and
    ``usage.iterations`` bills the compaction apart. Sent back, the block is the checkpoint:
    what came before it goes no further."""
    proxy = await start(make_proxy, upstream_url, fake)
    turns = history()
    async with client_of(proxy.url) as client:
        fields: dict[str, Any] = {
            "model": MODEL,
            "max_tokens": 512,
            "messages": turns,
            "context_management": compact(instructions="Keep every FACT line verbatim."),
            "betas": BETAS,
        }
        if stream:
            async with client.beta.messages.stream(**fields) as events:
                message = await events.get_final_message()
        else:
            message = await client.beta.messages.create(**fields)
        assert [block.type for block in message.content] == ["compaction", "text"]
        block = message.content[0]
        assert block.type == "compaction" and FACT in (block.content or "")
        iterations = message.usage.iterations or []
        assert [i.type for i in iterations] == ["compaction", "message"]
        sent = fake.messages.received[-1].body
        assert "context_management" not in sent
        assert "<compacted-summary>" in str(sent["messages"][0])
        assert sent["messages"][-1] == turns[-1]
        (summary,) = [r for r in fake.messages.summary_requests][-1:]
        assert "Keep every FACT line verbatim." in str(summary.body["messages"][-1])
        again = [
            *turns,
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in message.content],
            },
            {"role": "user", "content": "Go on."},
        ]
        await client.beta.messages.create(model=MODEL, max_tokens=512, messages=again, betas=BETAS)  # type: ignore[arg-type]
    sent = fake.messages.received[-1].body["messages"]
    checkpoint = sent[0]["content"][0]["text"]
    assert "<compacted-summary>" in checkpoint and FACT in checkpoint
    assert "toolu_000" not in str(sent)  # what came before the block went no further
    assert sent[-1] == {"role": "user", "content": "Go on."}


async def test_pause_after_compaction_answers_the_block_alone(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    async with client_of(proxy.url) as client:
        message = await client.beta.messages.create(
            model=MODEL,
            max_tokens=512,
            messages=history(),  # type: ignore[arg-type]
            context_management=compact(pause_after_compaction=True),  # type: ignore[arg-type]
            betas=BETAS,
        )
    assert [block.type for block in message.content] == ["compaction"]
    assert message.stop_reason == "compaction"
    assert len(fake.messages.received) == len(fake.messages.summary_requests)  # no answer asked


async def test_clear_tool_uses_clears_all_but_the_newest_and_says_what_went(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    edit = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1_000},
        "keep": {"type": "tool_uses", "value": 2},
    }
    turns = history()
    async with client_of(proxy.url) as client:
        message = await client.beta.messages.create(
            model=MODEL,
            max_tokens=512,
            messages=turns,  # type: ignore[arg-type]
            context_management={"edits": [edit]},  # type: ignore[arg-type]
            betas=BETAS,
        )
    assert message.context_management is not None
    (applied,) = message.context_management.applied_edits
    assert applied.type == "clear_tool_uses_20250919" and applied.cleared_tool_uses == 18
    assert applied.cleared_input_tokens > 0
    sent = fake.messages.received[-1].body
    assert "context_management" not in sent
    results = [
        block["content"]
        for turn in sent["messages"]
        for block in (turn["content"] if isinstance(turn["content"], list) else [])
        if block.get("type") == "tool_result"
    ]
    assert len(results) == 20
    assert sum("cleared this output" in str(r) for r in results) == 18
    assert results[-2:] == [turns[-4]["content"][0]["content"], turns[-2]["content"][0]["content"]]


async def test_count_tokens_counts_what_the_edits_would_leave_and_the_original(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Tool uses the edit would clear are not counted; ``original_input_tokens`` is the count
    as sent. A compaction happens on a message, not a count: with it alone, both are equal."""
    proxy = await start(make_proxy, upstream_url, fake)
    clear = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 1_000},
        "keep": {"type": "tool_uses", "value": 2},
    }
    turns = history()
    async with client_of(proxy.url) as client:
        cleared = await client.beta.messages.count_tokens(
            model=MODEL,
            messages=turns,  # type: ignore[arg-type]
            context_management={"edits": [clear]},  # type: ignore[arg-type]
            betas=BETAS,
        )
        compacting = await client.beta.messages.count_tokens(
            model=MODEL,
            messages=turns,  # type: ignore[arg-type]
            context_management=compact(),  # type: ignore[arg-type]
            betas=BETAS,
        )
    assert cleared.context_management is not None and compacting.context_management is not None
    original = cleared.context_management.original_input_tokens
    assert 0 < cleared.input_tokens < original / 2  # 18 of 20 results of about 230 tokens
    assert compacting.input_tokens == compacting.context_management.original_input_tokens
    assert compacting.input_tokens == original
    counted = [r for r in fake.messages.received if r.path.endswith("count_tokens")]
    assert all("context_management" not in r.body for r in counted)


async def test_a_block_of_another_key_is_refused_and_nothing_goes_upstream(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await start(make_proxy, upstream_url, fake)
    async with client_of(proxy.url) as client:
        message = await client.beta.messages.create(
            model=MODEL,
            max_tokens=512,
            messages=history(),  # type: ignore[arg-type]
            context_management=compact(pause_after_compaction=True),  # type: ignore[arg-type]
            betas=BETAS,
        )
    block = message.content[0].model_dump(exclude_none=True)
    before = len(fake.messages.received)
    other = anthropic.AsyncAnthropic(
        base_url=proxy.url.removesuffix("/v1"),
        api_key=None,
        default_headers={"x-api-key": "sk-ant-other"},
        max_retries=0,
    )
    async with other:
        with pytest.raises(anthropic.BadRequestError) as refused:
            await other.beta.messages.create(
                model=MODEL,
                max_tokens=512,
                messages=[
                    {"role": "user", "content": "Hi."},
                    {"role": "assistant", "content": [block]},
                    {"role": "user", "content": "Go on."},
                ],  # type: ignore[list-item]
                betas=BETAS,
            )
    assert "compaction block" in str(refused.value)
    assert len(fake.messages.received) == before


def thinking_history(rounds: int = 8) -> list[dict[str, Any]]:
    """An agent thinking before each call (signed as the fake signs), its last call answered."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": f"{FACT}. Fix the importer."}]
    for index in range(rounds):
        call, thought = f"toolu_{index:03d}", f"Step {index}: read part {index}."
        thinking = {"type": "thinking", "thinking": thought, "signature": sign(thought)}
        use = {"type": "tool_use", "id": call, "name": "bash", "input": {"cmd": f"cat {index}"}}
        turns.append({"role": "assistant", "content": [thinking, use]})
        result = {"type": "tool_result", "tool_use_id": call, "content": "log line " * 100}
        turns.append({"role": "user", "content": [result]})
    return turns


async def test_clear_thinking_and_tool_inputs_clear_what_the_api_would(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """``clear_thinking_20251015`` keeps the newest turn's thinking (as a tool round in
    progress needs) and drops the older turns'; ``clear_tool_inputs`` empties the inputs of the
    calls whose results went; ``applied_edits`` reports both, and the upstream, checking the
    round in progress, refuses nothing."""
    proxy = await start(make_proxy, upstream_url, fake)
    clear_uses = {
        "type": "clear_tool_uses_20250919",
        "trigger": {"type": "input_tokens", "value": 100},
        "keep": {"type": "tool_uses", "value": 1},
        "clear_tool_inputs": True,
    }
    clear_thinking = {"type": "clear_thinking_20251015"}
    async with client_of(proxy.url) as client:
        message = await client.beta.messages.create(
            model=MODEL,
            max_tokens=2048,
            thinking={"type": "enabled", "budget_tokens": 1024},
            messages=thinking_history(),  # type: ignore[arg-type]
            context_management={"edits": [clear_thinking, clear_uses]},  # type: ignore[arg-type]
            betas=BETAS,
        )
    assert fake.messages.refused == []
    assert message.context_management is not None
    applied = {edit.type: edit for edit in message.context_management.applied_edits}
    assert applied["clear_thinking_20251015"].cleared_thinking_turns == 7
    assert applied["clear_tool_uses_20250919"].cleared_tool_uses == 7
    sent = fake.messages.received[-1].body["messages"]
    assistants = [turn["content"] for turn in sent if turn["role"] == "assistant"]
    assert [any(b["type"] == "thinking" for b in blocks) for blocks in assistants] == [
        *[False] * 7,
        True,
    ]
    inputs = [b["input"] for blocks in assistants for b in blocks if b["type"] == "tool_use"]
    assert inputs == [*[{}] * 7, {"cmd": "cat 7"}]
