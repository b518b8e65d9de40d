"""Compaction keeps the provider's prompt cache: the fake upstreams cache prompts as OpenAI
and Anthropic describe their caches and report what they read in each answer's usage
(``compaction_proxy.testing.prompt_cache``). Through the real SDKs, an agent's conversation
outgrows its window and is compacted; between two checkpoints, each request reads from the
cache all that the one before it had cached (a proxy that changed a byte of a kept message
from one request to the next would break that), each summary call reads nearly all its prompt
from the cache the conversation's requests wrote, and the metric counts what the clients read.
"""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from compaction_proxy.testing.prompt_cache import OPENAI_STEP, CacheRead
from tests.builders import assistant, file_output, system, tool, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import assert_summary_calls_read_the_conversations_cache, counter, route

pytest.importorskip("openai")
pytest.importorskip("anthropic")

import anthropic
import openai

WINDOW = 16_000
STEPS = 18  # about 1.4k tokens each: the window is outgrown twice over
READ = "compaction_proxy_upstream_prompt_tokens_total"


@dataclass(frozen=True)
class Answered:
    """What a client saw of one answer: its prompt's tokens, the part read from the
    provider's cache, the part written to it, and the conversation's generation."""

    prompt: int
    read: int
    written: int
    generation: str


def reads(proxy_route: str) -> float:
    return counter(READ, route=proxy_route, cache="read")


def assert_each_request_reads_what_the_last_cached(answers: list[Answered], slack: int) -> None:
    """Between checkpoints every request reads what the request before it had in the cache
    (``slack``: what the provider rounds away); the conversation was compacted at least
    once, and it read after that too."""
    generations = [a.generation for a in answers]
    assert len(set(generations)) >= 2, generations  # compacted: the test means something
    compared = 0
    for before, after in itertools.pairwise(answers):
        if after.generation != before.generation:
            continue  # a new checkpoint: the prefix after the head changed, once
        assert after.read >= before.read + before.written - slack, (before, after)
        compared += 1
    assert compared >= len(answers) // 2
    assert any(a.read for a in answers if a.generation == generations[-1])


@dataclass(frozen=True)
class CacheRun:
    """A proxy whose one route (``pattern``) has a 16k window, and what the route's metric
    had counted as read when it started."""

    proxy: RunningProxy
    pattern: str
    before: float


async def started(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream, model: str, pattern: str
) -> CacheRun:
    fake.windows[model] = WINDOW
    proxy = await make_proxy(routes=[route(upstream_url, pattern, WINDOW)])
    return CacheRun(proxy, pattern, reads(pattern))


async def assert_the_cache_was_read(
    run: CacheRun, answers: list[Answered], prompts: list[CacheRead], slack: int
) -> None:
    """What the clients saw and the fake answered: each request read what the last one had
    cached (``slack``: what the provider rounds away), every summary call its
    conversation's cache, and the route's metric counts what the clients read."""
    assert_each_request_reads_what_the_last_cached(answers, slack)
    assert_summary_calls_read_the_conversations_cache(prompts)
    await run.proxy.app[SERVICES].pending_log_writes.settled_all()  # counted after the answer
    assert reads(run.pattern) - run.before == sum(a.read for a in answers)


