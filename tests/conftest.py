"""Shared fixtures: a clean environment, the fake upstream, the proxy, the real openai SDK."""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from compaction_proxy.config.settings import Settings, load_settings
from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.tokenizers import use_bundled_tokenizers
from compaction_proxy.ops.app import create_app
from compaction_proxy.store import MemoryStore, Store
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.redis_cluster import ClusterInBackground
from tests.redis_server import RedisServer, shared_redis_url
from tests.reports import REPORTS, TRANSCRIPT_REPLAY

# Tiers, by the directory a test lives in (``tests/<tier>/...``); the slow tiers also carry
# ``slow``, so ``pytest -m "not slow"`` is the quick local loop. A test elsewhere may carry
# ``@pytest.mark.slow`` itself.
TIERS = frozenset({"unit", "store", "e2e", "system", "deploy"})
SLOW_TIERS = frozenset({"system", "deploy"})
TESTS = Path(__file__).parent
_CLUSTER = pytest.StashKey["ClusterInBackground"]()


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: half as many workers again as the cores this process may run on. The
    suite spends about half its time waiting (on sockets, timers, the servers and agents it
    starts): one worker a core kept two cores 55 % busy, three workers finish the quick tier
    and the whole suite about a fifth sooner, a fourth costs more in its start-up than it
    saves (docs/perf.md, "Workers for ``-n auto``"). ``PYTEST_XDIST_AUTO_NUM_WORKERS``, where
    set, decides as pytest-xdist documents."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    cores = len(os.sched_getaffinity(0))
    return cores + max(1, cores // 2)


def pytest_configure(config: pytest.Config) -> None:
    """Compiled modules are cached in ``__pycache__`` (git-ignored) for the run, even where the
    environment says not to (``PYTHONDONTWRITEBYTECODE``, as container images often set).
    Otherwise every xdist worker and every proxy process a test starts compiles the package
    and the test modules from source again (docs/perf.md, "The quick tier under a minute").
    Workers and subprocesses inherit the environment, so it is cleared there too. The
    tokenizers' environment is set here as well, before any test starts a thread (the
    cluster's, a proxy's): ``use_bundled_tokenizers`` says why."""
    sys.dont_write_bytecode = False
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    use_bundled_tokenizers()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(tier)
        if tier in SLOW_TIERS:
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


@pytest.fixture(params=["memory", "redis"])
def store_url(request: pytest.FixtureRequest) -> str:
    """A proxy's ``store_url`` for each backend: the in-process store, the shared Redis."""
    return "memory://" if request.param == "memory" else shared_redis_url()


@pytest.fixture
async def private_redis() -> AsyncIterator[RedisServer]:
    """A redis-server of the test's own, to stop and restart at will."""
    server = RedisServer()
    await server.start()
    yield server
    await server.stop()


def _wants_a_cluster(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    store_param = callspec.params.get("store") if callspec is not None else None
    return store_param == "redis-cluster" or "redis_cluster_url" in getattr(
        item, "fixturenames", ()
    )


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the Redis Cluster the selected tests need as soon as they are known, so its
    start-up overlaps the tests that run first (``ClusterInBackground``)."""
    if session.config.option.collectonly or not ClusterInBackground.possible():
        return
    if any(_wants_a_cluster(item) for item in session.items):
        session.config.stash[_CLUSTER] = ClusterInBackground()


@pytest.fixture(scope="session")
def redis_cluster_url(request: pytest.FixtureRequest) -> str:
    """A local three-master Redis Cluster, started once per test session (per xdist worker)."""
    started = request.config.stash.get(_CLUSTER, None)
    if started is None:  # not started early; without the binaries, RedisCluster skips
        started = request.config.stash[_CLUSTER] = ClusterInBackground()
    return started.ready().url


@pytest.fixture(params=["memory", "redis", "redis-cluster"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[Store]:
    """Every backend: the in-process store, a real Redis server, a real Redis Cluster."""
    backend: Store
    if request.param == "memory":
        backend = MemoryStore(ttl_seconds=3600)
    else:
        url = shared_redis_url()
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
        await self.app[SERVICES].pending_log_writes.settled_all()
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


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist: a worker's report lines, to the controller's."""
    for title, lines in orjson.loads(node.workeroutput.get("reports", b"{}")).items():
        REPORTS[title].extend(lines)


def pytest_sessionfinish(session: pytest.Session) -> None:
    cluster = session.config.stash.get(_CLUSTER, None)
    if cluster is not None:
        cluster.stop()
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:  # a pytest-xdist worker
        workeroutput["reports"] = orjson.dumps(REPORTS).decode()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """Print the figures tests reported (``tests.reports``) after the run."""
    for title, lines in sorted(REPORTS.items()):
        terminalreporter.section(title)
        for line in sorted(lines) if title == TRANSCRIPT_REPLAY else lines:
            terminalreporter.write_line(line)
