"""A Redis written by an earlier version of the proxy is read, and served from, by this one.

``data/redis_written_by_0.1.json`` holds every key a proxy of version 0.1 (the ``proxy``
package, before the layered ``compaction_proxy`` one) wrote for two conversations on a private
Redis (one compacted under pressure and answered again, one without a session id), with what
that version read back from them. The keys are restored into a Redis of the test's own as they
were written, streams with their ids.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from compaction_proxy.conversation.replacements import record_to_dict
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.conftest import ProxyFactory
from tests.redis_server import RedisServer

pytest.importorskip("openai")

import openai

RECORDED = orjson.loads((Path(__file__).parent / "data" / "redis_written_by_0.1.json").read_bytes())
COMPACTED = "sa3d84c8ede84a8b079d547e041f357af"  # its session id: recorded-1


async def restore(url: str, keys: dict[str, Any]) -> None:
    client = aioredis.Redis.from_url(url)
    try:
        for name, stored in keys.items():
            kind, value = stored["type"], stored["value"]
            if kind == "string":
                await client.set(name, value)
            elif kind == "hash":
                await client.hset(name, mapping=value)
            elif kind == "list":
                await client.rpush(name, *value)
            elif kind == "set":
                await client.sadd(name, *value)
            elif kind == "zset":
                await client.zadd(name, {member: score for member, score in value})
            elif kind == "stream":
                for entry_id, fields in value:
                    await client.xadd(name, fields, id=entry_id)
            else:
                raise AssertionError(f"no restore for a {kind}")
    finally:
        await client.aclose()


@pytest.fixture
async def old_redis(private_redis: RedisServer) -> str:
    await restore(private_redis.url, RECORDED["keys"])
    return private_redis.url


@pytest.mark.parametrize("conversation", sorted(RECORDED["expected"]))
async def test_state_and_log_written_by_0_1_read_back_as_that_version_read_them(
    old_redis: str, conversation: str
) -> None:
    expected = RECORDED["expected"][conversation]
    store = RedisStore(old_redis, ttl_seconds=3600)
    try:
        state = await store.load(conversation)
        page = await store.read_log(conversation, limit=10_000)
    finally:
        await store.close()
    assert [record_to_dict(r) for r in state.records] == expected["records"]
    assert state.generation == expected["generation"]
    assert (state.anchor.__dict__ if state.anchor else None) == expected["anchor"]
    assert list(state.logged_tip or []) == (expected["logged_tip"] or [])
    assert state.attributes.to_stored() == expected["attributes"]
    assert [[event_id, event] for event_id, event in page.events] == expected["log"]


async def test_a_conversation_compacted_by_0_1_goes_on_from_its_checkpoint(
    old_redis: str, make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    """Its next request carries the old checkpoint: no new summary, no new generation."""
    route = {"model": "small-*", "base_url": upstream_url, "context_window": 16_000}
    route["policy"] = {"precompact_ratio": 0}
    proxy = await make_proxy(store_url=old_redis, routes=[route])
    history = [
        system(),
        user("FACT-5: ticket abc123. Make the importer idempotent."),
        *agent_turns(30, output="importer log line " * 150),
        user("Where are we?"),
        {"role": "assistant", "content": "Done."},
        user("next?"),
        {"role": "assistant", "content": "Done."},
        user("and then?"),
    ]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-a", max_retries=0) as client:
        raw = await client.chat.completions.with_raw_response.create(
            model="small-model",
            messages=history,  # type: ignore[arg-type]
            extra_headers={"X-Session-Id": "recorded-1"},
        )
    assert raw.headers["x-compaction-conversation"] == COMPACTED
    assert raw.headers["x-compaction-generation"] == "1"
    assert not fake.summary_requests
    (sent,) = fake.chat_requests
    assert sent.body is not None
    forwarded = sent.body["messages"]
    assert len(forwarded) < len(history)
    assert "<compacted-summary>" in forwarded[1]["content"]
    assert forwarded[-1] == history[-1]
