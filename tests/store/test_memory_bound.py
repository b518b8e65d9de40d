"""The in-process store's byte bound holds for every write: messages, request records,
compaction events and the records a commit adds. Its counter always equals the bytes it really
holds, whatever the sequence of operations, and conversations that compact stay near the bound.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from compaction_proxy.conversation.log_events import MessageEvent
from compaction_proxy.conversation.replacements import Checkpoint, Prune, record_to_dict
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.parsing import jsonio
from compaction_proxy.store import MemoryStore
from compaction_proxy.store.attributes import ConversationAttributes
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.helpers import MASKING_OFF, chat, counter, route

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

SESSION = {"X-Session-Id": "one-big-conversation"}


def held_bytes(store: MemoryStore) -> int:
    """What the store really holds: every conversation's logged events and its records, each
    as its JSON."""
    total = 0
    for entry in store._conversations.values():
        log = entry.log
        total += sum(len(log.event(index)[1]) for index in range(len(log)))
        total += sum(
            len(jsonio.dumps(record_to_dict(r))) for r in (p.record for p in entry.records.on(None))
        )
    return total


def summary(end: int, size: int) -> Checkpoint:
    message = {
        "role": "user",
        "content": "<compacted-summary>" + "s" * size + "</compacted-summary>",
    }
    return Checkpoint(0, end, "root", f"hash-{end}", message, tokens=size // 4)


def message(position: int, size: int) -> MessageEvent:
    event = {"type": "message", "position": position, "content": "m" * size}
    return MessageEvent(position, f"hash-{position}", event)


operation = st.one_of(
    st.tuples(st.just("append"), st.integers(0, 3), st.integers(1, 6), st.integers(0, 2000)),
    st.tuples(st.just("record"), st.integers(0, 3), st.integers(1, 4), st.integers(0, 500)),
    st.tuples(st.just("compact"), st.integers(0, 3), st.integers(1, 30), st.integers(0, 4000)),
    st.tuples(st.just("fail"), st.integers(0, 3), st.integers(1, 30), st.integers(0, 300)),
    st.tuples(st.just("prune"), st.integers(0, 3), st.integers(1, 30), st.integers(0, 1000)),
)


async def run(store: MemoryStore, op: tuple[str, int, int, int]) -> None:
    kind, which, count, size = op
    name = f"c{which}"
    if kind == "append":
        await store.append(name, [message(i, size) for i in range(count)])
    elif kind == "record":
        attributes = ConversationAttributes(model="m" * count)
        await store.record_request(name, [{"type": "usage", "pad": "u" * size}], None, attributes)
    else:
        start = {"type": "compaction/start", "pad": "p" * size}
        if (await store.begin_compaction(name, "me", 30, start)).value != "begun":
            return
        if kind == "fail":
            await store.end_compaction(name, "me", {"type": "compaction/end", "error": "x"})
            return
        record: Any = summary(count, size)
        if kind == "prune":
            record = Prune(count, f"hash-{count}", "c" * size, chars_before=size * 2)
        state = await store.load(name)
        superseded = (
            [r for r in state.records if isinstance(r, Checkpoint)] if kind == "compact" else []
        )
        events = [{"type": "compaction/summary", "text": "t" * size}, {"type": "compaction/end"}]
        await store.commit_compaction(name, "me", events, [record], superseded)


@settings(max_examples=60, deadline=None)
@given(st.lists(operation, min_size=1, max_size=40), st.integers(2_000, 40_000))
def test_the_counter_is_the_bytes_really_held_after_any_operations(
    operations: list[tuple[str, int, int, int]], max_bytes: int
) -> None:
    async def check() -> None:
        store = MemoryStore(max_bytes=max_bytes, max_log_events=100)
        for op in operations:
            await run(store, op)
            assert store.size_bytes == held_bytes(store)
            assert store.size_bytes >= 0

    asyncio.run(check())


async def test_three_hundred_compacting_conversations_stay_within_half_again_the_bound() -> None:
    bound = 300_000
    store = MemoryStore(max_bytes=bound)
    largest = 0
    for n in range(300):
        name = f"conversation-{n}"
        await store.append(name, [message(i, 300) for i in range(20)])
        for round_ in range(3):
            start = {"type": "compaction/start"}
            assert (await store.begin_compaction(name, f"o{round_}", 30, start)).value == "begun"
            events = [{"type": "compaction/summary", "text": "t" * 2000}, {"type": "end"}]
            state = await store.load(name)
            await store.commit_compaction(
                name, f"o{round_}", events, [summary(19, 3000)], list(state.records)
            )
        largest = max(largest, store.size_bytes, held_bytes(store))
    assert largest <= 1.5 * bound, largest


async def test_one_conversation_past_the_bound_is_still_compacted_from_its_request(
    make_proxy: ProxyFactory, upstream_url: str
) -> None:
    """A conversation whose messages alone outgrow the store: its log is cut to the bound,
    and its requests are still served and compacted (from the request and its records)."""
    bound = 1024 * 1024
    proxy = await make_proxy(
        memory_max_bytes=bound,
        routes=[route(upstream_url, "small-*", 16_000, precompact_ratio=0, **MASKING_OFF)],
    )
    history = [system(), user("Make the importer idempotent.")]
    statuses = []
    dropped = counter("compaction_proxy_log_bytes_dropped_total")
    for turn in range(8):
        history += agent_turns(4, output=f"turn {turn} " + "log line " * 6_000)
        answer = await chat(
            proxy.url, [*history, user("Where are we?")], "small-1", extra_headers=SESSION
        )
        statuses.append(answer.headers["x-compaction-status"])
        await proxy.app[SERVICES].pending_log_writes.settled_all()
        memory = proxy.store.inner  # type: ignore[attr-defined]
        assert isinstance(memory, MemoryStore) and memory.size_bytes <= bound
    assert "bypass" not in statuses
    assert counter("compaction_proxy_log_bytes_dropped_total") > dropped
    assert statuses[-1] in {"compacted", "masked", "pruned"}, statuses
