"""The store contract, run against both backends."""

from __future__ import annotations

import asyncio
import time
import uuid

import orjson
import pytest
import redis.asyncio as aioredis

from compaction_proxy.conversation.log_events import MessageEvent
from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.store import BeginResult, MemoryStore, Store
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.branches import generation_after
from compaction_proxy.store.redis import RedisStore
from compaction_proxy.store.redis_keys import conversation_keys
from tests.helpers import counter
from tests.redis_server import shared_redis_url

START = {"type": "compaction/start"}
HOUR = 3600  # quota windows long enough that no test straddles two
BEGUN, BUSY, STALE = BeginResult.BEGUN, BeginResult.BUSY, BeginResult.STALE


def messages(count: int, start: int = 0) -> list[MessageEvent]:
    return [
        MessageEvent(i, f"hash-{i}", {"type": "message", "position": i, "hash": f"hash-{i}"})
        for i in range(start, start + count)
    ]


def checkpoint(end: int) -> Checkpoint:
    return Checkpoint(0, end, "root", f"hash-{end}", {"role": "user", "content": "s"}, tokens=3)


async def log_of(store: Store, conversation: str) -> list[dict[str, object]]:
    page = await store.read_log(conversation, limit=10_000)
    return [event for _, event in page.events]


async def test_unknown_conversation_loads_empty(store: Store, conversation: str) -> None:
    state = await store.load(conversation)
    assert (state.records, state.generation, state.anchor, state.lease_owner) == ((), 0, None, None)


async def test_racing_appends_log_each_message_once(store: Store, conversation: str) -> None:
    batch = messages(20)
    added = await asyncio.gather(*(store.append(conversation, batch) for _ in range(50)))
    assert sum(added) == 20
    logged = await log_of(store, conversation)
    assert [e["position"] for e in logged] == list(range(20))


async def test_append_logs_new_messages_then_plain_events(store: Store, conversation: str) -> None:
    await store.append(conversation, messages(3), [{"type": "request", "n": 1}])
    added = await store.append(conversation, messages(5), [{"type": "request", "n": 2}])
    assert added == 2
    logged = await log_of(store, conversation)
    assert [(e["type"], e.get("position", e.get("n"))) for e in logged] == [
        ("message", 0),
        ("message", 1),
        ("message", 2),
        ("request", 1),
        ("message", 3),
        ("message", 4),
        ("request", 2),
    ]
    state = await store.load(conversation)
    assert state.logged_tip == (4, "hash-4")


async def test_a_message_is_logged_once_by_hash_and_once_by_content_when_asked(
    store: Store, conversation: str
) -> None:
    """Logged when its chain hash is new; ``by_content``, only when its content is new too. A
    new hash is marked seen even when its content kept it out: it is a duplicate either way."""

    def message(position: int, chain_hash: str, content: str, by_content: bool) -> MessageEvent:
        event = {"type": "message", "hash": chain_hash}
        return MessageEvent(position, chain_hash, event, f"d:{content}", by_content)

    first = [message(0, "a0", "x", False), message(1, "a1", "y", False)]
    assert await store.append(conversation, first) == 2
    rewritten = [message(0, "b0", "x", True), message(1, "b1", "z", True)]
    assert await store.append(conversation, rewritten) == 1
    again = [message(0, "b0", "x", False), message(1, "b1", "z", False)]
    assert await store.append(conversation, again) == 0
    assert await store.append(conversation, [message(2, "c2", "y", False)]) == 1
    assert [e["hash"] for e in await log_of(store, conversation)] == ["a0", "a1", "b1", "c2"]


async def test_attributes_are_kept(store: Store, conversation: str) -> None:
    await store.append(
        conversation, [], attributes=ConversationAttributes(tenant="t1", last_seen=12.5)
    )
    await store.append(conversation, [], attributes=ConversationAttributes(last_seen=13.0))
    assert (await store.load(conversation)).attributes == ConversationAttributes(
        tenant="t1", last_seen=13.0
    )


ANY_TEXT = ["", "12:ab", "3:", "0:", ":", "\x00\x00\x00\x05", "a\nb\tc\x00d", "é ✓ 文"]
ANY_TEXT += ["bad byte \udcff", "x" * 5000]


