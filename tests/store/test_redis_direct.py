"""The request path's commands sent straight on pooled connections
(``store/redis_direct.py``): they stay within the pool's bound, leave part of it to every other
command, survive a server that closed them, and read every reply of several sent at once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from compaction_proxy.store import StoreUnavailable
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.store.redis_direct import DirectCommands
from tests.helpers import framed_in_c
from tests.redis_server import RedisServer

POOL = 4


@pytest.fixture
async def store(private_redis: RedisServer) -> AsyncIterator[RedisStore]:
    store = RedisStore(private_redis.url, pool_size=POOL)
    yield store
    await store.close()


@pytest.fixture
async def admin(private_redis: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(private_redis.url)
    yield client
    await client.aclose()


async def named(store: RedisStore, conversation: str) -> str:
    return (await store.load(conversation)).attributes.session


async def test_connections_the_server_closed_are_reconnected_within_the_command(
    store: RedisStore, admin: aioredis.Redis
) -> None:
    names = [f"c{n}" for n in range(POOL)]
    for name in names:
        await store.append(name, [], attributes=ConversationAttributes(session=name))
    await asyncio.gather(*(named(store, name) for name in names))  # connections kept
    killed = await admin.client_kill_filter(_type="normal", skipme=True)
    assert killed >= 2
    assert await asyncio.gather(*(named(store, name) for name in names)) == names
    await store.append("c0", [], attributes=ConversationAttributes(session="again"))
    assert await named(store, "c0") == "again"


async def test_the_request_path_keeps_at_most_half_the_pool_between_commands(
    store: RedisStore,
) -> None:
    for name in ("a", "b", "c", "d"):
        await store.append(name, [], attributes=ConversationAttributes(session=name))
    # As many loads at once as the pool holds: each borrows a connection of its own.
    assert await asyncio.gather(*(named(store, n) for n in "abcd")) == list("abcd")
    # Half were given back: two other commands at once still find connections.
    await asyncio.gather(store.ping(), store.ping())


async def test_no_more_connections_than_the_pool_holds_whatever_the_mix(
    store: RedisStore, admin: aioredis.Redis
) -> None:
    await store.append("a", [], attributes=ConversationAttributes(session="a"))
    loads = [store.load("a") for _ in range(3 * POOL)]
    pings = [store.ping() for _ in range(POOL)]
    outcomes = await asyncio.gather(*loads, *pings, return_exceptions=True)
    refused = [outcome for outcome in outcomes if isinstance(outcome, BaseException)]
    assert refused and all(isinstance(outcome, StoreUnavailable) for outcome in refused)
    assert len(await admin.client_list(_type="normal")) <= POOL + 1  # the admin's own
    assert await named(store, "a") == "a"  # and nothing was left half-read


async def test_an_error_reply_among_several_leaves_the_connection_read_and_kept(
    private_redis: RedisServer,
) -> None:
    client = aioredis.Redis.from_url(private_redis.url, max_connections=2, decode_responses=True)
    direct = DirectCommands(client.connection_pool)  # keeps one connection: the same each time
    try:
        await direct.run("SET", "text", "1")
        before = await direct.run("CLIENT", "ID")
        with pytest.raises(ResponseError, match="WRONGTYPE"):
            await direct.run_all(("LPUSH", "text", "x"), ("GET", "text"), ("INCR", "n"))
        assert await direct.run("GET", "n") == "1"  # the commands after the refusal ran
        assert await direct.run("GET", "absent") is None  # no reply was left unread
        assert await direct.run("CLIENT", "ID") == before  # nor the connection dropped
    finally:
        await direct.close()
        await client.aclose()


async def test_a_clusters_nodes_frame_the_append_in_one_call(
    redis_cluster_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Cluster too the append's command (one argument a value: dozens a request) is
    framed by hiredis in one call, not argument by argument in Python."""
    framed = framed_in_c(monkeypatch)
    store = RedisStore(redis_cluster_url, ttl_seconds=3600)
    try:
        await store.append("framed-in-c", [], [{"type": "request"}], ConversationAttributes())
    finally:
        await store.close()
    assert "EVALSHA" in framed
