"""The replay tests hand their histories to the SDK unwalked (``tests.sdk``): that must send
the very body the SDK sends when the history is passed as its parameter."""

from __future__ import annotations

import orjson
import pytest

from compaction_proxy.conversation.messages import split_head
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.sdk import unwalked
from tests.transcripts import (
    BASH_TOOL,
    RESPONSES_BASH,
    VARIANTS,
    as_items,
    plant_facts,
    transcript_named,
)

pytest.importorskip("openai")

import openai


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_a_history_handed_over_unwalked_is_the_body_the_sdk_sends(
    api: str, variant: str, fake: FakeUpstream, upstream_url: str
) -> None:
    messages = plant_facts(VARIANTS[variant](transcript_named("sdk-bodies").messages), "sdk")
    # A content part list and a null content as well: the shapes the walk has unions for.
    messages.append({"role": "user", "content": [{"type": "text", "text": "go on"}]})
    messages.append({"role": "assistant", "content": None, "tool_calls": [], "name": "agent"})
    async with openai.AsyncOpenAI(base_url=upstream_url, api_key="sk-b", max_retries=0) as client:
        if api == "chat":
            for params in ({"messages": messages}, unwalked("messages", messages)):
                await client.chat.completions.create(model="m", tools=BASH_TOOL, **params)
            first, second = (r.body for r in fake.chat_requests)
        else:
            head, body = split_head(messages)
            part = {"type": "input_text", "text": "go on"}
            items = [*as_items(body), {"role": "user", "content": [part]}]
            instructions = str(head[0]["content"]) if head else None
            for params in ({"input": items}, unwalked("input", items)):
                await client.responses.create(
                    model="m", instructions=instructions, tools=[RESPONSES_BASH], **params
                )
            first, second = fake.responses.forwarded
    assert first is not None and second is not None
    assert orjson.dumps(first) == orjson.dumps(second)  # key order included
    assert len(first["messages" if api == "chat" else "input"]) > 30
