"""Many replicas on one Redis: two proxy processes, conversations alternating between them,
and parallel runs with identical openings, replaying real transcripts concurrently."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections import defaultdict
from typing import Any

import orjson
import pytest

from compaction_proxy.compaction.masking import observations, placeholder
from compaction_proxy.compaction.model_policy import bridge_pruner
from compaction_proxy.compaction.prune import prune_content
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.compaction.summarize import frame
from compaction_proxy.config.settings import PrunerPolicy
from compaction_proxy.conversation.log_view import latest_request
from compaction_proxy.conversation.replacements import Checkpoint, Prune, ReplacementRecord
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.conversation.text import text_of
from compaction_proxy.security.tenant import TenantSecret, tenant_of
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.processes import proxy_process
from tests.redis_server import shared_redis_url
from tests.transcripts import replay_requests, transcript_named

pytest.importorskip("openai")

import openai

MODEL = "replica-model"
WINDOW = 16_000
API_KEY = "sk-replicas"


def transcript(name: str) -> list[dict[str, Any]]:
    messages = transcript_named(name).messages
    first_user = next(i for i, m in enumerate(messages) if m["role"] == "user")
    opened = [dict(m) for m in messages]
    opened[first_user]["content"] = f"run {uuid.uuid4().hex}\n{opened[first_user]['content']}"
    return opened


def diverged(messages: list[dict[str, Any]], at: int) -> list[dict[str, Any]]:
    """The same run up to ``at``, then a different tool output: a parallel run."""
    fork = [dict(m) for m in messages]
    index = next(i for i in range(at, len(fork)) if fork[i]["role"] in ("tool", "user"))
    fork[index]["content"] = f"(a different machine) {fork[index]['content']}"
    return fork


class Client:
    """Replays one conversation, request by request, over the given replicas in turn."""

    def __init__(self, name: str, messages: list[dict[str, Any]], bases: list[str]) -> None:
        self.name = name
        self.messages = messages
        self.bases = bases
        self.sent: list[tuple[str, list[dict[str, Any]], int, str]] = []

    async def run(self) -> None:
        clients = [
            openai.AsyncOpenAI(base_url=f"{b}/v1", api_key=API_KEY, max_retries=0)
            for b in self.bases
        ]
        try:
            for turn, history in enumerate(replay_requests(self.messages)):
                marker = f"{self.name}-{turn}"
                raw = await clients[turn % len(clients)].chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=history,
                    user=marker,  # type: ignore[arg-type]
                )
                assert raw.parse().choices[0].message.content == "ok"
                self.sent.append(
                    (
                        marker,
                        history,
                        int(raw.headers["x-compaction-generation"]),
                        raw.headers["x-compaction-conversation"],
                    )
                )
        finally:
            for client in clients:
                await client.close()


async def test_two_replicas_on_one_redis_stay_consistent(
    fake: FakeUpstream, upstream_url: str
) -> None:
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 0.05
    routes = orjson.dumps(
        [{"model": MODEL, "base_url": upstream_url, "context_window": WINDOW}]
    ).decode()
    env = {
        "COMPACTION_PROXY_UPSTREAM_BASE_URL": upstream_url,
        "REDIS_URL": shared_redis_url(),
        "COMPACTION_PROXY_ROUTES": routes,
        "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
    }
    alternating = transcript("django-11283")
    opening = transcript("gpt5mini__django__django-13925")
    async with proxy_process(env) as (_, first), proxy_process(env) as (_, second):
        clients = [
            Client("alternating", alternating, [first, second]),
            Client("run-a", opening, [first, second]),
            Client("run-b", diverged(opening, 12), [second, first]),
        ]
        await asyncio.gather(*(c.run() for c in clients))

    store = RedisStore(shared_redis_url())
    try:
        secret = await TenantSecret(None, store).get()
        tenant = tenant_of(secret, API_KEY)
        await check_replicas(store, tenant, clients, fake)
    finally:
        await store.close()


BRIDGE = bridge_pruner(PrunerPolicy())


def bridged(view: RequestView, surface: Surface, sent: list[dict[str, Any]]) -> bool:
    """``sent`` is ``surface`` with some observations cut by the bridge, for that request
    alone: from the client's own message, to the bridge's head and tail."""
    assert BRIDGE is not None
    if len(sent) != len(surface.nodes):
        return False
    for node, message in zip(surface.nodes, sent, strict=True):
        if message == node.message:
            continue
        if node.kind not in ("body", "pruned") or node.start is None:
            return False
        original = view.body[node.start]
        cut = prune_content(original.get("content"), BRIDGE)
        if cut is None or message != {**original, "content": cut.content}:
            return False
    return True


def identity(record: ReplacementRecord) -> tuple[Any, ...]:
    if isinstance(record, Checkpoint):
        return ("checkpoint", record.start, record.end, record.end_hash)
    return ("mask" if record.masked else "prune", record.position, record.hash)


def record_sets(
    events: list[dict[str, Any]], parent: dict[str, tuple[int, str]]
) -> list[tuple[ReplacementRecord, ...]]:
    """Every set of records the conversation held, rebuilt from its log: each commit adds its
    records and drops those of its own branch inside a new checkpoint's span. ``parent`` maps
    every chain hash the clients sent to its position and predecessor."""

    def ancestor(tip: str, position: int) -> str | None:
        node: str | None = tip
        while node is not None and node in parent and parent[node][0] > position:
            node = parent[node][1]
        return node if node in parent and parent[node][0] == position else None

    held: list[ReplacementRecord] = []
    snapshots: list[tuple[ReplacementRecord, ...]] = [()]
    for e in events:
        if e["type"] == "compaction/summary":
            new = Checkpoint(
                e["start"], e["end"], e["start_prev_hash"], e["end_hash"], frame(e["summary"]), 0
            )
            held = [
                r
                for r in held
                if not (
                    (
                        r.start >= new.start
                        and r.end <= new.end
                        and ancestor(new.end_hash, r.end) == r.end_hash
                    )
                    if isinstance(r, Checkpoint)
                    else (
                        new.start <= r.position <= new.end
                        and ancestor(new.end_hash, r.position) == r.hash
                    )
                )
            ]
            held.append(new)
        elif e["type"] in ("prune", "mask"):
            record = Prune(
                e["position"],
                e["hash"],
                None,
                e["chars_before"],
                e["chars_after"],
                e["head_end"],
                e["tail_start"],
                masked=e["type"] == "mask",
            )
            if record.masked:  # a mask's commit drops the prune it replaces
                held = [
                    r
                    for r in held
                    if not (
                        isinstance(r, Prune) and (r.position, r.hash) == (e["position"], e["hash"])
                    )
                ]
            held.append(record)
        else:
            continue
        snapshots.append(tuple(held))
    return snapshots


def with_placeholders(
    view: RequestView, records: tuple[ReplacementRecord, ...]
) -> tuple[ReplacementRecord, ...]:
    """``records`` with each mask of ``view``'s branch given its placeholder (its log event
    does not carry it), as ``compaction.masking`` words it for that observation."""
    found = {o.position: o for o in observations(view.body, True)}

    def filled(record: ReplacementRecord) -> ReplacementRecord:
        if not isinstance(record, Prune) or not record.masked or record.position not in found:
            return record
        text = text_of(view.body[record.position].get("content")) or ""
        return dataclasses.replace(record, content=placeholder(found[record.position], text))

    return tuple(filled(r) for r in records)


async def check_replicas(
    store: RedisStore, tenant: str, clients: list[Client], fake: FakeUpstream
) -> None:
    # One summary per compacted span, across both replicas (masking may have made none): a
    # span is named by the chain hashes before and at its ends, not by the call's bytes (two
    # forks' calls carry the same bytes once their earlier spans' summaries read the same).
    # No call without an attempt logged under its lease; an attempt may end uncommitted, or
    # before its call (a round cut off when its replica stops at the end of the run).
    summarized: list[tuple[str, str]] = []
    attempts = 0

    forwarded = {r.body["user"]: r.body["messages"] for r in fake.chat_requests if r.body}
    by_conversation: dict[str, list[tuple[Client, int]]] = defaultdict(list)
    for client in clients:
        generations = [g for _, _, g, _ in client.sent]
        assert generations == sorted(generations), f"{client.name}: generations went back"
        for index, (_, _, _, conversation) in enumerate(client.sent):
            by_conversation[conversation].append((client, index))
    assert len(by_conversation) == 2  # the two runs with one opening share a conversation

    held = 0
    for conversation, sends in by_conversation.items():
        state = await store.load(conversation)
        held += len(state.records)
        events = [e for _, e in (await store.read_log(conversation, limit=100_000)).events]
        summarized += [
            (e["start_prev_hash"], e["end_hash"])
            for e in events
            if e["type"] == "compaction/summary"
        ]
        attempts += sum(
            1 for e in events if e["type"] == "compaction/start" and e.get("kind") == "summary"
        )
        logged = [(e["position"], e["hash"]) for e in events if e["type"] == "message"]
        assert len(logged) == len(set(logged)), "a message was logged twice"
        expected_hashes: set[str] = set()
        parent: dict[str, tuple[int, str]] = {}
        for client, index in sends:
            view = RequestView.of(tenant, MODEL, client.sent[index][1], None)
            for position, chain_hash in enumerate(view.chain):
                parent[chain_hash] = (position, view.chain[position - 1] if position else view.root)
        snapshots = record_sets(events, parent)
        assert {identity(r) for r in snapshots[-1]} == {identity(r) for r in state.records}
        for client, index in sends:
            marker, history, _, _ = client.sent[index]
            view = RequestView.of(tenant, MODEL, history, None)
            expected_hashes |= set(view.chain)
            surfaces = [view.surface(with_placeholders(view, records)) for records in snapshots]
            sent = forwarded[marker]
            assert sent in [s.messages for s in surfaces] or any(
                bridged(view, s, sent) for s in surfaces
            ), f"{marker}: not derived from committed records (and the bridge's cuts)"
        # Forks are logged by content: every content once, no message invented.
        assert {h for _, h in logged} <= expected_hashes, "the log invented messages"
        assert latest_request(events) is not None, "the latest request does not read back"
        # One request event per send, plus one per overflow retry (the two forks keep missing
        # each other's checkpoints, so proactive compaction may stop and recovery take over).
        requests = [e for e in events if e["type"] == "request" and e["status"] != "recovered"]
        usages = [e for e in events if e["type"] == "usage"]
        assert len(requests) == len(usages) == len(sends)
    assert held, "nothing was compacted: the replays were meant to outgrow the window"
    assert len(summarized) == len(set(summarized))
    assert len(summarized) <= len(fake.summary_requests) <= attempts
