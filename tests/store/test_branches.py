"""Conversations that begin alike (twins: one conversation id, one log) read, wait on and
count only their own branch: records, leases and generation are anchored on the chain. Run
against every backend."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence

import pytest
import redis.asyncio as aioredis

from compaction_proxy.conversation.replacements import (
    Checkpoint,
    CheckpointEnd,
    Prune,
    ReplacementRecord,
    superseded_by,
)
from compaction_proxy.store import BeginResult, MemoryStore, Store
from compaction_proxy.store.branches import anchor_of, on_chain
from compaction_proxy.store.redis import RedisStore
from tests.redis_server import RedisServer, shared_redis_url

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

START = {"type": "compaction/start"}
END = {"type": "compaction/end", "outcome": "summary_failed"}
BEGUN, BUSY, STALE = BeginResult.BEGUN, BeginResult.BUSY, BeginResult.STALE


def chain(branch: str, length: int, shared: int = 1) -> list[str]:
    """A chain whose first ``shared`` hashes every branch has, the rest ``branch``'s own."""
    return [f"{'s' if i < shared else branch:_<4}-{i:05d}" for i in range(length)]


def summary_of(on: Sequence[str], end: int, text: str = "s") -> Checkpoint:
    message = {"role": "user", "content": text}
    return Checkpoint(0, end, "root", on[end], message, tokens=3, end_fingerprint=f"fp-{end}")


async def commit(
    store: Store, conversation: str, on: Sequence[str], records: Sequence[Checkpoint | Prune]
) -> int | None:
    owner = f"owner-{on[-1]}-{time.monotonic_ns()}"
    end = max(r.end if isinstance(r, Checkpoint) else r.position for r in records)
    began = await store.begin_compaction(conversation, owner, 30, START, None, on, end)
    assert began is BEGUN
    return await store.commit_compaction(conversation, owner, [], records)


async def test_a_twin_reads_only_the_records_on_its_own_chain(
    store: Store, conversation: str
) -> None:
    a, b = chain("a", 12), chain("b", 12)
    ours = summary_of(a, 6)
    theirs = summary_of(b, 8)
    pruned = Prune(9, a[9], "[pruned]")
    await commit(store, conversation, a, [ours, pruned])
    await commit(store, conversation, b, [theirs])
    assert (await store.load(conversation, a)).records == (ours, pruned)
    assert (await store.load(conversation, b)).records == (theirs,)
    # A chain too short to hold an anchor does not reach it.
    assert (await store.load(conversation, a[:7])).records == (ours,)
    assert (await store.load(conversation)).records == (ours, pruned, theirs)


async def test_a_record_on_the_shared_prefix_is_read_by_every_twin(
    store: Store, conversation: str
) -> None:
    a, b = chain("a", 12, shared=5), chain("b", 12, shared=5)
    shared = summary_of(a, 3)
    await commit(store, conversation, a, [shared])
    assert (await store.load(conversation, b)).records == (shared,)


async def test_what_a_twin_reads_does_not_grow_with_the_twins_before_it(
    store: Store, conversation: str
) -> None:
    for twin in range(60):
        on = chain(f"t{twin:03d}", 30)
        await commit(store, conversation, on, [summary_of(on, 20), Prune(25, on[25], "x")])
    newcomer = chain("new", 30)
    state = await store.load(conversation, newcomer)
    assert (state.records, state.generation) == ((), 0)
    last = chain("t059", 30)
    assert len((await store.load(conversation, last)).records) == 2
    assert len((await store.load(conversation)).records) == 120