async def test_attributes_and_events_hold_any_text_as_given(
    store: Store, conversation: str
) -> None:
    """Values travel to the Redis script as arguments of their own: a value that is empty,
    looks like a length or a count, holds separators, NUL, non-ASCII or a byte that is not
    UTF-8 (a header's, kept as a surrogate escape) comes back as it went."""
    for text in ANY_TEXT:
        attributes = ConversationAttributes(tenant=text, session=text[::-1], model=text + "m")
        await store.append(conversation, [], [{"type": "request", "text": text}], attributes)
        loaded = (await store.load(conversation)).attributes
        assert (loaded.tenant, loaded.session, loaded.model) == (text, text[::-1], text + "m")
    logged = await log_of(store, conversation)
    assert [event["text"] for event in logged] == ANY_TEXT


async def test_only_one_of_ten_racers_takes_the_lease(store: Store, conversation: str) -> None:
    owners = [f"owner-{i}" for i in range(10)]
    taken = await asyncio.gather(
        *(
            store.begin_compaction(conversation, o, 30, {"type": "compaction/start", "owner": o})
            for o in owners
        )
    )
    assert taken.count(BEGUN) == 1
    assert taken.count(BUSY) == 9
    winner = owners[taken.index(BEGUN)]
    assert (await store.load(conversation)).lease_owner == winner
    starts = [e for e in await log_of(store, conversation) if e["type"] == "compaction/start"]
    assert starts == [{"type": "compaction/start", "owner": winner}]


async def test_commit_lands_whole_and_bumps_the_generation(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "me", 30, START) is BEGUN
    prune = Prune(3, "hash-3", "short")
    generation = await store.commit_compaction(
        conversation,
        "me",
        [{"type": "compaction/summary"}, {"type": "compaction/end"}],
        [checkpoint(2), prune],
    )
    assert generation is not None and generation > 0
    state = await store.load(conversation)
    assert state.records == (checkpoint(2), prune)
    assert state.generation == generation
    assert state.lease_owner is None
    types = [e["type"] for e in await log_of(store, conversation)]
    assert types == ["compaction/start", "compaction/summary", "compaction/end"]


async def commit_one(store: Store, conversation: str, end: int) -> int:
    assert await store.begin_compaction(conversation, f"o{end}", 30, START) is BEGUN
    generation = await store.commit_compaction(conversation, f"o{end}", [], [checkpoint(end)])
    assert generation is not None
    return generation


async def test_generation_is_monotonic_and_never_below_the_clock(
    store: Store, conversation: str
) -> None:
    floor = generation_after(0, time.time())
    generations = [await commit_one(store, conversation, i) for i in range(5)]
    assert generations == sorted(set(generations)) and generations[0] >= floor
    assert [r.end for r in (await store.load(conversation)).records] == [0, 1, 2, 3, 4]


async def test_commit_refused_after_the_lease_expired(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "slow", 0.1, START) is BEGUN
    await asyncio.sleep(0.25)
    assert (
        await store.commit_compaction(conversation, "slow", [{"type": "x"}], [checkpoint(1)])
        is None
    )
    state = await store.load(conversation)
    assert (state.records, state.generation) == ((), 0)


async def test_commit_refused_after_the_lease_was_taken_over(
    store: Store, conversation: str
) -> None:
    assert await store.begin_compaction(conversation, "slow", 0.1, START) is BEGUN
    await asyncio.sleep(0.25)
    assert await store.begin_compaction(conversation, "fast", 30, START) is BEGUN
    assert await store.commit_compaction(conversation, "slow", [], [checkpoint(1)]) is None
    assert await store.commit_compaction(conversation, "fast", [], [checkpoint(2)])
    assert [r.end for r in (await store.load(conversation)).records] == [2]


async def test_stale_start_after_lease_expiry_blocks_nothing(
    store: Store, conversation: str
) -> None:
    assert await store.begin_compaction(conversation, "crashed", 0.1, START) is BEGUN
    assert await store.begin_compaction(conversation, "other", 30, START) is BUSY
    await asyncio.sleep(0.25)
    assert (await store.load(conversation)).lease_owner is None
    assert await store.wait_for_lease(conversation, 0.01)
    assert await store.begin_compaction(conversation, "other", 30, START) is BEGUN


async def test_a_renewed_lease_outlives_its_first_ttl_and_only_its_owner_renews(
    store: Store, conversation: str
) -> None:
    assert await store.begin_compaction(conversation, "me", 0.3, START) is BEGUN
    for _ in range(3):
        await asyncio.sleep(0.15)
        assert await store.renew_lease(conversation, "me", 0.3)
    assert not await store.renew_lease(conversation, "someone-else", 30)
    assert await store.begin_compaction(conversation, "other", 30, START) is BUSY
    assert await store.commit_compaction(conversation, "me", [], [checkpoint(1)])
    assert not await store.renew_lease(conversation, "me", 30)  # released by the commit


