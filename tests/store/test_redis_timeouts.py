"""A Redis that stops answering: every store operation gives up within its bound, and the
connections it cut off never hand a late answer to the next caller."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest

from compaction_proxy.store import StoreUnavailable
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.redis import RedisStore
from tests.redis_server import RedisServer

BOUND = 0.5  # seconds a store operation may take (twice it, 1 s, is what the test tells apart)


@pytest.fixture
async def store(private_redis: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(private_redis.url, operation_timeout=BOUND)
    yield store
    await store.close()


def pause(server: RedisServer, paused: bool) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


async def test_an_operation_on_a_paused_redis_gives_up_within_its_bound(
    store: RedisStore, private_redis: RedisServer
) -> None:
    await store.append("c", [], attributes=ConversationAttributes(session="c"))
    pause(private_redis, True)
    try:
        started = time.monotonic()
        with pytest.raises(StoreUnavailable) as raised:
            await store.load("c")
        elapsed = time.monotonic() - started
    finally:
        pause(private_redis, False)
    assert raised.value.operation == "load"
    # The bound holds for the whole operation: redis-py's one retry does not double it.
    assert BOUND * 0.9 <= elapsed < BOUND * 1.8
    assert (await store.load("c")).attributes == ConversationAttributes(session="c")


async def test_connections_cut_off_mid_command_never_answer_the_next_caller(
    store: RedisStore, private_redis: RedisServer
) -> None:
    names = [f"conversation-{i}" for i in range(8)]
    for name in names:
        await store.append(name, [], attributes=ConversationAttributes(session=name))
    pause(private_redis, True)
    try:
        # Eight commands in flight on eight connections, each cut off while its answer is
        # still to come; the server sends those answers once it runs again.
        cut_off = await asyncio.gather(
            *(store.load(name) for name in names), return_exceptions=True
        )
    finally:
        pause(private_redis, False)
    assert all(isinstance(outcome, StoreUnavailable) for outcome in cut_off)
    for _ in range(5):
        # A connection that went back to the pool half-read would answer with another
        # conversation's state.
        states = await asyncio.gather(*(store.load(name) for name in reversed(names)))
        assert [state.attributes.session for state in states] == list(reversed(names))


async def test_a_write_cut_off_by_the_bound_leaves_the_store_usable(
    store: RedisStore, private_redis: RedisServer
) -> None:
    pause(private_redis, True)
    try:
        with pytest.raises(StoreUnavailable) as raised:
            await store.record_request(
                "w", [{"type": "request"}], attributes=ConversationAttributes(session="w")
            )
    finally:
        pause(private_redis, False)
    assert raised.value.operation == "record_request"
    await store.record_request(
        "w", [{"type": "request"}], attributes=ConversationAttributes(session="w2")
    )
    assert (await store.load("w")).attributes.session == "w2"