async def test_twins_never_wait_on_each_others_leases(store: Store, conversation: str) -> None:
    a, b = chain("a", 20), chain("b", 20)
    assert await store.begin_compaction(conversation, "a1", 30, START, 0, a, 15) is BEGUN
    # Another twin compacts at once, and neither waits for the other.
    assert await store.begin_compaction(conversation, "b1", 30, START, 0, b, 15) is BEGUN
    assert await store.wait_for_lease(conversation, 0.0, chain("b", 22)) is False
    assert (await store.load(conversation, a)).lease_owner == "a1"
    assert (await store.load(conversation, b)).lease_owner == "b1"
    fresh = chain("c", 20)
    assert (await store.load(conversation, fresh)).lease_owner is None
    assert await store.wait_for_lease(conversation, 0.0, fresh)
    # A later request of the same branch (its chain holds the lease's anchor) waits.
    later = chain("a", 22)
    assert await store.begin_compaction(conversation, "a2", 30, START, 0, later, 18) is BUSY
    assert not await store.wait_for_lease(conversation, 0.05, later)
    # The whole conversation sees both.
    assert await store.begin_compaction(conversation, "admin", 30, START) is BUSY
    committed = await store.commit_compaction(conversation, "a1", [], [summary_of(a, 15)])
    assert committed is not None
    assert await store.wait_for_lease(conversation, 0.0, later)
    assert (
        await store.begin_compaction(conversation, "a2", 30, START, committed, later, 18) is BEGUN
    )


async def test_a_branchs_generation_moves_only_with_its_own_commits(
    store: Store, conversation: str
) -> None:
    a, b = chain("a", 20), chain("b", 20)
    first = await commit(store, conversation, a, [summary_of(a, 10)])
    second = await commit(store, conversation, a, [summary_of(a, 14)])
    assert first is not None and second is not None and 0 < first < second
    assert (await store.load(conversation, a)).generation == second
    assert (await store.load(conversation, b)).generation == 0
    assert (await store.load(conversation)).generation == second
    # A twin that read its branch before the other's commits is not stale for them ...
    assert await store.begin_compaction(conversation, "b", 30, START, 0, b, 12) is BEGUN
    third = await store.commit_compaction(conversation, "b", [], [summary_of(b, 12)])
    assert third is not None and third > second
    # ... but a request that read its own branch before that branch's commit is.
    assert await store.begin_compaction(conversation, "a", 30, START, first, a, 16) is STALE
    assert await store.begin_compaction(conversation, "a", 30, START, second, a, 16) is BEGUN


async def test_the_conversation_keeps_its_last_checkpoint_ends_of_every_branch(
    store: Store, conversation: str
) -> None:
    """For the miss guard: a request reads no other branch's records, yet must see that it
    resends the messages one of its own earlier checkpoints ended at."""
    a, b = chain("a", 20), chain("b", 20)
    await commit(store, conversation, a, [summary_of(a, 10)])
    await commit(store, conversation, b, [summary_of(b, 12), Prune(14, b[14], "x")])
    expected = (CheckpointEnd(10, "fp-10"), CheckpointEnd(12, "fp-12"))
    assert (await store.load(conversation, chain("c", 20))).recent_ends == expected
    for twin in range(20):
        on = chain(f"t{twin:03d}", 20)
        await commit(store, conversation, on, [summary_of(on, twin % 15)])
    ends = (await store.load(conversation)).recent_ends
    assert [end.end for end in ends] == [twin % 15 for twin in range(4, 20)]


@pytest.mark.parametrize("backend", ["memory", "redis"])
async def test_records_no_request_reaches_are_dropped_while_a_twin_goes_on(
    backend: str, conversation: str
) -> None:
    store: Store
    if backend == "memory":
        store = MemoryStore(ttl_seconds=3600, record_ttl_seconds=0.4)
    else:
        store = RedisStore(shared_redis_url(), ttl_seconds=3600, record_ttl_seconds=0.4)
    a, b = chain("a", 20), chain("b", 20)
    try:
        await commit(store, conversation, a, [summary_of(a, 10)])
        await commit(store, conversation, b, [summary_of(b, 10)])
        for _ in range(6):  # b goes on, reaching its record; a never comes back
            await asyncio.sleep(0.1)
            reached = (await store.load(conversation, b)).records
            await store.record_request(conversation, [{"type": "request"}], reached=reached)
        assert (await store.load(conversation, a)).records == ()
        assert (await store.load(conversation, b)).records == (summary_of(b, 10),)
        assert (await store.load(conversation)).records == (summary_of(b, 10),)
    finally:
        await store.close()