async def test_an_expired_lease_cannot_be_renewed(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "crashed", 0.1, START) is BEGUN
    await asyncio.sleep(0.25)
    assert not await store.renew_lease(conversation, "crashed", 30)
    assert (await store.load(conversation)).lease_owner is None


async def test_end_releases_only_our_own_lease(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "me", 30, START) is BEGUN
    await store.end_compaction(
        conversation, "someone-else", {"type": "compaction/end", "error": "x"}
    )
    assert (await store.load(conversation)).lease_owner == "me"
    await store.end_compaction(
        conversation, "me", {"type": "compaction/end", "error": "summary_failed"}
    )
    assert (await store.load(conversation)).lease_owner is None
    ends = [e for e in await log_of(store, conversation) if e["type"] == "compaction/end"]
    assert [e["error"] for e in ends] == ["x", "summary_failed"]


async def test_wait_for_lease_is_bounded(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "me", 30, START) is BEGUN
    assert not await store.wait_for_lease(conversation, 0.15)

    async def release_soon() -> None:
        await asyncio.sleep(0.1)
        await store.end_compaction(conversation, "me", {"type": "compaction/end"})

    releaser = asyncio.create_task(release_soon())
    assert await store.wait_for_lease(conversation, 5)
    await releaser


async def test_recorded_request_replaces_the_anchor(store: Store, conversation: str) -> None:
    first = Anchor("hash-3", 5, 1200, 1180)
    usage = {"type": "usage", "prompt_tokens": 1200}
    await store.record_request(
        conversation, [{"type": "request"}, usage], first, ConversationAttributes(last_pressure=0.5)
    )
    await store.record_request(conversation, [{"type": "usage", "prompt_tokens": 1}], None)
    state = await store.load(conversation)
    assert state.anchor == first and state.attributes == ConversationAttributes(last_pressure=0.5)
    second = Anchor("hash-9", 9, 2000, 1990, tip_hash="chain-9")
    await store.record_request(conversation, [], second)
    assert (await store.load(conversation)).anchor == second
    assert [e["type"] for e in await log_of(store, conversation)] == ["request", "usage", "usage"]


async def test_a_recorded_request_logs_its_new_messages_before_its_events(
    store: Store, conversation: str
) -> None:
    """One step after the answer: the messages not logged yet, then the request's events, its
    attributes and anchor; the logged tip moves to its last message."""
    anchor = Anchor("hash-2", 2, 900, 880)
    request = {"type": "request"}
    await store.record_request(
        conversation, [request], anchor, ConversationAttributes(tenant="t"), messages(3)
    )
    state = await store.load(conversation)
    assert state.logged_tip == (2, "hash-2")
    assert state.attributes == ConversationAttributes(tenant="t") and state.anchor == anchor
    assert await store.begin_compaction(conversation, "me", 30, START) is BEGUN
    await store.record_request(conversation, [request], messages=messages(5))
    state = await store.load(conversation)
    assert state.logged_tip == (4, "hash-4") and state.anchor == anchor
    assert state.lease_owner == "me"
    logged = [
        e["position"] if e["type"] == "message" else e["type"]
        for e in await log_of(store, conversation)
        if e["type"] in ("message", "request")
    ]
    assert logged == [0, 1, 2, "request", 3, 4, "request"]


async def test_logged_events_read_back_byte_for_byte_in_any_script_and_size(
    store: Store, conversation: str
) -> None:
    """Events travel to Redis back to back, cut by byte length: multi-byte text, escapes and
    a large event between small ones must come back exactly."""
    contents = ["naïve 数据 \U0001f600", 'quote " and \\ and \n', "x" * 200_000, "", "end"]
    batch = [
        MessageEvent(i, f"hash-{i}", {"type": "message", "position": i, "text": text})
        for i, text in enumerate(contents)
    ]
    assert await store.append(conversation, batch) == len(contents)
    assert [e["text"] for e in await log_of(store, conversation)] == contents


async def test_log_reads_in_pages(store: Store, conversation: str) -> None:
    await store.append(conversation, messages(25))
    positions: list[object] = []
    cursor = None
    pages = 0
    while True:
        page = await store.read_log(conversation, after=cursor, limit=10)
        positions += [event["position"] for _, event in page.events]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert positions == list(range(25))
    assert pages == 3


