"""A Store wrapper that times every operation and counts failures (Prometheus).

Wraps either backend, so the backends stay free of metrics and the handlers free of timing.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from proxy.conversation import ReplacementRecord
from proxy.metrics import LEASE_WAIT_DURATION, LEASE_WAITS, STORE_DURATION, STORE_ERRORS, child
from proxy.store.base import (
    Anchor,
    BeginResult,
    ConversationState,
    ConversationSummary,
    Event,
    LogPage,
    MessageEvent,
    Opened,
    Store,
    StoreUnavailable,
)


@asynccontextmanager
async def _observed(operation: str) -> AsyncIterator[None]:
    started = time.perf_counter()
    try:
        yield
    except StoreUnavailable:
        STORE_ERRORS.labels(operation=operation).inc()
        raise
    finally:
        child(STORE_DURATION, operation).observe(time.perf_counter() - started)


class InstrumentedStore:
    def __init__(self, inner: Store) -> None:
        self.inner = inner

    async def ping(self) -> None:
        async with _observed("ping"):
            await self.inner.ping()

    async def load(self, conversation: str) -> ConversationState:
        async with _observed("load"):
            return await self.inner.load(conversation)

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: dict[str, str] | None = None,
    ) -> int:
        async with _observed("append"):
            return await self.inner.append(conversation, messages, events, attributes)

    async def open(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        attributes: dict[str, str] | None = None,
    ) -> Opened:
        async with _observed("open"):
            return await self.inner.open(conversation, messages, attributes)

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: dict[str, str] | None = None,
    ) -> None:
        async with _observed("record_request"):
            await self.inner.record_request(conversation, events, anchor, attributes)

    async def begin_compaction(
        self,
        conversation: str,
        owner: str,
        ttl_seconds: float,
        start_event: Event,
        expected_generation: int | None = None,
    ) -> BeginResult:
        async with _observed("begin_compaction"):
            return await self.inner.begin_compaction(
                conversation, owner, ttl_seconds, start_event, expected_generation
            )

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        async with _observed("commit_compaction"):
            return await self.inner.commit_compaction(
                conversation, owner, events, records, superseded
            )

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        async with _observed("end_compaction"):
            await self.inner.end_compaction(conversation, owner, end_event)

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        async with _observed("renew_lease"):
            return await self.inner.renew_lease(conversation, owner, ttl_seconds)

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        async with _observed("read_log"):
            return await self.inner.read_log(conversation, after, limit)

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        async with _observed("list_conversations"):
            return await self.inner.list_conversations(limit, offset)

    async def wait_for_lease(self, conversation: str, max_wait: float) -> bool:
        started = time.perf_counter()
        async with _observed("wait_for_lease"):
            released = await self.inner.wait_for_lease(conversation, max_wait)
        LEASE_WAITS.labels(result="released" if released else "timed_out").inc()
        LEASE_WAIT_DURATION.observe(time.perf_counter() - started)
        return released

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        async with _observed("take_quota"):
            return await self.inner.take_quota(quotas, window_seconds)

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        async with _observed("shared_secret"):
            return await self.inner.shared_secret(name, candidate)

    async def close(self) -> None:
        await self.inner.close()
