"""An agent from the openai-agents SDK, with a function tool, runs through the proxy on the
Responses API: its conversation outgrows a 16k window and is compacted on the way, and the
agent finishes as it would talking to the provider directly."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF

pytest.importorskip("openai")
pytest.importorskip("agents")

import openai
from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

MODEL = "agent-small"
WINDOW = 16_000
TOOL_ROUNDS = 12

# Traces would be sent to the provider's tracing endpoint: nothing leaves this machine.
set_tracing_disabled(True)


async def test_a_tool_using_agent_runs_through_the_proxy_and_is_compacted(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    fake.windows[MODEL] = WINDOW
    fake.responses.tool_rounds = TOOL_ROUNDS
    route = {"model": "agent-*", "base_url": upstream_url, "context_window": WINDOW}
    proxy = await make_proxy(routes=[{**route, "policy": {"precompact_ratio": 0, **MASKING_OFF}}])
    steps: list[int] = []

    @function_tool
    def read_file(step: int) -> str:
        """Read the next file of the repository."""
        steps.append(step)
        return f"file {step}: " + "def handler(request): return cache.get(request.key)\n" * 120

    client = openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-agent", max_retries=0)
    agent = Agent(
        name="coder",
        instructions="Read the repository file by file, then report.",
        tools=[read_file],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
    )
    result: Any = await Runner.run(
        agent, "FACT-5: the fix goes in cache.py. Find the stale read.", max_turns=TOOL_ROUNDS + 3
    )
    await client.close()
    assert len(steps) == TOOL_ROUNDS
    # The agent sent its whole run (the task, each call and output); the model read fewer
    # items, a checkpoint standing for the oldest.
    sent_items = 1 + 2 * TOOL_ROUNDS
    assert result.final_output == f"Done ({len(fake.responses.forwarded[-1]['input'])} items read)."
    assert len(fake.responses.forwarded[-1]["input"]) < sent_items
    assert fake.summary_requests, "the agent's conversation outgrew the window"
    last_input = fake.responses.forwarded[-1]["input"]
    assert "FACT-5" in str(last_input[0].get("content"))