async def test_first_shared_secret_wins(store: Store) -> None:
    name = f"tenant-{uuid.uuid4().hex}"
    results = await asyncio.gather(*(store.shared_secret(name, bytes([i]) * 32) for i in range(10)))
    assert len(set(results)) == 1
    assert await store.shared_secret(name, b"late" * 8) == results[0]


async def test_every_write_sets_a_ttl(store: Store, conversation: str) -> None:
    await store.append(conversation, messages(2), [{"type": "request"}])
    await store.begin_compaction(conversation, "me", 30, START)
    await store.commit_compaction(conversation, "me", [], [checkpoint(0)])
    if isinstance(store, RedisStore):
        ttls = await store.ttl_of(conversation)
        assert ttls["leases"] == -2  # released by the commit, so no lease is left
        assert ttls["records"] == -2  # only versions before anchoring wrote this list
        for name in ("log", "state", "anchored", "positions", "used"):
            assert 3_500_000 < ttls[name] <= 3_600_000, name
    else:
        assert isinstance(store, MemoryStore)
        remaining = store.expires_in(conversation)
        assert remaining is not None and 3_500 < remaining <= 3_600


async def test_memory_store_evicts_the_least_recently_used() -> None:
    store = MemoryStore(max_conversations=2)
    for name in ("a", "b"):
        await store.append(name, messages(1))
    await store.append("a", messages(1, start=1))
    await store.append("c", messages(1))
    assert (await store.read_log("b")).events == []
    assert len((await store.read_log("a")).events) == 2


async def test_begin_is_stale_when_the_generation_moved_on(store: Store, conversation: str) -> None:
    assert await store.begin_compaction(conversation, "a", 30, START, 0) is BEGUN
    generation = await store.commit_compaction(conversation, "a", [], [checkpoint(1)])
    assert generation is not None
    assert await store.begin_compaction(conversation, "b", 30, START, 0) is STALE
    assert (await store.load(conversation)).lease_owner is None
    assert await store.begin_compaction(conversation, "b", 30, START, generation) is BEGUN
    starts = [e for e in await log_of(store, conversation) if e["type"] == "compaction/start"]
    assert len(starts) == 2


async def test_recently_active_conversations_are_listed_newest_first(store: Store) -> None:
    names = [f"test-list-{uuid.uuid4().hex}" for _ in range(3)]
    for name in names:
        await store.append(
            name, messages(1), attributes=ConversationAttributes(tenant="t", last_pressure=0.5)
        )
        await asyncio.sleep(0.01)
    listed = await store.list_conversations(limit=1000)
    ours = [s for s in listed if s.conversation in names]
    assert [s.conversation for s in ours] == names[::-1]
    assert all(s.attributes.tenant == "t" and s.generation == 0 for s in ours)
    assert len(await store.list_conversations(limit=2)) == 2
    page = await store.list_conversations(limit=2, offset=1)
    assert [s.conversation for s in page] == [s.conversation for s in listed[1:3]]


async def test_superseded_records_are_dropped_at_commit(store: Store, conversation: str) -> None:
    older, prune = checkpoint(2), Prune(3, "hash-3", "[pruned]")
    generations = []
    for records in ([older], [prune]):
        assert await store.begin_compaction(conversation, "o", 30, START) is BEGUN
        generations.append(await store.commit_compaction(conversation, "o", [], records))
    kept = checkpoint(1)  # of no concern to the commit below: not in its superseded list
    assert await store.begin_compaction(conversation, "o", 30, START) is BEGUN
    generations.append(await store.commit_compaction(conversation, "o", [], [kept]))
    newer = checkpoint(5)
    assert await store.begin_compaction(conversation, "o", 30, START) is BEGUN
    generations.append(
        await store.commit_compaction(conversation, "o", [], [newer], [older, prune])
    )
    assert generations == sorted(set(generations))  # every commit a generation of its own
    assert (await store.load(conversation)).records == (kept, newer)


def bounded_backends() -> list[str]:
    return ["memory", "redis"]


async def test_the_log_keeps_only_its_newest_events(conversation: str) -> None:

    for backend in bounded_backends():
        store: Store = (
            MemoryStore(max_log_events=200)
            if backend == "memory"
            else RedisStore(shared_redis_url(), ttl_seconds=3600, max_log_events=200)
        )
        try:
            for turn in range(30):
                await store.append(conversation, messages(20, start=turn * 20))
                await store.record_request(conversation, [{"type": "request", "turn": turn}])
            log = await log_of(store, conversation)
            # Redis trims in whole stream nodes (about 100 entries): "about" the cap.
            assert 200 <= len(log) <= 320, (backend, len(log))
            assert log[-1] == {"type": "request", "turn": 29}
        finally:
            await store.close()


