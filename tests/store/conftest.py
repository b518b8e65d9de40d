"""One store suite, two backends: the in-process store and a real Redis server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from proxy.store import MemoryStore, Store
from proxy.store.redis import RedisStore
from tests.conftest import REDIS_URL


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    backend: Store
    if request.param == "memory":
        backend = MemoryStore(ttl_seconds=3600)
    else:
        backend = RedisStore(REDIS_URL, ttl_seconds=3600)
        await backend.ping()
    yield backend
    await backend.close()


@pytest.fixture
def conversation() -> str:
    """Every test works in a key space of its own."""
    return f"test-{uuid.uuid4().hex}"
