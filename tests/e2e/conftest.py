"""Fixtures the end-to-end tests share, over the root ``conftest.py``'s (the fake upstream, the
proxy, the stores, which the store and system tiers use too): the proxy's URL and the real
openai SDK's client on it. The admin API's tests add theirs in ``admin/conftest.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import RunningProxy


@pytest.fixture
def proxy_url(proxy: RunningProxy) -> str:
    return proxy.url


@pytest.fixture
async def client(proxy_url: str) -> AsyncIterator[Any]:
    """The real openai SDK's async client on the proxy (skipped without the SDK)."""
    openai = pytest.importorskip("openai")
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as c:
        yield c
