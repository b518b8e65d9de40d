"""A Store wrapper that times every operation and counts failures (Prometheus).

Wraps either backend, so the backends stay free of metrics and the handlers free of timing.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from types import TracebackType

from compaction_proxy.conversation.log_events import Event, MessageEvent
from compaction_proxy.conversation.replacements import ReplacementRecord
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metrics import (
    LEASE_WAIT_DURATION,
    LEASE_WAITS,
    STORE_DURATION,
    STORE_ERRORS,
    child,
)
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import (
    BeginResult,
    ConversationState,
    ConversationSummary,
    LogPage,
    Store,
    StoreUnavailable,
)
from compaction_proxy.store.circuit import StoreCircuit


class _Observed:
    """Times one store operation, and counts it failed when the store was unavailable; while
    the circuit is open (``store.circuit``), fails it at once. A plain context manager: it
    runs twice a request, and a generator-based one costs several times as much."""

    __slots__ = ("_circuit", "_operation", "_started")

    def __init__(self, circuit: StoreCircuit, operation: str) -> None:
        self._circuit = circuit
        self._operation = operation
        self._started = 0.0

    def __enter__(self) -> None:
        self._circuit.check(self._operation)
        self._started = time.perf_counter()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if isinstance(error, StoreUnavailable):
            STORE_ERRORS.labels(operation=self._operation).inc()
            self._circuit.failed(error)
        child(STORE_DURATION, self._operation).observe(time.perf_counter() - self._started)


class InstrumentedStore:
    def __init__(self, inner: Store, circuit: StoreCircuit | None = None) -> None:
        self.inner = inner
        self.circuit = circuit if circuit is not None else StoreCircuit(inner.ping)

    def _observed(self, operation: str) -> _Observed:
        return _Observed(self.circuit, operation)

    async def ping(self) -> None:
        with self._observed("ping"):
            await self.inner.ping()

    async def load(
        self, conversation: str, chain: Sequence[str] | None = None
    ) -> ConversationState:
        with self._observed("load"):
            return await self.inner.load(conversation, chain)

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: ConversationAttributes | None = None,
    ) -> int:
        with self._observed("append"):
            return await self.inner.append(conversation, messages, events, attributes)

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: ConversationAttributes | None = None,
        messages: Sequence[MessageEvent] = (),
        reached: Sequence[ReplacementRecord] = (),
    ) -> None:
        with self._observed("record_request"):
            await self.inner.record_request(
                conversation, events, anchor, attributes, messages, reached
            )

    async def begin_compaction(
        self,
        conversation: str,
        owner: str,
        ttl_seconds: float,
        start_event: Event,
        expected_generation: int | None = None,
        chain: Sequence[str] | None = None,
        at: int = -1,
    ) -> BeginResult:
        with self._observed("begin_compaction"):
            return await self.inner.begin_compaction(
                conversation, owner, ttl_seconds, start_event, expected_generation, chain, at
            )

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        with self._observed("commit_compaction"):
            return await self.inner.commit_compaction(
                conversation, owner, events, records, superseded
            )

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        with self._observed("end_compaction"):
            await self.inner.end_compaction(conversation, owner, end_event)

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        with self._observed("renew_lease"):
            return await self.inner.renew_lease(conversation, owner, ttl_seconds)

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        with self._observed("read_log"):
            return await self.inner.read_log(conversation, after, limit)

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        with self._observed("list_conversations"):
            return await self.inner.list_conversations(limit, offset)

    async def wait_for_lease(
        self, conversation: str, max_wait: float, chain: Sequence[str] | None = None
    ) -> bool:
        started = time.perf_counter()
        with self._observed("wait_for_lease"):
            released = await self.inner.wait_for_lease(conversation, max_wait, chain)
        LEASE_WAITS.labels(result="released" if released else "timed_out").inc()
        LEASE_WAIT_DURATION.observe(time.perf_counter() - started)
        return released

    async def claim_objects(self, tenant: str, ids: Sequence[str], ttl_seconds: float) -> None:
        with self._observed("claim_objects"):
            await self.inner.claim_objects(tenant, ids, ttl_seconds)

    async def object_owners(self, ids: Sequence[str]) -> list[str | None]:
        with self._observed("object_owners"):
            return await self.inner.object_owners(ids)

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        with self._observed("take_quota"):
            return await self.inner.take_quota(quotas, window_seconds)

    async def give_back_quota(self, names: Sequence[str], window_seconds: int) -> None:
        with self._observed("give_back_quota"):
            await self.inner.give_back_quota(names, window_seconds)

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        with self._observed("shared_secret"):
            return await self.inner.shared_secret(name, candidate)

    async def close(self) -> None:
        await self.circuit.close()
        await self.inner.close()
