"""Conversation stores: ``Store`` (the contract), ``MemoryStore`` and ``RedisStore``."""

from __future__ import annotations

from compaction_proxy.config.settings import Settings
from compaction_proxy.conversation.log_events import Event, MessageEvent
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.store.base import (
    BeginResult,
    ConversationState,
    LogPage,
    Store,
    StoreUnavailable,
)
from compaction_proxy.store.fallback import FallbackStore
from compaction_proxy.store.instrumented import InstrumentedStore
from compaction_proxy.store.memory import MemoryStore


def open_store(settings: Settings) -> Store:
    """The store ``store_url`` names (``memory://`` or a Redis URL), instrumented; a shared
    one with this process's fallback while it is out of reach (``store/fallback.py``)."""
    store = InstrumentedStore(_backend(settings))
    if settings.store_url.startswith("memory://") or not settings.store_fallback:
        return store
    return FallbackStore(store)


def _backend(settings: Settings) -> Store:
    if settings.store_url.startswith("memory://"):
        return MemoryStore(
            max_conversations=settings.memory_max_conversations,
            ttl_seconds=settings.store_ttl_seconds,
            max_log_events=settings.log_max_events,
            max_log_bytes=settings.log_max_bytes,
            max_bytes=settings.memory_max_bytes,
            record_ttl_seconds=settings.record_ttl_seconds,
        )
    from compaction_proxy.store.redis import RedisStore

    return RedisStore(
        settings.store_url,
        ttl_seconds=settings.store_ttl_seconds,
        max_log_events=settings.log_max_events,
        max_log_bytes=settings.log_max_bytes,
        compress_log=settings.log_compression,
        pool_size=settings.store_pool_size,
        operation_timeout=settings.store_socket_timeout,
        connect_timeout=settings.store_connect_timeout,
        record_ttl_seconds=settings.record_ttl_seconds,
    )


__all__ = [
    "Anchor",
    "BeginResult",
    "ConversationState",
    "Event",
    "LogPage",
    "MemoryStore",
    "MessageEvent",
    "Store",
    "StoreUnavailable",
    "open_store",
]
