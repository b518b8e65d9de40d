"""Replay agent conversations through the proxy against a fake upstream with a small window.

Before every assistant message the client (the real openai SDK) posts the whole history so far,
as the agent did (handed to it unwalked: ``tests.sdk``). Every conversation is replayed as sent
and in two variants real clients produce: observation style (no tool calling: commands in the
assistant's text, output back as user messages) and reused ids (``call_0`` on every call). The
upstream enforces an 8k, 16k or 32k window (the variants: 8k or 16k) and rejects broken tool
pairing as OpenAI does. For every replay:

* the client never sees an error;
* no forwarded request (summary calls included) goes over the window;
* tool pairing holds in everything forwarded;
* the live turn reaches the model byte for byte as the client sent it;
* the planted facts survive to the last request.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import pytest

from compaction_proxy.compaction.summarize import framed_summary_text
from compaction_proxy.conversation.messages import live_turn_start, split_head
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_answers import pairing_error
from compaction_proxy.testing.fake_upstream import FakeUpstream, Received
from tests.conftest import ProxyFactory
from tests.reports import TRANSCRIPT_REPLAY, report
from tests.sdk import unwalked
from tests.transcripts import (
    BASH_TOOL,
    FACTS,
    REPLAY_WINDOWS,
    VARIANTS,
    Transcript,
    plant_facts,
    replay_requests,
    transcript_named,
    transcripts,
)

pytest.importorskip("openai")

import openai

MODEL = "replay-model"
THRESHOLD, PRECOMPACT = 0.8, 0.7  # the default watermarks


def cap_of(received: Received) -> int:
    body = received.body or {}
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)


def replays() -> list[Any]:
    """Every transcript in every window, those with a message too big for the window on its
    own included (the rescue answers them: sent directly they would fail); its variants in the
    two smaller windows, where they are compacted most (in the largest, a variant compacts
    about as the transcript as sent does, and a replay costs the suite as much as any other)."""
    params = []
    for transcript in transcripts():
        for window in REPLAY_WINDOWS:
            calls = any(m.get("tool_calls") for m in transcript.messages)
            varied = calls and window < max(REPLAY_WINDOWS)  # the variants change calls only
            for variant in VARIANTS if varied else ["as-sent"]:
                params.append(
                    pytest.param(
                        transcript,
                        variant,
                        window,
                        id=f"{transcript.name[:40]}-{variant}-{window // 1000}k",
                    )
                )
    return params


@pytest.mark.parametrize(("transcript", "variant", "window"), replays())
async def test_replay_stays_inside_the_window_and_keeps_the_live_turn(
    transcript: Transcript,
    variant: str,
    window: int,
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    upstream_url: str,
) -> None:
    await replay(transcript, VARIANTS[variant], variant, window, make_proxy, fake, upstream_url)


async def test_replay_on_a_redis_cluster(
    make_proxy: ProxyFactory, fake: FakeUpstream, upstream_url: str, redis_cluster_url: str
) -> None:
    transcript = transcript_named("django-11283")
    await replay(
        transcript,
        VARIANTS["as-sent"],
        "cluster",
        16_000,
        make_proxy,
        fake,
        upstream_url,
        redis_cluster_url,
    )


def assert_live_turn_as_sent(
    history: list[dict[str, Any]], forwarded: list[Any], rescued: bool = False
) -> None:
    """The live turn byte for byte; ``rescued``: but for observations cut by the rescue, each
    keeping its head and saying what was cut."""
    live = history[live_turn_start(history) :]
    if not live:
        return
    sent = forwarded[-len(live) :]
    if not rescued:
        assert [orjson.dumps(m) for m in sent] == [orjson.dumps(m) for m in live], "altered"
        return
    assert any(m != original for m, original in zip(sent, live, strict=True))
    for message, original in zip(sent, live, strict=True):
        if message != original:
            content, whole = str(message["content"]), str(original["content"])
            assert "were cut by compaction-proxy" in content and len(content) < len(whole)
            assert content[:256] == whole[:256]


async def replay(
    transcript: Transcript,
    variant: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
    label: str,
    window: int,
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    upstream_url: str,
    store_url: str = "memory://",
) -> None:
    fake.windows[MODEL] = window
    proxy = await make_proxy(
        store_url=store_url,
        routes=[{"model": MODEL, "base_url": upstream_url, "context_window": window}],
    )
    # A unique first message: a shared store must not see this conversation from earlier runs.
    messages = plant_facts(variant(transcript.messages), label)
    head, _ = split_head(messages)
    uses_tools = any(m.get("tool_calls") for m in messages)
    extra: dict[str, Any] = {"tools": BASH_TOOL} if uses_tools else {}
    raw_tokens = forwarded_tokens = largest = 0
    statuses: list[str] = []
    conversation = ""
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-replay", max_retries=0) as c:
        for history in replay_requests(messages):
            seen = len(fake.chat_requests)
            reply = await c.chat.completions.with_raw_response.create(
                model=MODEL,
                **unwalked("messages", history),
                **extra,
            )
            assert reply.parse().choices[0].message.content == "ok"
            statuses.append(reply.headers["x-compaction-status"])
            conversation = reply.headers["x-compaction-conversation"]
            for received in fake.chat_requests[seen:]:
                assert received.body is not None
                rescued = statuses[-1] == "rescued"
                assert_live_turn_as_sent(history, received.body["messages"], rescued)
            raw = fake.prompt_tokens({"messages": history, **extra})
            raw_tokens += raw
            largest = max(largest, raw)
            forwarded_tokens += fake.chat_requests[-1].prompt_tokens

    assert fake.rejected == [] and fake.overflows == []
    for received in fake.received:
        assert received.body is not None
        assert received.prompt_tokens + cap_of(received) <= window
        sent = received.body["messages"]
        assert sent[: len(head)] == head
        assert pairing_error(sent) is None
    for received in fake.summary_requests:
        assert received.body is not None
        if uses_tools:
            assert received.body["tool_choice"] == "none"

    await proxy.app[SERVICES].background.idle()
    log = await proxy.read_log(conversation, limit=100_000)
    committed = [
        e
        for e in log
        if e["type"] == "compaction/end"
        and e.get("kind") == "summary"
        and e["outcome"] == "committed"
    ]
    assert len(fake.summary_requests) == len(committed)
    if largest < PRECOMPACT * window:
        assert committed == [] and raw_tokens == forwarded_tokens
    elif largest >= THRESHOLD * window:
        # Compacted on the request that crossed, or ahead of it in the background.
        compacted = {"compacted", "masked", "pruned"} & set(statuses) or committed
        assert compacted, "crossing the threshold must compact"
        assert len(fake.summary_requests) * 3 < len(fake.chat_requests)

    # Once applied, a checkpoint (or a deeper one) is sent with every later request.
    def carries_a_summary(received: Received) -> bool:
        assert received.body is not None
        return any(framed_summary_text(m) is not None for m in received.body["messages"])

    if committed:
        carried = [carries_a_summary(r) for r in fake.chat_requests]
        assert True in carried
        assert all(carried[carried.index(True) :])

    last = fake.chat_requests[-1].body
    assert last is not None
    visible = "\n".join(str(m.get("content")) for m in last["messages"])
    for fact in FACTS:
        assert fact in visible

    name = f"{transcript.name[:44]} [{label}]"
    report(
        TRANSCRIPT_REPLAY,
        f"{name:<60} {window // 1000:>3}k  requests {len(statuses):>3}"
        f"  raw {raw_tokens:>9,}  forwarded {forwarded_tokens:>9,}"
        f"  ({forwarded_tokens / raw_tokens:.0%})  summary calls {len(committed):>2}"
        f"  prunes {statuses.count('pruned'):>2}  masked {statuses.count('masked'):>3}"
        f"  rescued {statuses.count('rescued'):>2}",
    )