def big_messages(count: int, start: int, size: int) -> list[MessageEvent]:
    return [
        MessageEvent(i, f"big-{i}", {"type": "message", "position": i, "content": "x" * size})
        for i in range(start, start + count)
    ]


async def test_one_conversations_log_holds_at_most_its_byte_bound(conversation: str) -> None:
    """However big and many its messages, one conversation's log keeps at most
    ``log_max_bytes`` (its newest events); what is dropped is counted."""
    for backend in bounded_backends():
        store: Store = (
            MemoryStore(max_log_bytes=200_000)
            if backend == "memory"
            # Stored as JSON, so what is read back weighs what the bound counts.
            else RedisStore(
                shared_redis_url(), ttl_seconds=3600, max_log_bytes=200_000, compress_log=False
            )
        )
        before = counter("compaction_proxy_log_bytes_dropped_total")
        try:
            for turn in range(10):
                await store.append(conversation, big_messages(20, turn * 20, 9_000))
                await store.record_request(conversation, [{"type": "request", "turn": turn}])
            log = await log_of(store, conversation)
            held = sum(len(orjson.dumps(event)) for event in log)
            assert 150_000 <= held <= 200_000, (backend, held)
            assert log[-1] == {"type": "request", "turn": 9}
            assert counter("compaction_proxy_log_bytes_dropped_total") - before >= 1_500_000
            # Still served: the state loads, and new messages are logged.
            await store.load(conversation)
            assert await store.append(conversation, big_messages(1, 1_000, 10)) == 1
        finally:
            await store.close()


async def test_a_packed_log_reads_back_as_written_and_stays_in_its_bound(
    conversation: str,
) -> None:
    """Redis packs the log's older events into compressed segments: read back, they are the
    events written; the byte bound counts what is stored, so the log keeps far more events
    than their JSON would fit; a log written without packing reads alike."""
    plain = RedisStore(shared_redis_url(), ttl_seconds=3600, compress_log=False)
    store = RedisStore(shared_redis_url(), ttl_seconds=3600, max_log_bytes=100_000)
    try:
        written = [*big_messages(3, 0, 10), *big_messages(3, 3, 5_000)]
        await plain.append(conversation, written[:2])
        await store.append(conversation, written[2:])
        assert await log_of(store, conversation) == [m.event for m in written]
        for turn in range(100):
            await store.append(conversation, big_messages(2, 100 + turn * 2, 20_000))
            await store.log_packs_settled()
        client = aioredis.Redis.from_url(shared_redis_url())
        try:
            keys = conversation_keys(conversation)
            stored = int(await client.hget(keys["state"], "log_bytes") or 0)
            log_memory = await client.memory_usage(keys["log"], samples=0)
        finally:
            await client.aclose()
        assert 0 < stored <= 100_000
        assert log_memory is not None and log_memory < 100_000
        logged = await log_of(store, conversation)
        assert logged == [m.event for m in written + big_messages(200, 100, 20_000)]
    finally:
        await plain.close()
        await store.close()


async def test_one_conversation_alone_never_outgrows_the_memory_stores_bound() -> None:
    store = MemoryStore(max_bytes=4 * 1024 * 1024)
    for turn in range(10):
        await store.append("alone", big_messages(20, turn * 20, 90_000))
        assert store.size_bytes <= 4 * 1024 * 1024
    assert len(await log_of(store, "alone")) >= 40


async def test_the_memory_store_is_bounded_by_bytes_evicting_the_least_recent() -> None:
    store = MemoryStore(max_bytes=60_000)
    big = [MessageEvent(i, f"h{i}", {"type": "message", "content": "x" * 1_000}) for i in range(20)]
    for name in ("a", "b", "c", "d"):
        await store.append(name, big)  # about 21 kB each
        assert store.size_bytes <= 60_000
    assert [s.conversation for s in await store.list_conversations()] == ["d", "c"]


