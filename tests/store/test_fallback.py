"""The fallback while the shared store is away: conversations go on locally from what was last
read, and what was made meanwhile is committed back only where nobody moved on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from compaction_proxy.conversation.replacements import Checkpoint
from compaction_proxy.store import BeginResult, MemoryStore, Store, StoreUnavailable
from compaction_proxy.store.fallback import FallbackStore

START = {"type": "compaction/start"}
BEGUN = BeginResult.BEGUN


class Switchable:
    """A store that fails every operation (as an unreachable Redis does) while ``down``."""

    def __init__(self, inner: MemoryStore) -> None:
        self.inner = inner
        self.down = False

    def __getattr__(self, name: str) -> Callable[..., Awaitable[Any]]:
        operation = getattr(self.inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise StoreUnavailable(name, "ConnectionError")
            return await operation(*args, **kwargs)

        return call


def checkpoint(end: int, text: str = "s") -> Checkpoint:
    return Checkpoint(0, end, "root", f"hash-{end}", {"role": "user", "content": text}, tokens=3)


async def commit(store: Store, conversation: str, *records: Checkpoint) -> int:
    owner = f"o-{records[0].end}-{records[0].message['content']}"
    assert await store.begin_compaction(conversation, owner, 30, START) is BEGUN
    generation = await store.commit_compaction(conversation, owner, [], list(records))
    assert generation is not None
    return generation


async def summarized_during_an_outage(
    shared: Switchable, fallback: FallbackStore, text: str
) -> int:
    """A checkpoint read from the store, the store gone, a later one made locally; the
    generation of the first."""
    before = await commit(fallback, "c", checkpoint(3))
    await fallback.load("c")
    shared.down = True
    await fallback.load("c")
    await commit(fallback, "c", checkpoint(6, text))
    return before


@pytest.fixture
def shared() -> Switchable:
    return Switchable(MemoryStore())


@pytest.fixture
def fallback(shared: Switchable) -> FallbackStore:
    return FallbackStore(cast(Store, shared))


async def test_while_the_store_is_away_a_conversation_goes_on_from_what_was_last_read(
    shared: Switchable, fallback: FallbackStore
) -> None:
    await commit(fallback, "c", checkpoint(3))
    seen = await fallback.load("c")
    shared.down = True
    assert (await fallback.load("c")).records == seen.records == (checkpoint(3),)
    # A summary made meanwhile is committed here, and read by the next request.
    await commit(fallback, "c", checkpoint(6, "later"))
    assert (await fallback.load("c")).records == (checkpoint(3), checkpoint(6, "later"))
    assert (await shared.inner.load("c")).records == (checkpoint(3),)  # the store never saw it


async def test_once_the_store_answers_the_local_work_is_committed_to_it(
    shared: Switchable, fallback: FallbackStore
) -> None:
    before = await summarized_during_an_outage(shared, fallback, "later")
    shared.down = False
    state = await fallback.load("c")
    assert checkpoint(6, "later") in state.records and state.generation > before
    assert checkpoint(6, "later") in (await shared.inner.load("c")).records
    shared.down = True  # the local copy was dropped: it starts again from the store's state
    assert checkpoint(6, "later") in (await fallback.load("c")).records


async def test_local_work_is_dropped_when_the_conversation_moved_on_in_the_store(
    shared: Switchable, fallback: FallbackStore
) -> None:
    await summarized_during_an_outage(shared, fallback, "ours")
    await commit(shared.inner, "c", checkpoint(5, "another replica's"))  # it reached the store
    shared.down = False
    records = (await fallback.load("c")).records
    assert checkpoint(5, "another replica's") in records and checkpoint(6, "ours") not in records


async def test_a_round_still_running_locally_is_committed_back_after_it_ends(
    shared: Switchable, fallback: FallbackStore
) -> None:
    shared.down = True
    await fallback.load("new")  # first contact while the store is away
    assert await fallback.begin_compaction("new", "round", 30, START) is BEGUN
    shared.down = False
    assert (await fallback.load("new")).records == ()  # not yet: the round holds its lease
    assert await fallback.commit_compaction("new", "round", [], [checkpoint(4)]) is not None
    assert (await fallback.load("new")).records == (checkpoint(4),)
    assert (await shared.inner.load("new")).records == (checkpoint(4),)


@pytest.mark.parametrize(
    "operation",
    [
        lambda s: s.ping(),
        lambda s: s.object_owners(["file-1"]),
        lambda s: s.claim_objects("t", ["file-1"], 60),
        lambda s: s.shared_secret("tenant", b"x"),
        lambda s: s.read_log("c"),
        lambda s: s.take_quota([("t", 5)], 60),
    ],
)
async def test_ownership_secrets_quotas_logs_and_readiness_never_fall_back(
    shared: Switchable, fallback: FallbackStore, operation: Callable[[Store], Awaitable[Any]]
) -> None:
    await fallback.load("c")
    shared.down = True
    await fallback.load("c")
    with pytest.raises(StoreUnavailable):
        await operation(fallback)


async def test_a_store_back_empty_gets_the_local_copy_whole(
    shared: Switchable, fallback: FallbackStore
) -> None:
    await summarized_during_an_outage(shared, fallback, "later")
    shared.inner.forget("c")  # restarted without its data
    shared.down = False
    assert (await fallback.load("c")).records == (checkpoint(3), checkpoint(6, "later"))
