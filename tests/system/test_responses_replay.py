"""The agent transcripts replayed in the Responses format, through a 16k window: every
request answered, the upstream's window and pairing rules never broken, the live turn sent as
the client sent it, the facts planted in the first message kept to the last request."""

from __future__ import annotations

import pytest

from compaction_proxy.conversation.messages import live_turn_start, split_head
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.sdk import unwalked
from tests.transcripts import (
    FACTS,
    RESPONSES_BASH,
    Transcript,
    as_items,
    plain_text,
    plant_facts,
    replay_requests,
    transcripts,
)

pytest.importorskip("openai")

import openai

MODEL = "replay-responses"
WINDOW = 16_000


def fits(transcript: Transcript) -> bool:
    """Whether no single message is too big for the window on its own."""
    return all(len(plain_text(m.get("content"))) < 0.75 * WINDOW * 3 for m in transcript.messages)


@pytest.mark.parametrize(
    "transcript", [pytest.param(t, id=t.name[:40]) for t in transcripts() if fits(t)]
)
async def test_a_transcript_in_the_responses_format_stays_inside_the_window(
    transcript: Transcript, make_proxy: ProxyFactory, fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    route = {"model": MODEL, "base_url": upstream_url, "context_window": WINDOW}
    proxy = await make_proxy(routes=[route])
    messages = plant_facts(transcript.messages, "responses")
    head, _ = split_head(messages)
    instructions = "\n".join(plain_text(m.get("content")) for m in head)
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-rr", max_retries=0) as client:
        for history in replay_requests(messages):
            _, body = split_head(history)
            items = as_items(body)
            seen = len(fake.responses.forwarded)
            await client.responses.create(
                model=MODEL,
                instructions=instructions,
                tools=[RESPONSES_BASH],
                **unwalked("input", items),
            )
            for forwarded in fake.responses.forwarded[seen:]:
                live = as_items(body[live_turn_start(body) :])
                assert forwarded["input"][len(forwarded["input"]) - len(live) :] == live
                assert forwarded["instructions"] == instructions
    for forwarded in fake.responses.forwarded:
        assert fake.responses.input_tokens(forwarded) <= WINDOW
    last = "\n".join(
        plain_text(i.get("content") or i.get("output"))
        for i in fake.responses.forwarded[-1]["input"]
    )
    for fact in FACTS:
        assert fact in last