async def test_a_superseded_record_leaves_its_anchor_free(store: Store, conversation: str) -> None:
    a = chain("a", 20)
    pruned = Prune(4, a[4], "[pruned]")
    first = await commit(store, conversation, a, [pruned])
    wider = summary_of(a, 9)
    owner = "wider"
    assert await store.begin_compaction(conversation, owner, 30, START, None, a, 9) is BEGUN
    second = await store.commit_compaction(conversation, owner, [], [wider], [pruned])
    assert first is not None and second is not None and second > first
    assert (await store.load(conversation, a)).records == (wider,)
    assert (await store.load(conversation)).records == (wider,)
    # Anchored again at the same place later, it is read again.
    await commit(store, conversation, a, [pruned])
    assert (await store.load(conversation, a)).records == (wider, pruned)


async def test_a_twin_superseding_a_shared_record_never_takes_a_generation_back(
    store: Store, conversation: str
) -> None:
    a, b = chain("a", 20, shared=6), chain("b", 20, shared=6)
    shared = summary_of(a, 4)
    first = await commit(store, conversation, a, [shared])
    assert first is not None and (await store.load(conversation, a)).generation == first
    # b's wider checkpoint supersedes the shared one (it is on b's chain too) ...
    wider = summary_of(b, 12)
    assert await store.begin_compaction(conversation, "b", 30, START, first, b, 12) is BEGUN
    second = await store.commit_compaction(conversation, "b", [], [wider], [shared])
    assert second is not None and second > first
    # ... so a lost it: its branch moved on, it did not go back.
    state = await store.load(conversation, a)
    assert (state.records, state.generation) == ((), second)
    assert await store.begin_compaction(conversation, "a", 30, START, first, a, 14) is STALE


# (branch, position, checkpoint?, supersede?) commits, over chains that share a prefix.
commit_step = st.tuples(st.sampled_from("abc"), st.integers(0, 11), st.booleans(), st.booleans())


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 12), st.lists(commit_step, min_size=1, max_size=12))
def test_both_backends_read_every_branch_alike_and_no_generation_goes_back(
    shared: int, steps: list[tuple[str, int, bool, bool]]
) -> None:
    """The Redis scripts and the in-process index, driven alike, agree on what every branch
    reads; what a branch reads is exactly the records anchored on its chain; and a branch's
    generation never goes back, whatever its twins commit."""
    chains = {name: chain(name, 12, shared=shared) for name in "abc"}

    async def check() -> None:
        memory, redis = (
            MemoryStore(ttl_seconds=3600),
            RedisStore(shared_redis_url(), ttl_seconds=3600),
        )
        conversation = f"test-{uuid.uuid4().hex}"
        held: list[Checkpoint | Prune] = []  # the model: what the conversation holds
        seen = {backend: dict.fromkeys(chains, 0) for backend in ("memory", "redis")}
        try:
            for index, (name, position, is_checkpoint, supersede) in enumerate(steps):
                on = chains[name]
                record: Checkpoint | Prune = (
                    summary_of(on, position, f"s{index}")
                    if is_checkpoint
                    else Prune(position, on[position], f"p{index}")
                )
                state = await memory.load(conversation, on)
                dropped = (
                    superseded_by(record, state.records, on)
                    if supersede and isinstance(record, Checkpoint)
                    else []
                )
                for store in (memory, redis):
                    owner = f"o{index}"
                    began = await store.begin_compaction(
                        conversation, owner, 30, START, None, on, position
                    )
                    assert began is BEGUN
                    await store.commit_compaction(conversation, owner, [], [record], dropped)
                held = [r for r in held if r not in dropped] + [record]
                for other, other_chain in chains.items():
                    ours = await memory.load(conversation, other_chain)
                    theirs = await redis.load(conversation, other_chain)
                    assert ours.records == theirs.records
                    # Generations follow each backend's clock: they move, or stay, alike.
                    moved = (ours.generation > seen["memory"][other]) == (
                        theirs.generation > seen["redis"][other]
                    )
                    assert moved and ours.generation >= seen["memory"][other]
                    assert theirs.generation >= seen["redis"][other]
                    seen["memory"][other], seen["redis"][other] = ours.generation, theirs.generation
                    expected = [r for r in held if on_chain(other_chain, *anchor_of(r))]
                    assert sorted(map(repr, ours.records)) == sorted(map(repr, expected))
            assert (await memory.load(conversation)).records == (
                await redis.load(conversation)
            ).records
        finally:
            await redis.close()

    asyncio.run(check())


