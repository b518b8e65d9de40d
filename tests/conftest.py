"""Shared fixtures: a clean environment, the fake upstream, the proxy, the real openai SDK."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import redis
from aiohttp import web
from aiohttp.test_utils import TestServer

from compaction_proxy.config.settings import Settings, load_settings
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.ops.app import create_app
from compaction_proxy.store import MemoryStore, Store
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.processes import free_port
from tests.redis_server import RedisServer

# The Redis the tests write into: ``$REDIS_URL`` when set (a server the caller gives the tests),
# otherwise a private redis-server this test session starts on a free port and stops at the
# end. Tests never write into a server they did not start or were not given.
REDIS_URL = os.environ.get("REDIS_URL", "")
_session_redis: subprocess.Popen[bytes] | None = None


def pytest_configure(config: pytest.Config) -> None:
    global REDIS_URL, _session_redis
    if REDIS_URL:
        return
    binary = shutil.which("redis-server")
    if binary is None:
        raise pytest.UsageError("redis-server is not installed: install it, or set REDIS_URL")
    port = free_port()
    _session_redis = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    REDIS_URL = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(REDIS_URL)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    client.close()


def pytest_unconfigure(config: pytest.Config) -> None:
    if _session_redis is not None:
        _session_redis.kill()
        _session_redis.wait()


# Tiers, by where a test lives; ``slow`` on top for whole files that replay transcripts, run
# processes, a browser, Prometheus or the deploy tools (``pytest -m "not slow"``: a quick local
# loop). A test may also carry ``@pytest.mark.slow`` itself.
TIERS = {"unit": "unit", "store": "store", "e2e": "e2e", "deploy": "deploy"}
SLOW_FILES = frozenset(
    {
        "test_crashes.py",
        "test_dashboard.py",
        "test_fuzz.py",
        "test_inspector.py",
        "test_process.py",
        "test_redis_resilience.py",
        "test_replicas.py",
        "test_responses_replay.py",
        "test_messages_replay.py",
        "test_transcript_replay.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        path = item.path
        tier = TIERS.get(path.parent.name)
        if tier is not None:
            item.add_marker(tier)
        if tier == "deploy" or path.name in SLOW_FILES:
            item.add_marker("slow")


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
async def private_redis() -> AsyncIterator[RedisServer]:
    """A redis-server of the test's own, to stop and restart at will."""
    server = RedisServer()
    await server.start()
    yield server
    await server.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A local three-master Redis Cluster, started once per test session."""
    from tests.redis_cluster import RedisCluster

    cluster = RedisCluster(tmp_path_factory.mktemp("redis-cluster"))
    cluster.start()
    yield cluster.url
    cluster.stop()


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """Every backend: the in-process store, a real Redis server, a real Redis Cluster."""
    backend: Store
    if request.param == "memory":
        backend = MemoryStore(ttl_seconds=3600)
    else:
        url = REDIS_URL
        if request.param == "redis-cluster":
            url = request.getfixturevalue("redis_cluster_url")
        backend = RedisStore(url, ttl_seconds=3600)
        await backend.ping()
    yield backend
    await backend.close()


@pytest.fixture
def conversation() -> str:
    """A conversation id of its own, so every test works in a key space of its own."""
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def fake() -> FakeUpstream:
    return FakeUpstream()


@pytest.fixture
async def upstream_url(fake: FakeUpstream, aiohttp_server: Any) -> str:
    server: TestServer = await aiohttp_server(fake.app())
    return str(server.make_url("/v1"))


@dataclass
class RunningProxy:
    url: str  # base URL with /v1, as an SDK's base_url
    app: web.Application
    server: TestServer

    @property
    def root(self) -> str:
        return self.url.removesuffix("/v1")

    @property
    def store(self) -> Store:
        return self.app[SERVICES].store

    async def read_log(self, conversation: str, limit: int = 10_000) -> list[dict[str, Any]]:
        """The conversation's log events as the admin API reads them: once every answered
        request's record is written (a request logs its messages after its answer)."""
        await self.app[SERVICES].pending_records.settled_all()
        page = await self.store.read_log(conversation, limit=limit)
        return [event for _, event in page.events]


ProxyFactory = Callable[..., Awaitable[RunningProxy]]


@pytest.fixture
def make_proxy(aiohttp_server: Any, upstream_url: str) -> ProxyFactory:
    """Start a proxy in front of the fake upstream (in-process store unless overridden)."""

    async def start(**overrides: Any) -> RunningProxy:
        values: dict[str, Any] = {"upstream_base_url": upstream_url, "tenant_secret": "t-secret"}
        values.update(overrides)
        settings: Settings = load_settings(None, **values)
        app = create_app(settings)
        server: TestServer = await aiohttp_server(app)
        # Tests expect the whole proxy, litellm's tokenizers and overflow check included.
        await lazy_litellm.loaded()
        return RunningProxy(str(server.make_url("/v1")), app, server)

    return start


@pytest.fixture
async def proxy(make_proxy: ProxyFactory) -> RunningProxy:
    return await make_proxy()


@pytest.fixture
def proxy_url(proxy: RunningProxy) -> str:
    return proxy.url


@pytest.fixture
async def client(proxy_url: str) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(base_url=proxy_url, api_key="sk-test", max_retries=0) as c:
        yield c


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the transcript replay figures (raw vs forwarded tokens) and the real agents'
    (the proxy's summary calls when an agent compacts on its own) after the run."""
    from tests.e2e.test_real_agents import SUMMARY_REPORT
    from tests.e2e.test_transcript_replay import REPLAY_REPORT

    for title, lines in (
        ("transcript replay through the proxy", sorted(REPLAY_REPORT)),
        ("real agents through the proxy", SUMMARY_REPORT),
    ):
        if lines:
            terminalreporter.section(title)
            for line in lines:
                terminalreporter.write_line(line)
