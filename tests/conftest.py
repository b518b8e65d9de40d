"""Shared fixtures: a clean environment, the fake upstream, the proxy, the real openai SDK."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from proxy.app import create_app
from proxy.config import Settings, load_settings
from proxy.testing.fake_upstream import FakeUpstream

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
_ENV_PREFIXES = ("COMPACTION_PROXY_",)
_ENV_NAMES = ("OPENAI_BASE_URL", "REDIS_URL", "OPENAI_API_KEY")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Settings must come from the test, not from whatever the machine exports."""
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES:
            monkeypatch.delenv(name)
    yield


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def upstream_url(fake: FakeUpstream, aiohttp_server: Any) -> str:
    server: TestServer = await aiohttp_server(fake.app())
    return str(server.make_url("/v1"))


ProxyFactory = Callable[..., Awaitable[str]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, upstream_url: str) -> ProxyFactory:
    """Start a proxy in front of the fake upstream; returns its base URL (with /v1)."""

    async def start(**overrides: Any) -> str:
        values: dict[str, Any] = {"upstream_base_url": upstream_url, "tenant_secret": "t-secret"}
        values.update(overrides)
        settings: Settings = load_settings(None, **values)
        server: TestServer = await aiohttp_server(create_app(settings))
        return str(server.make_url("/v1"))

    return start


@pytest.fixture
async def proxy_url(make_proxy: ProxyFactory) -> str:
    return await make_proxy()


@pytest.fixture
async def client(proxy_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as c:
        yield c