async def test_a_compacted_chat_conversation_reads_the_cache_between_its_checkpoints(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    run = await started(make_proxy, upstream_url, fake, "cache-model", "cache-*")
    messages = [system(), user(f"FACT-3: ticket {uuid.uuid4().hex[:6]}. Fix the importer.")]
    answers: list[Answered] = []
    async with openai.AsyncOpenAI(base_url=run.proxy.url, api_key="k", max_retries=0) as client:
        for step in range(STEPS):
            call = f"call_{step}"
            messages += [
                assistant(None, (call, "read_file", f'{{"path": "src/m{step}.py"}}')),
                tool(call, file_output(f"m{step}x", 450)),
            ]
            raw = await client.chat.completions.with_raw_response.create(
                model="cache-model",
                messages=messages,  # type: ignore[arg-type]
            )
            usage = raw.parse().usage
            assert usage is not None and usage.prompt_tokens_details is not None
            read = usage.prompt_tokens_details.cached_tokens or 0
            # OpenAI caches every prompt it reads: what it did not read, it wrote.
            written = usage.prompt_tokens - read
            generation = raw.headers["x-compaction-generation"]
            answers.append(Answered(usage.prompt_tokens, read, written, generation))
    # The whole last prompt is cached, save the reply's priming and the 128-token steps.
    await assert_the_cache_was_read(run, answers, fake.cache_reads, OPENAI_STEP + 3)


async def test_a_compacted_responses_conversation_reads_the_cache_between_its_checkpoints(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Codex's shape: stateless (``store`` off), its own ``prompt_cache_key``."""
    run = await started(make_proxy, upstream_url, fake, "cache-responses", "cache-*")
    items: list[dict[str, Any]] = [
        {"role": "user", "content": f"FACT-3: ticket {uuid.uuid4().hex[:6]}. Fix the importer."}
    ]
    answers: list[Answered] = []
    async with openai.AsyncOpenAI(base_url=run.proxy.url, api_key="k", max_retries=0) as client:
        for step in range(STEPS):
            call = f"call_{step}"
            items += [
                {"type": "function_call", "call_id": call, "name": "read_file", "arguments": "{}"},
                {
                    "type": "function_call_output",
                    "call_id": call,
                    "output": file_output(f"m{step}x", 450),
                },
            ]
            raw = await client.responses.with_raw_response.create(
                model="cache-responses",
                instructions="You are a coding agent.",
                input=items,  # type: ignore[arg-type]
                store=False,
                prompt_cache_key="codex-session-1",
            )
            usage = raw.parse().usage
            assert usage is not None
            read = usage.input_tokens_details.cached_tokens
            written = usage.input_tokens - read
            generation = raw.headers["x-compaction-generation"]
            answers.append(Answered(usage.input_tokens, read, written, generation))
    await assert_the_cache_was_read(run, answers, fake.responses.cache_reads, OPENAI_STEP + 3)


def claude_code_turns(task: str, steps: int) -> list[dict[str, Any]]:
    """Claude Code's shape: its breakpoint on the last block of the newest turn only."""
    turns: list[dict[str, Any]] = [{"role": "user", "content": task}]
    for step in range(steps):
        call = f"toolu_{step:03d}"
        use = {"type": "tool_use", "id": call, "name": "Read", "input": {"path": f"m{step}.py"}}
        turns.append({"role": "assistant", "content": [use]})
        result = {
            "type": "tool_result",
            "tool_use_id": call,
            "content": file_output(f"m{step}x", 450),
        }
        turns.append({"role": "user", "content": [result]})
    last = turns[-1]["content"][-1]
    turns[-1]["content"][-1] = {**last, "cache_control": {"type": "ephemeral"}}
    return turns


async def test_a_compacted_messages_conversation_reads_the_cache_between_its_checkpoints(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    run = await started(make_proxy, upstream_url, fake, "claude-cache", "claude-*")
    task = f"FACT-3: ticket {uuid.uuid4().hex[:6]}. Fix the importer."
    system_prompt = [
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}}
    ]
    answers: list[Answered] = []
    async with anthropic.AsyncAnthropic(
        base_url=run.proxy.url.removesuffix("/v1"), api_key="k", max_retries=0
    ) as client:
        for step in range(1, STEPS + 1):
            raw = await client.messages.with_raw_response.create(
                model="claude-cache",
                max_tokens=512,
                system=system_prompt,  # type: ignore[arg-type]
                messages=claude_code_turns(task, step),  # type: ignore[arg-type]
            )
            usage = (await raw.parse()).usage
            read = usage.cache_read_input_tokens or 0
            written = usage.cache_creation_input_tokens or 0
            prompt = usage.input_tokens + read + written
            generation = raw.headers["x-compaction-generation"]
            answers.append(Answered(prompt, read, written, generation))
    await assert_the_cache_was_read(run, answers, fake.messages.cache_reads, 0)
