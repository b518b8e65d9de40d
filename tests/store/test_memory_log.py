"""The in-process store's log, against a model: a list of every event appended, of which the
newest ``max_log_events`` are kept; read back page by page, and counted in bytes."""

from __future__ import annotations

import asyncio

import pytest

from compaction_proxy.parsing import jsonio
from compaction_proxy.store import MemoryStore

pytest.importorskip("hypothesis")

from hypothesis import example, given, settings
from hypothesis import strategies as st

MAX_EVENTS = 100  # the smallest bound the store takes

# Sizes from empty to several KiB, so that dropping the oldest events moves the buffer too.
events = st.builds(
    lambda n, text: {"type": "request", "n": n, "text": text},
    st.integers(0, 10**6),
    st.one_of(st.text(max_size=20), st.integers(1000, 5000).map(lambda n: "é" * n)),
)


async def read_all(store: MemoryStore, conversation: str, limit: int) -> list[tuple[str, object]]:
    page = await store.read_log(conversation, limit=limit)
    read = list(page.events)
    while page.next_cursor is not None:
        page = await store.read_log(conversation, after=page.next_cursor, limit=limit)
        read += page.events
    return read


def many(count: int, size: int = 10) -> list[dict[str, object]]:
    return [{"type": "request", "n": n, "text": "x" * size} for n in range(count)]


@settings(max_examples=40, deadline=None)
@given(
    batches=st.lists(st.lists(events, max_size=60), min_size=2, max_size=12),
    limit=st.integers(1, 150),
)
# Past the bound by a few events at a time, and by more than the bound at once.
@example(batches=[many(95), many(3), many(4, 3000), many(250)], limit=7)
def test_the_log_reads_back_the_newest_events_with_their_ids_and_bytes(
    batches: list[list[dict[str, object]]], limit: int
) -> None:
    async def check() -> None:
        store = MemoryStore(max_log_events=MAX_EVENTS)
        appended: list[dict[str, object]] = []
        for batch in batches:
            await store.append("c", [], batch)
            appended += batch
            kept = appended[-MAX_EVENTS:]
            first_id = len(appended) - len(kept) + 1
            read = await read_all(store, "c", limit)
            assert [event for _, event in read] == kept
            assert [event_id for event_id, _ in read] == [
                f"{first_id + i}-0" for i in range(len(kept))
            ]
            assert store.size_bytes == sum(len(jsonio.dumps(event)) for event in kept)
            if read:
                # Reading after any id held gives the events after it, and only those.
                middle = len(read) // 2
                after = await store.read_log("c", after=read[middle][0], limit=MAX_EVENTS)
                assert [e for _, e in after.events] == kept[middle + 1 :]

    asyncio.run(check())


async def test_the_buffer_holds_at_most_twice_the_bytes_of_the_events_it_keeps() -> None:
    """What ``max_bytes`` bounds is the events' bytes; the buffer behind them drops the
    oldest ones' bytes once they are half of it, so memory stays within twice that."""
    store = MemoryStore(max_log_events=MAX_EVENTS)
    for turn in range(50):
        await store.append("c", [], many(37, size=100 + 40 * turn))
        buffer = store._conversations["c"].log.data
        largest = len(jsonio.dumps(many(1, size=100 + 40 * turn)[0]))
        assert len(buffer) <= 2 * store.size_bytes + largest
