"""A Redis that stops answering costs one operation its bound, not every operation: the
circuit opens, later operations fail at once, a background ping closes it when Redis is back."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator

import pytest

from compaction_proxy.store import StoreUnavailable
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import Store
from compaction_proxy.store.circuit import StoreCircuit, is_outage
from compaction_proxy.store.instrumented import InstrumentedStore
from compaction_proxy.store.redis import RedisStore
from tests.helpers import counter
from tests.redis_server import RedisServer

BOUND = 0.5  # seconds a store operation may take


@pytest.fixture
async def store(private_redis: RedisServer) -> AsyncIterator[InstrumentedStore]:
    inner = RedisStore(private_redis.url, operation_timeout=BOUND)
    store = InstrumentedStore(inner, StoreCircuit(inner.ping, first_probe_seconds=0.2))
    yield store
    await store.close()


def pause(server: RedisServer, paused: bool) -> None:
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP if paused else signal.SIGCONT)


async def failing_time(store: Store) -> float:
    started = time.monotonic()
    with pytest.raises(StoreUnavailable):
        await store.load("c")
    return time.monotonic() - started


async def test_a_paused_redis_costs_one_operation_its_bound_and_is_used_again_once_back(
    store: InstrumentedStore, private_redis: RedisServer
) -> None:
    await store.append("c", [], attributes=ConversationAttributes(session="c"))
    pause(private_redis, True)
    try:
        assert BOUND * 0.9 <= await failing_time(store) < BOUND * 1.8
        assert store.circuit.is_open
        assert counter("compaction_proxy_store_circuit_open") == 1
        later = [await failing_time(store) for _ in range(20)]
        assert max(later) < 0.05  # no operation waits for it any more
        with pytest.raises(StoreUnavailable):
            await store.ping()  # readiness says so at once too
        await asyncio.sleep(1.0)  # pings meanwhile go unanswered: it stays open
        assert store.circuit.is_open
    finally:
        pause(private_redis, False)
    deadline = time.monotonic() + 5
    while store.circuit.is_open and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert not store.circuit.is_open
    assert counter("compaction_proxy_store_circuit_open") == 0
    assert (await store.load("c")).attributes == ConversationAttributes(session="c")


def test_only_an_outage_opens_the_circuit() -> None:
    assert is_outage(StoreUnavailable("load", "TimeoutError"))
    assert is_outage(StoreUnavailable("load", "ConnectionError"))
    assert not is_outage(StoreUnavailable("commit", "ResponseError"))  # it answered
    assert not is_outage(StoreUnavailable("load"))
