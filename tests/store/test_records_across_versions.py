"""Records written by another version of the proxy never take a conversation down.

In a rolling upgrade a newer replica writes records with fields this one does not know, and an
older one may have written fewer; a record may also be garbage. A record this version can read
is applied (unknown fields ignored); one it cannot is skipped, counted and logged once; the
conversation is served either way, and its admin view answers.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
import pytest
import redis.asyncio as aioredis

from compaction_proxy.conversation.replacements import Checkpoint, record_to_dict
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.store.redis_keys import conversation_keys
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory
from tests.helpers import counter, route
from tests.redis_server import shared_redis_url

pytest.importorskip("openai")

import openai

UNREADABLE = "compaction_proxy_unreadable_records_total"
UNREADABLE_STATE = "compaction_proxy_unreadable_state_fields_total"


def checkpoint(end: int = 3) -> Checkpoint:
    summary = {"role": "user", "content": "<compacted-summary>s</compacted-summary>"}
    return Checkpoint(0, end, "root", f"hash-{end}", summary, tokens=3)


async def push_raw(conversation: str, *raw: str) -> None:
    client = aioredis.Redis.from_url(shared_redis_url())
    try:
        await client.rpush(conversation_keys(conversation)["records"], *raw)
    finally:
        await client.aclose()


def stored(record: dict[str, Any]) -> str:
    return orjson.dumps(record).decode()


@pytest.fixture
async def redis_store() -> Any:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    yield store
    await store.close()


async def test_a_record_with_fields_of_a_newer_version_is_read_and_applies(
    redis_store: RedisStore, conversation: str
) -> None:
    newer = {**record_to_dict(checkpoint()), "origin": "replica-b", "quality": 0.9}
    await push_raw(conversation, stored(newer))
    (record,) = (await redis_store.load(conversation)).records
    assert record == checkpoint()


async def test_a_superseded_record_of_a_newer_version_is_dropped_by_a_commit(
    redis_store: RedisStore, conversation: str
) -> None:
    """Its stored form, unknown fields and all, is what the commit removes."""
    newer = {**record_to_dict(checkpoint(3)), "origin": "replica-b"}
    await push_raw(conversation, stored(newer))
    (old,) = (await redis_store.load(conversation)).records
    start = {"type": "compaction/start"}
    assert (await redis_store.begin_compaction(conversation, "me", 30, start)).value == "begun"
    deeper = checkpoint(7)
    assert await redis_store.commit_compaction(conversation, "me", [], [deeper], [old])
    assert (await redis_store.load(conversation)).records == (deeper,)


@pytest.mark.parametrize(
    "raw",
    [
        stored({k: v for k, v in record_to_dict(checkpoint()).items() if k != "end_hash"}),
        stored({"kind": "summary-v9", "start": 0}),
        stored({**record_to_dict(checkpoint()), "start": "zero"}),
        stored({**record_to_dict(checkpoint()), "start": 5, "end": 2}),
        stored([1, 2, 3]),
        "{not json",
    ],
    ids=["missing-field", "unknown-kind", "wrong-type", "invalid-span", "not-an-object", "garbage"],
)
async def test_an_unreadable_record_is_skipped_and_counted_once(
    redis_store: RedisStore, conversation: str, raw: str
) -> None:
    await push_raw(conversation, raw, stored(record_to_dict(checkpoint())))
    before = counter(UNREADABLE)
    for _ in range(3):
        assert (await redis_store.load(conversation)).records == (checkpoint(),)
    assert counter(UNREADABLE) == before + 1


@pytest.mark.parametrize(
    ("field", "value"),
    [("generation", "seven"), ("generation", "1e3"), ("tip", "x:y"), ("anchor", "{bad")],
)
async def test_an_unreadable_state_field_is_ignored_and_counted_and_commits_go_on(
    redis_store: RedisStore, conversation: str, field: str, value: str
) -> None:
    """A damaged state field never puts its conversation in bypass: it reads as absent, and
    a commit after it lands with a generation past every one on record."""
    start = {"type": "compaction/start"}
    assert (await redis_store.begin_compaction(conversation, "me", 30, start)).value == "begun"
    first = await redis_store.commit_compaction(conversation, "me", [], [checkpoint(3)], [])
    assert first is not None
    client = aioredis.Redis.from_url(shared_redis_url())
    try:
        await client.hset(conversation_keys(conversation)["state"], field, value)
    finally:
        await client.aclose()
    before = counter(UNREADABLE_STATE, field=field)
    for _ in range(2):
        state = await redis_store.load(conversation)
        assert state.records == (checkpoint(3),)
    assert counter(UNREADABLE_STATE, field=field) == before + 1
    assert (await redis_store.begin_compaction(conversation, "me", 30, start)).value == "begun"
    generation = await redis_store.commit_compaction(
        conversation, "me", [], [checkpoint(7)], [checkpoint(3)]
    )
    assert generation is not None and generation > first
    assert (await redis_store.load(conversation)).records == (checkpoint(7),)


async def test_a_conversation_with_an_unreadable_record_is_still_served_and_shown(
    make_proxy: ProxyFactory, upstream_url: str, fake: FakeUpstream
) -> None:
    proxy = await make_proxy(
        store_url=shared_redis_url(),
        routes=[route(upstream_url, "m-*", 64_000)],
        admin_token="admin-token-0123456789",
    )
    messages = [{"role": "user", "content": "hello"}]
    async with openai.AsyncOpenAI(base_url=proxy.url, api_key="sk-x", max_retries=0) as client:
        first = await client.chat.completions.with_raw_response.create(
            model="m-1",
            messages=messages,  # type: ignore[arg-type]
        )
        conversation = first.headers["x-compaction-conversation"]
        await push_raw(conversation, "{not json", stored({"kind": "future", "x": 1}))
        again = await client.chat.completions.with_raw_response.create(
            model="m-1",
            messages=messages,  # type: ignore[arg-type]
        )
    assert again.headers["x-compaction-status"] == "none"
    async with aiohttp.ClientSession() as http:
        async with http.get(
            f"{proxy.root}/admin/conversations/{conversation}",
            headers={"Authorization": "Bearer admin-token-0123456789"},
        ) as shown:
            assert shown.status == 200
            assert (await shown.json())["records"] == []
