"""The Redis log packed into segments, on a real Redis: read back whole and in order under the
ids it was logged with, packed without reading back where one process logged it, packed once
however replicas race, held to its bounds exactly, and readable where earlier versions wrote."""

from __future__ import annotations

import asyncio
import random
import string
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from compaction_proxy.conversation.log_events import MessageEvent
from compaction_proxy.store import redis_log
from compaction_proxy.store.log_segments import PACK_AT_BYTES, READ_PACK_AT_BYTES
from compaction_proxy.store.packed_events import packed
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.store.redis_keys import (
    conversation_keys,
    seen_key_prefix,
    segment_key_prefix,
)
from tests.helpers import counter, framed_in_c
from tests.redis_server import RedisServer, shared_redis_url

PACKS = "compaction_proxy_log_packs_total"
UNREADABLE = "compaction_proxy_unreadable_state_fields_total"


def tool_output(position: int, size: int = 3_000) -> str:
    """Text like a tool's output: lines of a file, some repeated from earlier outputs."""
    rng = random.Random(position // 3)  # neighbours share their source
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(80)]
    lines = [" ".join(rng.choices(words, k=8)) for _ in range(size // 50)]
    return f"<returncode>0</returncode>\n<output>\n{position}\n" + "\n".join(lines)


def turn(start: int, count: int = 3, size: int = 3_000) -> list[MessageEvent]:
    return [
        MessageEvent(
            i, f"hash-{i:08d}", {"type": "message", "position": i, "content": tool_output(i, size)}
        )
        for i in range(start, start + count)
    ]


@pytest.fixture
async def client() -> AsyncIterator[aioredis.Redis]:
    connection = aioredis.Redis.from_url(shared_redis_url())
    yield connection
    await connection.aclose()


async def whole_log(store: RedisStore, conversation: str) -> list[tuple[str, Any]]:
    return (await store.read_log(conversation, limit=100_000)).events


async def paged_log(store: RedisStore, conversation: str, size: int) -> list[tuple[str, Any]]:
    events: list[tuple[str, Any]] = []
    cursor = None
    while True:
        page = await store.read_log(conversation, after=cursor, limit=size)
        events += page.events
        if page.next_cursor is None:
            return events
        cursor = page.next_cursor


async def held_bytes(client: aioredis.Redis, conversation: str) -> tuple[int, int, int]:
    """What the log holds: its stream's stored values, its frames, and the segments' count."""
    keys = conversation_keys(conversation)
    stream = await client.xrange(keys["log"])
    in_stream = sum(len(value) for _, fields in stream for value in fields.values())
    lines = await client.lrange(keys["segments"], 0, -1)
    prefix = segment_key_prefix(conversation)
    frames = [await client.get(prefix + line.decode().rsplit(" ", 1)[1]) for line in lines]
    return in_stream, sum(len(frame or b"") for frame in frames), len(frames)


async def assert_packed(
    store: RedisStore, client: aioredis.Redis, conversation: str, positions: range
) -> list[tuple[str, Any]]:
    """The log holds the messages at ``positions``, each once and in order, some packed."""
    logged = await whole_log(store, conversation)
    assert [event["position"] for _, event in logged] == list(positions)
    _, _, segments = await held_bytes(client, conversation)
    assert segments >= 1
    return logged


async def test_a_packed_log_reads_back_in_order_under_the_ids_it_was_logged_with(
    conversation: str, client: aioredis.Redis
) -> None:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    read_back = counter(PACKS, source="read_back", outcome="landed")
    try:
        written: list[Any] = []
        for n in range(60):
            messages = turn(n * 3)
            await store.append(conversation, messages)
            written += [m.event for m in messages]
            request = {"type": "request", "turn": n}
            await store.record_request(conversation, [request])
            written.append(request)
            if n % 10 == 9:  # compaction's own events are packed with the rest
                start, end = {"type": "compaction/start", "n": n}, {"type": "compaction/end"}
                await store.begin_compaction(conversation, "owner", 30, start)
                await store.commit_compaction(conversation, "owner", [{"type": "mask", "n": n}], [])
                await store.end_compaction(conversation, "owner", end)
                written += [start, {"type": "mask", "n": n}, end]
        await store.log_packs_settled()
        logged = await whole_log(store, conversation)
        assert [event for _, event in logged] == written
        assert await paged_log(store, conversation, 7) == logged
        in_stream, in_frames, segments = await held_bytes(client, conversation)
        assert segments >= 1 and in_stream < READ_PACK_AT_BYTES
        assert in_frames < sum(len(str(event)) for event in written) / 4
        # one process logged every event: none was read back to be packed
        assert counter(PACKS, source="read_back", outcome="landed") == read_back
        assert 3_500_000 < (await store.ttl_of(conversation))["segments"] <= 3_600_000
        lines = await client.lrange(conversation_keys(conversation)["segments"], 0, -1)
        token = lines[-1].decode().rsplit(" ", 1)[1]
        # a segment's key outlives its log's by a quarter (lua/log.lua renews it)
        assert 4_400_000 < await client.pttl(segment_key_prefix(conversation) + token) <= 4_500_000
    finally:
        await store.close()


async def test_log_bytes_count_exactly_what_the_log_holds(
    conversation: str, client: aioredis.Redis
) -> None:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600, max_log_bytes=60_000)
    try:
        for n in range(80):
            await store.append(conversation, turn(n * 3))
            await store.log_packs_settled()
            in_stream, in_frames, _ = await held_bytes(client, conversation)
            state = await client.hgetall(conversation_keys(conversation)["state"])
            assert int(state[b"log_bytes"]) == in_stream + in_frames <= 60_000
            assert int(state[b"tail_bytes"]) == in_stream
        logged = await whole_log(store, conversation)
        assert logged[-1][1] == turn(239, 1)[0].event  # the newest stays
        positions = [event["position"] for _, event in logged]
        assert positions == list(range(positions[0], 240))  # the oldest went first, in order
    finally:
        await store.close()


async def test_the_event_bound_counts_packed_events(conversation: str) -> None:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600, max_log_events=200)
    try:
        for n in range(40):
            await store.append(conversation, turn(n * 10, 10, 400))
            await store.log_packs_settled()
        logged = await whole_log(store, conversation)
        # whole segments go (each at most an eighth of the bound) while as many events remain
        assert 200 <= len(logged) <= 200 + 25
        assert logged[-1][1]["position"] == 399
    finally:
        await store.close()


