"""Replay every shared transcript through the proxy against a fake upstream with a small window.

Before every assistant message the client (the real openai SDK) posts the whole history so far,
as the agent did. The upstream enforces a 16k or 32k window; the transcripts hold 20k-95k
tokens. The proxy must keep every forwarded request inside the window without the client ever
seeing an error.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import openai
import pytest

from proxy.compaction.summarize import framed_summary_text
from proxy.conversation import split_head
from proxy.testing.fake_upstream import FakeUpstream, Received
from tests.conftest import ProxyFactory
from tests.transcripts import load, replay_requests, transcript_paths

MODEL = "replay-model"
BASH_TOOL = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    }
]
FACTS = [
    "FACT-17: the staging database is pg-stage-3.internal on port 6432",
    "FACT-23: never touch the vendored copy under third_party/legacy",
]

REPLAY_REPORT: list[str] = []


def plant_facts(messages: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    planted = [dict(m) for m in messages]
    first_user = next(i for i, m in enumerate(planted) if m["role"] == "user")
    facts = "\n".join(FACTS) + f"\nrun {run} {uuid.uuid4().hex}\n\n"
    planted[first_user]["content"] = facts + str(planted[first_user]["content"])
    return planted


def assert_tool_pairing(messages: list[dict[str, Any]]) -> None:
    opened: dict[str, int] = {}
    answered: set[str] = set()
    for index, message in enumerate(messages):
        for call in message.get("tool_calls") or []:
            opened[call["id"]] = index
        if message.get("role") == "tool":
            call_id = message["tool_call_id"]
            assert call_id in opened, f"tool result {call_id} without its call"
            assert opened[call_id] < index
            answered.add(call_id)
    assert set(opened) == answered, f"calls without results: {set(opened) - answered}"


def cap_of(received: Received) -> int:
    body = received.body or {}
    return int(body.get("max_completion_tokens") or body.get("max_tokens") or 0)


@pytest.mark.parametrize("window", [16_000, 32_000])
@pytest.mark.parametrize("path", transcript_paths(), ids=lambda p: p.name.split(".")[0])
async def test_replay_stays_inside_the_window(
    path: Path, window: int, make_proxy: ProxyFactory, fake: FakeUpstream, upstream_url: str
) -> None:
    await replay(path, window, make_proxy, fake, upstream_url, "memory://")


async def test_replay_on_a_redis_cluster(
    make_proxy: ProxyFactory, fake: FakeUpstream, upstream_url: str, redis_cluster_url: str
) -> None:
    path = next(p for p in transcript_paths() if "django-11283" in p.name)
    await replay(path, 16_000, make_proxy, fake, upstream_url, redis_cluster_url, "cluster")


async def replay(
    path: Path,
    window: int,
    make_proxy: ProxyFactory,
    fake: FakeUpstream,
    upstream_url: str,
    store_url: str,
    label: str = "",
) -> None:
    fake.windows[MODEL] = window
    proxy = await make_proxy(
        store_url=store_url,
        routes=[{"model": MODEL, "base_url": upstream_url, "context_window": window}],
    )
    # A unique first message: a shared store must not see this conversation from earlier runs.
    messages = plant_facts(load(path), label or "memory")
    head, _ = split_head(messages)
    uses_tools = any(m.get("tool_calls") for m in messages)
    extra: dict[str, Any] = {"tools": BASH_TOOL} if uses_tools else {}
    raw_tokens = forwarded_tokens = largest = 0
    statuses: list[str] = []
    conversation = ""
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-replay", max_retries=0) as c:
        for history in replay_requests(messages):
            reply = await c.chat.completions.with_raw_response.create(
                model=MODEL,
                messages=history,
                **extra,  # type: ignore[arg-type]
            )
            assert reply.parse().choices[0].message.content == "ok"
            statuses.append(reply.headers["x-compaction-status"])
            conversation = reply.headers["x-compaction-conversation"]
            raw = fake.prompt_tokens({"messages": history, **extra})
            raw_tokens += raw
            largest = max(largest, raw)
            forwarded_tokens += fake.chat_requests[-1].prompt_tokens

    for received in fake.received:
        assert received.body is not None
        assert received.prompt_tokens + cap_of(received) <= window
        sent = received.body["messages"]
        assert sent[: len(head)] == head
        assert_tool_pairing(sent)
    for received in fake.summary_requests:
        assert received.body is not None
        if uses_tools:
            assert received.body["tool_choice"] == "none"

    log = [e for _, e in (await proxy.store.read_log(conversation, limit=100_000)).events]
    committed = [
        e
        for e in log
        if e["type"] == "compaction/end"
        and e.get("kind") == "summary"
        and e["outcome"] == "committed"
    ]
    assert len(fake.summary_requests) == len(committed)
    if largest < 0.8 * window:
        assert committed == [] and raw_tokens == forwarded_tokens
        _report(path, window, statuses, raw_tokens, forwarded_tokens, 0, 0, label)
        return
    assert {"compacted", "pruned"} & set(statuses), "crossing the threshold must compact"
    assert len(fake.summary_requests) * 4 < len(fake.chat_requests)

    # Once committed, a checkpoint is reused by every later request.
    if committed:
        first_compacted = statuses.index("compacted")
        for received in fake.chat_requests[first_compacted:]:
            assert received.body is not None
            assert any(framed_summary_text(m) is not None for m in received.body["messages"])

    last = fake.chat_requests[-1].body
    assert last is not None
    visible = "\n".join(str(m.get("content")) for m in last["messages"])
    for fact in FACTS:
        assert fact in visible

    _report(
        path,
        window,
        statuses,
        raw_tokens,
        forwarded_tokens,
        len(committed),
        len(fake.summary_requests),
        label,
    )


def _report(
    path: Path,
    window: int,
    statuses: list[str],
    raw: int,
    forwarded: int,
    compactions: int,
    summary_calls: int,
    label: str,
) -> None:
    name = path.name.split(".")[0][:48] + (f" [{label}]" if label else "")
    REPLAY_REPORT.append(
        f"{name:<58} {window // 1000:>3}k  requests {len(statuses):>3}"
        f"  raw {raw:>9,}  forwarded {forwarded:>9,}  ({forwarded / raw:.0%})"
        f"  compactions {compactions:>2}  summary calls {summary_calls:>2}"
        f"  prunes {statuses.count('pruned'):>2}"
    )
