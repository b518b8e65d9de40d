"""Degrade, don't fail: faults injected under load cost no client request.

Two replicas on one real Redis the test owns, four agent conversations that never trim their
history (they leave compaction to the proxy), a 16k window the fake upstream enforces, and
summary calls that take a second. Each scenario runs the conversations in three phases
(before, during and after the fault) and requires every request answered. Before model-free
relief, a history past its window went raw to a certain overflow whenever the store or the
summarizer was away: every request of the fault's phase failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import route
from tests.processes import proxy_process
from tests.redis_server import RedisServer
from tests.reports import report
from tests.synthetic import agent_conversation
from tests.transcripts import replay_requests

pytest.importorskip("openai")

import openai

MODEL = "fault-model"
WINDOW = 16_000
CONVERSATIONS = 4
TURNS = 90  # about 30k tokens at the end: twice the window, never trimmed by the client
BEFORE, DURING, AFTER = range(0, 40), range(40, 64), range(64, TURNS)


@dataclass
class Outcomes:
    failures: list[str] = field(default_factory=list)
    statuses: dict[int, list[str]] = field(default_factory=dict)  # by phase
    seconds: dict[int, list[float]] = field(default_factory=dict)  # by phase
    firsts: dict[int, list[float]] = field(default_factory=dict)  # each conversation's first


@dataclass
class Conversation:
    requests: list[list[dict[str, Any]]]
    clients: list[openai.AsyncOpenAI]

    async def send(self, turns: range, phase: int, outcomes: Outcomes) -> None:
        for turn in turns:
            if turn >= len(self.requests):
                return
            client = self.clients[turn % len(self.clients)]  # replicas in turn
            started = time.perf_counter()
            try:
                raw = await client.chat.completions.with_raw_response.create(
                    model=MODEL,
                    messages=self.requests[turn],  # type: ignore[arg-type]
                )
                raw.parse()
                outcomes.statuses.setdefault(phase, []).append(raw.headers["x-compaction-status"])
            except openai.APIError as error:
                outcomes.failures.append(f"turn {turn}: {error}")
            took = time.perf_counter() - started
            outcomes.seconds.setdefault(phase, []).append(took)
            if turn == turns.start:
                outcomes.firsts.setdefault(phase, []).append(took)


@dataclass
class Replicas:
    """Where the two replicas run: both in this process (each with its own services, sharing
    the process's metrics), or each in a process of its own, as in production."""

    separate: bool
    make_proxy: ProxyFactory
    upstream_url: str
    redis_server: RedisServer

    @property
    def label(self) -> str:
        return "two processes" if self.separate else "one process"

    async def start(self, stack: contextlib.AsyncExitStack, **settings: Any) -> list[str]:
        """The base URLs of two replicas started with ``settings``."""
        routes = [route(self.upstream_url, MODEL, WINDOW)]
        if not self.separate:
            started: list[RunningProxy] = [
                await self.make_proxy(store_url=self.redis_server.url, routes=routes, **settings)
                for _ in range(2)
            ]
            return [replica.url for replica in started]
        env = {
            "COMPACTION_PROXY_UPSTREAM_BASE_URL": self.upstream_url,
            "COMPACTION_PROXY_TENANT_SECRET": "fault-secret",
            "COMPACTION_PROXY_ROUTES": orjson.dumps(routes).decode(),
            "COMPACTION_PROXY_LOG_LEVEL": "WARNING",
            "REDIS_URL": self.redis_server.url,
            **{f"COMPACTION_PROXY_{key.upper()}": str(value) for key, value in settings.items()},
        }
        bases = [(await stack.enter_async_context(proxy_process(env)))[1] for _ in range(2)]
        return [f"{base}/v1" for base in bases]


@pytest.fixture(params=[False, True], ids=["one-process", "two-processes"])
def replicas(
    request: pytest.FixtureRequest,
    make_proxy: ProxyFactory,
    upstream_url: str,
    private_redis: RedisServer,
) -> Replicas:
    return Replicas(request.param, make_proxy, upstream_url, private_redis)


async def run_with_fault(
    replicas: Replicas,
    fake: FakeUpstream,
    start_fault: Callable[[], Awaitable[None]],
    end_fault: Callable[[], Awaitable[None]],
    **settings: Any,
) -> Outcomes:
    """The scenario against two replicas started with ``settings``."""
    fake.windows[MODEL] = WINDOW
    fake.summary_delay = 1.0
    async with contextlib.AsyncExitStack() as stack:
        bases = await replicas.start(stack, **settings)
        return await _run(bases, start_fault, end_fault)


async def _run(
    bases: list[str],
    start_fault: Callable[[], Awaitable[None]],
    end_fault: Callable[[], Awaitable[None]],
) -> Outcomes:
    clients = [
        openai.AsyncOpenAI(base_url=base, api_key="sk-agent", max_retries=0, timeout=60)
        for base in bases
    ]
    run = uuid.uuid4().hex
    conversations = []
    for seed in range(CONVERSATIONS):
        messages = agent_conversation(seed, turns=TURNS, output_chars=(300, 3_000))
        messages[1] = {**messages[1], "content": f"run {run}-{seed}\n{messages[1]['content']}"}
        conversations.append(Conversation(replay_requests(messages), clients))
    outcomes = Outcomes()
    try:
        for phase, turns in enumerate((BEFORE, DURING, AFTER)):
            if phase == 1:
                await start_fault()
            if phase == 2:
                await end_fault()
            await asyncio.gather(*(c.send(turns, phase, outcomes) for c in conversations))
    finally:
        for client in clients:
            await client.close()
    return outcomes


def reported(scenario: str, replicas: Replicas, outcomes: Outcomes) -> None:
    """One line per scenario at the end of the run: what the clients saw during the fault."""
    scenario = f"{scenario}, {replicas.label}"
    during = outcomes.statuses.get(1, [])
    counts = ", ".join(f"{s} {during.count(s)}" for s in sorted(set(during)))
    firsts = "/".join(f"{s:.2f}" for s in outcomes.firsts.get(1, []))
    report(
        "Fault scenarios (two replicas, 4 agent conversations, 16k window)",
        f"{scenario}: {len(outcomes.failures)} failed of {sum(map(len, outcomes.seconds.values()))}"
        f" requests; during the fault: {counts}; slowest {max(outcomes.seconds[1]):.2f} s,"
        f" first of each conversation {firsts} s",
    )


def over_window(fake: FakeUpstream) -> list[int]:
    return [r.prompt_tokens for r in fake.chat_requests if r.prompt_tokens > WINDOW]


async def test_redis_killed_under_load_costs_no_request(
    replicas: Replicas, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """Each replica carries the conversations it serves on in its own copy meanwhile,
    summaries included."""
    outcomes = await run_with_fault(replicas, fake, private_redis.stop, private_redis.start)
    reported("Redis killed", replicas, outcomes)
    assert outcomes.failures == []
    assert not fake.overflows and not over_window(fake)
    assert "compacted" in outcomes.statuses[1]


async def test_redis_paused_costs_no_request_and_its_timeout_once(
    replicas: Replicas, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    async def pause() -> None:
        private_redis.pause()

    async def resume() -> None:
        private_redis.resume()

    outcomes = await run_with_fault(replicas, fake, pause, resume)
    reported("Redis paused (SIGSTOP)", replicas, outcomes)
    assert outcomes.failures == []
    assert not fake.overflows
    # A hung Redis costs its store timeout (2 s) to the requests in flight when it hung, then
    # the circuit answers at once: most requests of the phase never wait on it.
    slow = [s for s in outcomes.seconds[1] if s > 1.5]
    assert len(slow) <= 2 * CONVERSATIONS, slow


async def test_redis_restarted_empty_costs_no_request_and_no_synchronous_rebuild(
    replicas: Replicas, fake: FakeUpstream, private_redis: RedisServer
) -> None:
    """Redis comes back without its data: every conversation arrives far over its window with
    no state. It goes at once with model-free relief, its checkpoint prepared behind it,
    where it took rounds of summaries (14 to 28 s) before."""

    async def flush() -> None:
        client = aioredis.Redis.from_url(private_redis.url)
        try:
            await client.flushall()
        finally:
            await client.aclose()

    async def nothing() -> None:
        return None

    outcomes = await run_with_fault(replicas, fake, flush, nothing)
    reported("Redis back empty", replicas, outcomes)
    assert outcomes.failures == []
    assert not fake.overflows
    first_after_wipe = outcomes.firsts[1]
    assert len(first_after_wipe) == CONVERSATIONS and max(first_after_wipe) < 2.0, first_after_wipe


async def test_summaries_failing_for_a_while_cost_no_request(
    replicas: Replicas, fake: FakeUpstream
) -> None:
    async def fail() -> None:
        fake.summary_failures = 1_000_000

    async def heal() -> None:
        fake.summary_failures = 0

    # The breaker's longest wait, a second here (60 by default): the phase after the fault
    # outlasts it several times, so the summarizer is probed again and found healed.
    outcomes = await run_with_fault(replicas, fake, fail, heal, summary_breaker_cooldown_seconds=1)
    reported("summary calls 500", replicas, outcomes)
    assert outcomes.failures == []
    assert not fake.overflows and not over_window(fake)
    assert "compacted" in outcomes.statuses[2]  # checkpoints again once summaries work