async def test_replicas_logging_one_conversation_pack_each_event_once(
    conversation: str, client: aioredis.Redis
) -> None:
    """Two replicas log one conversation turn by turn, and race: what they log is packed,
    some of it read back, and the log reads back every event once, in order."""
    replicas = [RedisStore(shared_redis_url(), ttl_seconds=3600) for _ in range(2)]
    try:
        for n in range(0, 90, 2):
            await asyncio.gather(
                replicas[0].append(conversation, turn(n * 3)),
                replicas[1].append(conversation, turn((n + 1) * 3)),
            )
            await asyncio.gather(*(replica.log_packs_settled() for replica in replicas))
        logged = await whole_log(replicas[0], conversation)
        positions = sorted(event["position"] for _, event in logged)
        assert positions == list(range(270))
        assert [entry_id for entry_id, _ in logged] == sorted(
            (entry_id for entry_id, _ in logged), key=lambda i: tuple(map(int, i.split("-")))
        )
        assert await whole_log(replicas[1], conversation) == logged
        in_stream, _, segments = await held_bytes(client, conversation)
        assert segments >= 2 and in_stream < READ_PACK_AT_BYTES + 10_000
    finally:
        for replica in replicas:
            await replica.close()


async def test_a_log_whose_state_was_lost_is_packed_from_its_new_events_alone(
    conversation: str, client: aioredis.Redis
) -> None:
    """A Redis that lost its data (here: the conversation's keys) restarts the log's
    ordinals; what a replica remembers from before is never packed as the new entries."""
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        for n in range(5):  # held, not yet due
            await store.append(conversation, turn(n * 3))
        lost = [key async for key in client.scan_iter(match=f"cp:{{{conversation}}}:*")]
        await client.delete(*lost)
        for n in range(5, 40):
            await store.append(conversation, turn(n * 3))
            await store.log_packs_settled()
        await assert_packed(store, client, conversation, range(15, 120))
    finally:
        await store.close()