async def test_a_branch_reads_where_the_summary_being_written_ends(
    store: Store, conversation: str
) -> None:
    """The bridge cuts only what the coming checkpoint will shadow: it reads the span's end
    from the lease on its branch."""
    a = chain("a", 20)
    assert await store.begin_compaction(conversation, "a1", 30, START, 0, a, 12) is BEGUN
    later = chain("a", 26)
    assert (await store.load(conversation, later)).lease_end == 12
    assert (await store.load(conversation, chain("b", 26))).lease_end is None  # a twin's
    await store.end_compaction(conversation, "a1", END)
    assert (await store.load(conversation, later)).lease_end is None


@pytest.mark.parametrize("backend", ["redis", "redis-cluster"])
async def test_a_replica_reads_what_another_anchored_and_leased_where_it_never_looked(
    backend: str, request: pytest.FixtureRequest, conversation: str
) -> None:
    """A load sends the chain's hashes only at the positions its last load consulted: another
    replica's records and leases at new positions are still read (the script names them and
    the load asks again)."""
    url = shared_redis_url() if backend == "redis" else request.getfixturevalue("redis_cluster_url")
    ours, theirs = RedisStore(url, ttl_seconds=3600), RedisStore(url, ttl_seconds=3600)
    a = chain("a", 40)
    try:
        assert (await ours.load(conversation, a)).records == ()
        first = summary_of(a, 12)
        await commit(theirs, conversation, a, [first])
        assert (await ours.load(conversation, a)).records == (first,)
        second = summary_of(a, 20)
        await commit(theirs, conversation, a, [second])
        assert (
            await theirs.begin_compaction(conversation, "theirs", 30, START, None, a, 30) is BEGUN
        )
        state = await ours.load(conversation, a)
        assert (state.records, state.lease_owner, state.lease_end) == (
            (first, second),
            "theirs",
            30,
        )
        # Another branch of the conversation lacks both anchors and the lease.
        assert (await ours.load(conversation, chain("b", 40))).records == ()
    finally:
        await ours.close()
        await theirs.close()


async def test_what_a_load_sends_does_not_grow_with_its_chain(
    private_redis: RedisServer, conversation: str
) -> None:
    """Measured on a server of the test's own: a load of a chain of 5,000 hashes sends what
    one of 50 does, and reads the same records."""
    store = RedisStore(private_redis.url, ttl_seconds=3600)
    server = aioredis.Redis.from_url(private_redis.url)
    long = chain("a", 5000)
    checkpoint = summary_of(long, 12)

    async def sent(on: Sequence[str]) -> tuple[int, tuple[ReplacementRecord, ...]]:
        before = (await server.info("stats"))["total_net_input_bytes"]
        records = (await store.load(conversation, on)).records
        after = (await server.info("stats"))["total_net_input_bytes"]
        return after - before, records

    try:
        await commit(store, conversation, long, [checkpoint])
        await store.load(conversation, long)
        short_bytes, short_records = await sent(long[:50])
        long_bytes, long_records = await sent(long)
        assert short_records == long_records == (checkpoint,)
        assert long_bytes - short_bytes < 100  # the whole chain would be 50,000 bytes more
    finally:
        await store.close()
        await server.aclose()