async def test_quotas_are_taken_together_up_to_their_limits(store: Store) -> None:
    tenant, route = f"tenant-{uuid.uuid4().hex}", f"route-{uuid.uuid4().hex}"
    quotas = [(tenant, 2), (route, 3)]
    assert [await store.take_quota(quotas, HOUR) for _ in range(3)] == [None, None, tenant]
    # The tenant's refusal took nothing from the route: another tenant still gets one.
    other = f"tenant-{uuid.uuid4().hex}"
    assert await store.take_quota([(other, 5), (route, 3)], HOUR) is None
    assert await store.take_quota([(other, 5), (route, 3)], HOUR) == route


async def test_racing_quota_takers_never_exceed_the_limit(store: Store) -> None:
    name = f"tenant-{uuid.uuid4().hex}"
    taken = await asyncio.gather(*(store.take_quota([(name, 7)], HOUR) for _ in range(40)))
    assert taken.count(None) == 7


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_records_expire_after_record_ttl_while_the_log_stays(
    backend: str, conversation: str
) -> None:
    """Checkpoint summaries are stored in clear (they are forwarded); ``record_ttl_seconds``
    bounds how long they outlive a conversation's last request."""
    store: Store
    if backend == "memory":
        store = MemoryStore(ttl_seconds=3600, record_ttl_seconds=0.3)
    else:
        store = RedisStore(shared_redis_url(), ttl_seconds=3600, record_ttl_seconds=0.3)
    try:
        await store.append(conversation, messages(3))
        assert await store.begin_compaction(conversation, "me", 30, START) is BEGUN
        assert await store.commit_compaction(conversation, "me", [], [checkpoint(2)])
        assert (await store.load(conversation)).records == (checkpoint(2),)
        await asyncio.sleep(0.5)
        state = await store.load(conversation)
        assert state.records == ()
        assert len(await log_of(store, conversation)) == 4  # 3 messages and compaction/start
    finally:
        await store.close()


async def test_a_quota_frees_up_as_its_window_slides(store: Store) -> None:
    name = f"tenant-{uuid.uuid4().hex}"
    assert [await store.take_quota([(name, 2)], 1) for _ in range(3)] == [None, None, name]
    await asyncio.sleep(1.1)
    assert await store.take_quota([(name, 2)], 1) is None


async def test_a_quota_unit_given_back_can_be_taken_again(store: Store) -> None:
    name = f"test-give-back-{uuid.uuid4().hex}"
    other = f"test-give-back-other-{uuid.uuid4().hex}"
    for _ in range(3):
        assert await store.take_quota([(name, 3), (other, 10)], HOUR) is None
    assert await store.take_quota([(name, 3)], HOUR) == name
    await store.give_back_quota([name], HOUR)
    assert await store.take_quota([(name, 3)], HOUR) is None
    assert await store.take_quota([(name, 3)], HOUR) == name
    await store.give_back_quota([f"test-never-taken-{uuid.uuid4().hex}"], HOUR)  # no error


async def test_an_object_keeps_its_first_owner_until_its_record_expires(store: Store) -> None:
    mine, theirs = f"file-{uuid.uuid4().hex}", f"file-{uuid.uuid4().hex}"
    await store.claim_objects("alice", [mine], HOUR)
    await store.claim_objects("bob", [mine, theirs], HOUR)  # a second claim changes nothing
    unknown = f"file-{uuid.uuid4().hex}"
    assert await store.object_owners([mine, theirs, unknown]) == ["alice", "bob", None]
    brief = f"resp_{uuid.uuid4().hex}"
    await store.claim_objects("alice", [brief], 0.2)
    await asyncio.sleep(0.4)
    assert await store.object_owners([brief]) == [None]
    assert await store.object_owners([]) == []


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_a_conversation_the_store_lost_never_repeats_a_generation(
    backend: str, conversation: str
) -> None:
    """A store flushed or restarted empty counts the conversation again from nothing; its next
    commit still lands past every generation it had (commits under ten a second), so
    ``X-Compaction-Generation`` never names two surfaces."""
    store: Store = MemoryStore() if backend == "memory" else RedisStore(shared_redis_url())
    try:
        before = [await commit_one(store, conversation, end) for end in range(3)]
        await asyncio.sleep(0.35)
        if backend == "memory":
            await store.close()
            store = MemoryStore()  # the process restarted
        else:
            client = aioredis.Redis.from_url(shared_redis_url())
            try:
                await client.delete(*conversation_keys(conversation).values())
            finally:
                await client.aclose()
        assert (await store.load(conversation)).generation == 0
        after = await commit_one(store, conversation, 1)
        assert after > max(before)
    finally:
        await store.close()
