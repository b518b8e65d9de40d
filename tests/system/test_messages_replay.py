"""The agent transcripts replayed in Anthropic's Messages format (the anthropic SDK, breakpoints
placed as Claude Code places them) through 8k, 16k and 32k windows: every request answered, the
upstream's window, pairing and breakpoint rules never broken, the live turn sent as the client
sent it, the facts planted in the first message kept to the last request."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.testing.fake_answers import is_summary_request
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.sdk import unwalked
from tests.transcripts import (
    FACTS,
    REPLAY_WINDOWS,
    Transcript,
    as_messages_body,
    plain_text,
    plant_facts,
    replay_requests,
    transcripts,
)

pytest.importorskip("anthropic")

import anthropic

MODEL = "replay-messages"


def fits(transcript: Transcript, window: int) -> bool:
    """Whether no single message is too big for the window on its own (a client could not
    send that turn directly either)."""
    return all(len(plain_text(m.get("content"))) < 0.75 * window * 3 for m in transcript.messages)


def live_turns(turns: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The turns after the last assistant turn: what the client sends new."""
    last = max((i for i, t in enumerate(turns) if t["role"] == "assistant"), default=-1)
    return turns[last + 1 :]


@pytest.mark.parametrize(
    ("transcript", "window"),
    [
        pytest.param(t, window, id=f"{t.name[:40]}-{window // 1000}k")
        for t in transcripts()
        for window in REPLAY_WINDOWS
        if fits(t, window)
    ],
)
async def test_a_transcript_in_the_messages_format_stays_inside_the_window(
    transcript: Transcript,
    window: int,
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    upstream_url: str,
) -> None:
    fake.windows[MODEL] = window
    route = {"model": MODEL, "base_url": upstream_url, "context_window": window}
    proxy = await make_proxy(routes=[route])
    messages = plant_facts(transcript.messages, "messages")
    statuses = []
    base = proxy.url.removesuffix("/v1")
    async with anthropic.AsyncAnthropic(base_url=base, api_key="sk-ant", max_retries=0) as client:
        for history in replay_requests(messages):
            body = as_messages_body(MODEL, history)
            seen = len(fake.messages.received)
            reply = await client.messages.with_raw_response.create(
                model=MODEL,
                max_tokens=body["max_tokens"],
                system=body["system"],
                tools=body["tools"],
                **unwalked("messages", body["messages"]),
            )
            statuses.append(reply.headers["x-compaction-status"])
            live = live_turns(body["messages"])
            for forwarded in fake.messages.received[seen:]:
                sent = forwarded.body["messages"]
                if not is_summary_request(forwarded.body):
                    assert sent[len(sent) - len(live) :] == live, "live turn altered"
    assert fake.messages.refused == [] and fake.messages.overflows == []
    last = fake.messages.received[-1].body
    visible = "\n".join(
        plain_text(t["content"]) if isinstance(t["content"], list) else t["content"]
        for t in last["messages"]
    )
    for fact in FACTS:
        assert fact in visible
    carried = [
        "<compacted-summary>" in str(r.body["messages"])
        for r in fake.messages.received
        if not is_summary_request(r.body)
    ]
    if True in carried:  # once applied, a checkpoint goes with every later request
        assert all(carried[carried.index(True) :])
    crossed = any(
        fake.messages.input_tokens(as_messages_body(MODEL, history)) > 0.8 * window
        for history in replay_requests(messages)
    )
    if crossed:  # compacted on the request that crossed, or ahead of it in the background
        assert {"compacted", "masked", "pruned"} & set(statuses) or True in carried
