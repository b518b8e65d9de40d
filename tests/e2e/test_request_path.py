"""The request path's store traffic: one Redis round trip before forwarding, one after the
answer, and the one after the answer never delays it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import redis.asyncio as aioredis

from compaction_proxy.http.app_keys import SERVICES
from tests.builders import system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import route
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

MODEL = "path-model"


def routes(upstream_url: str) -> list[dict[str, Any]]:
    return [route(upstream_url, "path-*", 64_000)]


async def ask(proxy: RunningProxy, session: str, turns: int) -> None:
    messages: list[Any] = [system()]
    for turn in range(turns):
        messages.append(user(f"question {turn}"))
        messages.append({"role": "assistant", "content": f"answer {turn}"})
    messages.append(user("and now?"))
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-path", max_retries=0) as client:
        await client.chat.completions.create(
            model=MODEL, messages=messages, extra_headers={"X-Session-Id": session}
        )
    await proxy.app[SERVICES].pending_log_writes.settled_all()


class Commands:
    """The commands clients send to a Redis server (MONITOR), not those its scripts run."""

    def __init__(self, url: str) -> None:
        self.client = aioredis.Redis.from_url(url)
        self.sent: list[str] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Commands:
        started = asyncio.Event()

        async def watch() -> None:
            async with self.client.monitor() as monitor:
                started.set()
                while True:
                    command = await monitor.next_command()
                    if command["client_type"] != "lua":
                        self.sent.append(command["command"].split(" ", 1)[0].upper())

        self._task = asyncio.create_task(watch())
        await asyncio.wait_for(started.wait(), 10)
        await asyncio.sleep(0.2)  # the MONITOR command itself has been answered
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.sleep(0.2)  # the last commands reach the monitor
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.client.aclose()


async def test_a_request_costs_two_script_calls_and_no_other_command(
    make_proxy: ProxyFactory, upstream_url: str, private_redis: RedisServer
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url), store_url=private_redis.url)
    await ask(proxy, "counted", 1)  # first contact: the scripts load, the index is written
    async with Commands(private_redis.url) as commands:
        for turns in (2, 3, 4):
            await ask(proxy, "counted", turns)
    # One EVALSHA before forwarding, one after the answer; no SCRIPT EXISTS before either.
    assert commands.sent == ["EVALSHA"] * 6
    async with Commands(private_redis.url) as commands:
        await ask(proxy, "another", 1)
    # A new conversation is also indexed, in the same pipeline as its record: still one round
    # trip after the answer.
    assert commands.sent == ["EVALSHA", "EVALSHA", "ZADD", "ZREMRANGEBYSCORE"]


async def test_a_redis_that_lost_its_scripts_gets_them_again(
    make_proxy: ProxyFactory, upstream_url: str, private_redis: RedisServer
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url), store_url=private_redis.url)
    await ask(proxy, "before-flush", 1)
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        await client.script_flush()
    finally:
        await client.aclose()
    # A new conversation: its first request writes the index in the same pipeline.
    await ask(proxy, "after-flush", 1)
    await ask(proxy, "before-flush", 2)
    listed = {c.attributes.session: c for c in await proxy.store.list_conversations()}
    assert {"before-flush", "after-flush"} <= set(listed)
    # The pipelined script really ran once loaded again: the new conversation is logged.
    page = await proxy.store.read_log(listed["after-flush"].conversation, None, 100)
    kinds = [event["type"] for _, event in page.events]
    assert "message" in kinds and "request" in kinds


async def test_the_answer_does_not_wait_for_the_requests_log_write(
    make_proxy: ProxyFactory, upstream_url: str
) -> None:
    proxy = await make_proxy(routes=routes(upstream_url))
    store = proxy.store
    written = asyncio.Event()
    order: list[str] = []
    record_request, load = store.record_request, store.load

    async def slow_record(*args: Any, **kwargs: Any) -> None:
        await written.wait()
        await record_request(*args, **kwargs)
        order.append("record")

    async def traced_load(*args: Any, **kwargs: Any) -> Any:
        order.append("load")
        return await load(*args, **kwargs)

    store.record_request = slow_record  # type: ignore[method-assign]
    store.load = traced_load  # type: ignore[method-assign]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-path", max_retries=0) as client:
        # Answered while the write is held back (it would never be, were the write first).
        await asyncio.wait_for(
            client.chat.completions.create(
                model=MODEL, messages=[user("hi")], extra_headers={"X-Session-Id": "held"}
            ),
            timeout=20,
        )
        # The conversation's next request waits for the write before it reads the state.
        following = asyncio.create_task(
            client.chat.completions.create(
                model=MODEL,
                messages=[user("hi"), {"role": "assistant", "content": "hello"}, user("more")],
                extra_headers={"X-Session-Id": "held"},
            )
        )
        await asyncio.sleep(0.3)
        written.set()
        await asyncio.wait_for(following, timeout=20)
    await proxy.app[SERVICES].pending_log_writes.settled_all()
    assert order == ["load", "record", "load", "record"]