async def test_what_a_process_holds_to_pack_stays_counted_while_packs_outlive_its_memory(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The bytes a process holds to pack are bounded; a pack under way for a conversation it
    has forgotten meanwhile changes nothing in the count."""
    monkeypatch.setattr(redis_log, "HELD_BYTES", 40_000)
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    first, second = (f"test-{uuid.uuid4().hex}" for _ in range(2))
    try:
        for n in range(3):  # the third append makes a pack due: it runs in the background
            await store.append(first, turn(n * 3))
        # answered before that pack lands, and forgetting the first conversation
        await store.append(second, turn(0, 15))
        await store.log_packs_settled()
        packer = store._packer
        assert first not in packer._held
        held = packer._held.values()
        assert packer._held_bytes == sum(h.size + h.frame_bytes for h in held)
    finally:
        await store.close()


async def test_the_frames_held_to_merge_into_count_in_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every conversation that packed once keeps its newest segment's frames to merge the next
    run into: conversations that packed and went quiet are forgotten by the same bound."""
    monkeypatch.setattr(redis_log, "HELD_BYTES", 40_000)
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        for _ in range(12):
            conversation = f"test-{uuid.uuid4().hex}"
            for n in range(PACK_AT_BYTES // 9_000 + 1):  # about 9 KB each: the last one
                await store.append(conversation, turn(n * 3))  # makes a pack due
            await store.log_packs_settled()
        packer = store._packer
        held = packer._held.values()
        assert packer._held_bytes == sum(h.size + h.frame_bytes for h in held)
        assert sum(h.frame_bytes for h in held) <= 40_000 < 12 * max(h.frame_bytes for h in held)
    finally:
        await store.close()


async def test_a_claim_answered_before_this_process_packed_is_given_back_unread(
    conversation: str, client: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An append claims the stream's pack (its unpacked bytes past the read-back bound) while
    a pack of this process's is landing, and its reply is read once that pack has landed: the
    stream's unpacked entries are all held here, so nothing is read back, and the claim is
    not left standing for another caller to wait out."""
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    packer = store._packer
    landing, send, logged = asyncio.Event(), packer._send, packer.logged
    claims: list[tuple[Any, ...]] = []
    read_back = packer._read_back_and_pack
    reads: list[str] = []

    async def reading_back(conversation: str, held: Any) -> None:
        reads.append(conversation)
        await read_back(conversation, held)

    async def held_back(*args: Any) -> int:
        await landing.wait()
        return await send(*args)

    def claim_read_later(*args: Any) -> None:
        if args[4]:  # the reply that claims the pack: read after the pack under way lands
            claims.append(args)
        else:
            logged(*args)

    monkeypatch.setattr(packer, "_send", held_back)
    monkeypatch.setattr(packer, "logged", claim_read_later)
    monkeypatch.setattr(packer, "_read_back_and_pack", reading_back)
    try:
        appended = 0
        while not claims and appended < 60:
            await store.append(conversation, turn(appended * 3))
            appended += 1
        assert claims, "no append claimed the stream's pack"
        landing.set()
        await store.log_packs_settled()
        logged(*claims[0])
        await store.log_packs_settled()
        assert reads == []
        assert not await client.exists(conversation_keys(conversation)["packing"])
        await assert_packed(store, client, conversation, range(appended * 3))
    finally:
        await store.close()


async def test_a_process_that_holds_none_of_the_log_reads_it_back_to_pack_it(
    conversation: str, client: aioredis.Redis
) -> None:
    before = RedisStore(shared_redis_url(), ttl_seconds=3600, compress_log=False)
    read_back = counter(PACKS, source="read_back", outcome="landed")
    try:
        for n in range(30):  # logged by a process that never packs (or has since stopped)
            await before.append(conversation, turn(n * 3))
    finally:
        await before.close()
    after = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        await after.append(conversation, turn(90))
        await after.log_packs_settled()
        assert counter(PACKS, source="read_back", outcome="landed") > read_back
        in_stream, _, segments = await held_bytes(client, conversation)
        assert segments >= 1 and in_stream < READ_PACK_AT_BYTES
        logged = await whole_log(after, conversation)
        assert [event["position"] for _, event in logged] == list(range(93))
    finally:
        await after.close()


async def test_entries_and_seen_keys_of_earlier_versions_are_read_and_packed(
    conversation: str, client: aioredis.Redis
) -> None:
    """Earlier versions logged events as JSON (`e`) or compressed one by one (`z`), and
    kept a Set of the hashes logged: read, packed, and not logged again."""
    keys = conversation_keys(conversation)
    earlier = turn(0, 40)
    for message in earlier:
        event = orjson.dumps(message.event)
        squeezed = packed(event)
        fields = {"e": event} if squeezed is None or message.position % 2 else {"z": squeezed}
        await client.xadd(keys["log"], fields)  # type: ignore[arg-type]
        await client.sadd(keys["seen"], message.hash)
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        assert await store.append(conversation, turn(38, 5)) == 3
        for n in range(15):
            await store.append(conversation, turn(43 + n * 3))
            await store.log_packs_settled()
        logged = await assert_packed(store, client, conversation, range(88))
        assert [event for _, event in logged[:40]] == [m.event for m in earlier]
    finally:
        await store.close()


async def test_a_segment_that_does_not_read_is_left_out_counted_and_the_rest_reads(
    conversation: str, client: aioredis.Redis
) -> None:
    """A damaged segment, or one a later version encoded (read after a rollback), reads as
    absent like an unreadable record: the rest of the log still reads, in order."""
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        for n in range(20):
            await store.append(conversation, turn(n * 3))
            await store.log_packs_settled()
        whole = await whole_log(store, conversation)
        prefix = segment_key_prefix(conversation)
        segments = [key async for key in client.scan_iter(match=f"{prefix}*")]
        assert len(segments) >= 2
        before = counter(UNREADABLE, field="log_segment")
        await client.set(segments[0], b"damaged", keepttl=True)
        left = await whole_log(store, conversation)
        assert 0 < len(left) < len(whole)
        assert [entry for entry in whole if entry in left] == left
        assert counter(UNREADABLE, field="log_segment") == before + 1
    finally:
        await store.close()


async def test_seen_keys_take_under_30_bytes_each(
    conversation: str, client: aioredis.Redis
) -> None:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600, compress_log=False)
    try:
        for n in range(40):
            batch = [
                MessageEvent(i, f"{i:032x}", {"type": "message"}, f"d:{i + 7:032x}", True)
                for i in range(n * 25, n * 25 + 25)
            ]
            assert await store.append(conversation, batch) == 25
        assert await store.append(conversation, batch) == 0  # logged once
        sets = [key async for key in client.scan_iter(match=seen_key_prefix(conversation) + "*")]
        assert len(sets) == 16  # 8 for chain hashes, 8 for contents
        size = sum([await client.memory_usage(key, samples=0) or 0 for key in sets])
        assert size / 2_000 < 30
    finally:
        await store.close()


async def test_packs_land_after_the_server_lost_its_scripts(
    conversation: str, private_redis: RedisServer
) -> None:
    store = RedisStore(private_redis.url, ttl_seconds=3600)
    client = aioredis.Redis.from_url(private_redis.url)
    try:
        landed = counter(PACKS, source="held", outcome="landed")
        for n in range(10):
            await store.append(conversation, turn(n * 3))
        await store.log_packs_settled()
        assert counter(PACKS, source="held", outcome="landed") > landed
        await client.script_flush()  # as a restart or a failover would leave it
        landed = counter(PACKS, source="held", outcome="landed")
        for n in range(10, 20):
            await store.append(conversation, turn(n * 3))
        await store.log_packs_settled()
        assert counter(PACKS, source="held", outcome="landed") > landed
        await assert_packed(store, client, conversation, range(60))
    finally:
        await store.close()
        await client.aclose()


async def test_the_logs_counts_are_stored_as_whole_numbers(
    conversation: str, client: aioredis.Redis
) -> None:
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    try:
        for n in range(10):
            await store.append(conversation, turn(n * 3))
        await store.log_packs_settled()
        state = await client.hgetall(conversation_keys(conversation)["state"])
        counts = ("log_bytes", "tail_bytes", "packed_events", "logged", "oldest", "renewed")
        assert all(state[name.encode()].isdigit() for name in counts), state
        assert int(state[b"renewed"]) > 10**12  # milliseconds, written whole
        assert 3_500_000 < (await store.ttl_of(conversation))["state"] <= 3_600_000
    finally:
        await store.close()


async def test_a_packs_commands_are_framed_in_one_call_each(
    conversation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The frame's SET and the pack's script go as bytes, framed by hiredis whole, not
    argument by argument in Python (a pack's dozen arguments, one pack in a few requests)."""
    framed = framed_in_c(monkeypatch)
    store = RedisStore(shared_redis_url(), ttl_seconds=3600)
    landed = counter(PACKS, source="held", outcome="landed")
    try:
        for n in range(12):
            await store.append(conversation, turn(n * 3))
        await store.log_packs_settled()
    finally:
        await store.close()
    assert counter(PACKS, source="held", outcome="landed") > landed
    assert "SET" in framed and framed.count("EVALSHA") > 12  # the appends' and the packs'
