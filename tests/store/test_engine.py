"""The compaction transaction against both stores, with a scripted summarizer."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from compaction_proxy.compaction import triggers
from compaction_proxy.compaction.cache_prices import PRESETS
from compaction_proxy.compaction.engine import Engine, EngineSettings
from compaction_proxy.compaction.masking import Masker, mask_candidates
from compaction_proxy.compaction.model_policy import Budgets
from compaction_proxy.compaction.outcomes import Outcome
from compaction_proxy.compaction.planning import CompactionJob, SummaryRequest
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.compaction.summarize import INSTRUCTION, SECTIONS, Summary, SummaryFailed
from compaction_proxy.config.settings import Policy
from compaction_proxy.conversation.replacements import Checkpoint, Prune
from compaction_proxy.metering.meter import TokenMeter
from compaction_proxy.store import BeginResult, Store, StoreUnavailable
from tests.builders import agent_turns, assistant, system, user

TOOLS = [{"type": "function", "function": {"name": "bash", "parameters": {"type": "object"}}}]
WINDOW = 4_000


async def commits(store: Store, conversation: str) -> int:
    """How many compactions committed in ``conversation`` (its log says, whatever the
    generations they took: those follow the clock)."""
    page = await store.read_log(conversation, limit=10_000)
    return sum(
        event.get("type") == "compaction/end" and event.get("outcome") == "committed"
        for _, event in page.events
    )


def long_conversation(turns: int = 12) -> list[dict[str, Any]]:
    return [
        system(),
        user("FACT-1: the release branch is rel/2.4. Fix the flaky test."),
        *agent_turns(turns, output="line of build output " * 80),
        user("status?"),
    ]


class Summarizer:
    """Records summary calls and answers them as scripted."""

    def __init__(self, text: str = "## Current Work\nshort", delay: float = 0.0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.text = text
        self.delay = delay
        self.failure: str | None = None
        self.during: Callable[[], Awaitable[None]] | None = None

    async def __call__(self, request: SummaryRequest) -> Summary:
        self.calls.append(request.body)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.during is not None:
            await self.during()
        if self.failure is not None:
            raise SummaryFailed(self.failure)
        return Summary(self.text, {"prompt_tokens": 100, "completion_tokens": 5})


LIMITS = Budgets(window=WINDOW, threshold=3_200, retain=640)


def job_for(
    conversation: str, messages: list[dict[str, Any]], summarizer: Summarizer, **policy: Any
) -> CompactionJob:
    view = RequestView.of("tenant", "fake-model", messages, None, TOOLS, conversation)
    return CompactionJob(
        view, Policy(**policy), Pruner(), WINDOW, "fake-model", summarizer, route="fake-*"
    )


async def log_of(store: Store, conversation: str) -> list[dict[str, Any]]:
    return [e for _, e in (await store.read_log(conversation, limit=10_000)).events]


def engine_on(store: Store, **settings: Any) -> Engine:
    return Engine(store, TokenMeter(), EngineSettings(**settings))


async def test_pressure_commits_one_checkpoint_as_a_whole_transaction(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    job = job_for(conversation, long_conversation(), summarizer)
    state = await store.load(conversation)
    before = await engine.measure(job, state, job.view.surface(()))
    relief = await triggers.relieve_pressure(engine, job, state, LIMITS)

    assert relief.compacted and await commits(store, conversation) == 1
    assert relief.measurement.tokens < 3_200 < before.tokens
    (record,) = relief.state.records
    assert isinstance(record, Checkpoint)
    assert record.start == 0 and record.start_prev_hash == job.view.root
    assert record.end_hash == job.view.chain[record.end]
    assert "<compacted-summary>\n## Current Work\nshort\n</compacted-summary>" in str(
        record.message["content"]
    )
    assert relief.surface.messages[:2] == [system(), record.message]
    assert relief.surface.messages[-1] == user("status?")

    (call,) = summarizer.calls
    assert call["messages"][0] == system()
    assert call["messages"][-1] == {"role": "user", "content": INSTRUCTION}
    assert call["messages"][1 : record.end + 2] == job.view.body[: record.end + 1]
    assert call["tools"] == TOOLS and call["tool_choice"] == "none"
    assert 0 < call["max_tokens"] <= 8192

    events = await log_of(store, conversation)
    kinds = [e["type"] for e in events]
    assert kinds == ["compaction/start", "compaction/summary", "compaction/end"]
    summary = events[1]
    assert summary["summary"] == "## Current Work\nshort"
    assert (summary["start"], summary["end"]) == (0, record.end)
    assert summary["end_hash"] == record.end_hash
    assert summary["shadowed_tokens"] == record.shadowed_tokens > record.tokens
    assert summary["route"] == "fake-*" and summary["model"] == "fake-model"
    assert summary["usage"] == {"prompt_tokens": 100, "completion_tokens": 5}
    assert events[2]["outcome"] == "committed"


def test_instruction_names_every_section_in_order() -> None:
    positions = [INSTRUCTION.index(f"## {section}") for section in SECTIONS]
    assert positions == sorted(positions)
    assert "<compacted-summary>" in INSTRUCTION


async def test_failed_summary_leaves_the_surface_untouched_and_cools_down(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    # An answer with nothing usable: the summarizer is alive, this conversation cools down.
    summarizer.failure = "empty"
    job = job_for(conversation, long_conversation(), summarizer)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert not relief.compacted
    assert relief.surface.messages == job.view.head + job.view.body
    state = await store.load(conversation)
    assert state.records == () and state.generation == 0 and state.lease_owner is None
    assert state.attributes.compaction_failed_at is not None
    end = (await log_of(store, conversation))[-1]
    assert (end["type"], end["error"], end["detail"]) == (
        "compaction/end",
        "summary_failed",
        "empty",
    )
    # Cooling down: the same conversation does not pay for another summary right away.
    await triggers.relieve_pressure(engine, job, state, LIMITS)
    assert len(summarizer.calls) == 1
    # Grown by more than the growth ratio: it tries again.
    grown = job_for(
        conversation, [*long_conversation(), *agent_turns(4, output="x " * 400)], summarizer
    )
    await triggers.relieve_pressure(engine, grown, await store.load(conversation), LIMITS)
    assert len(summarizer.calls) == 2


async def test_summary_not_smaller_than_its_span_is_rejected(
    store: Store, conversation: str
) -> None:
    engine = engine_on(store)
    summarizer = Summarizer(text="verbose " * 5_000)
    job = job_for(conversation, long_conversation(), summarizer)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert not relief.compacted
    assert (await store.load(conversation)).records == ()
    assert (await log_of(store, conversation))[-1]["error"] == "not_smaller"


def cut_off_renewals(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """The store stops answering renewals (a partition): the lease runs out mid-summary."""

    async def unreachable(*args: Any) -> bool:
        raise StoreUnavailable("renew_lease", "partitioned")

    monkeypatch.setattr(store, "renew_lease", unreachable)


async def test_deeper_checkpoint_committed_meanwhile_makes_ours_changed(
    store: Store, conversation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_off_renewals(store, monkeypatch)
    engine = engine_on(store, lease_ttl_seconds=0.2)
    summarizer = Summarizer()
    job = job_for(conversation, long_conversation(), summarizer)
    view = job.view
    deeper = Checkpoint(
        0,
        len(view.body) - 2,
        view.root,
        view.chain[len(view.body) - 2],
        user("<compacted-summary>other</compacted-summary>"),
        tokens=5,
    )

    async def another_replica_commits() -> None:
        await asyncio.sleep(0.3)  # our lease expires while the summary call is slow
        began = await store.begin_compaction(conversation, "other", 30, {"type": "s"}, 0)
        assert began is BeginResult.BEGUN
        assert await store.commit_compaction(conversation, "other", [], [deeper])

    summarizer.during = another_replica_commits
    state = await store.load(conversation)
    surface = view.surface(state.records)
    result = await engine.summarize_round(job, state, surface, 640, "pressure")
    assert result.outcome is Outcome.CHANGED
    assert (await store.load(conversation)).records == (deeper,)
    assert (await log_of(store, conversation))[-1]["error"] == "changed"


async def test_commit_after_the_lease_expired_fails_cleanly(
    store: Store, conversation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    cut_off_renewals(store, monkeypatch)
    engine = engine_on(store, lease_ttl_seconds=0.1)
    summarizer = Summarizer(delay=0.3)
    job = job_for(conversation, long_conversation(), summarizer)
    state = await store.load(conversation)
    result = await engine.summarize_round(job, state, job.view.surface(()), 640, "pressure")
    assert result.outcome is Outcome.COMMIT_FAILED
    after = await store.load(conversation)
    assert after.records == () and after.generation == 0


async def test_a_slow_summary_keeps_its_lease_by_renewing_it(
    store: Store, conversation: str
) -> None:
    engine = engine_on(store, lease_ttl_seconds=0.2)
    summarizer = Summarizer(delay=0.7)  # more than three lease lifetimes
    job = job_for(conversation, long_conversation(), summarizer)
    state = await store.load(conversation)
    result = await engine.summarize_round(job, state, job.view.surface(()), 640, "pressure")
    assert result.outcome is Outcome.COMMITTED
    assert (await store.load(conversation)).lease_owner is None


async def test_an_unexpected_exception_still_ends_the_attempt_and_frees_the_lease(
    store: Store, conversation: str
) -> None:
    engine = engine_on(store)

    async def broken(request: SummaryRequest) -> Any:
        raise RuntimeError("a bug in a summarizer")

    job = dataclasses.replace(
        job_for(conversation, long_conversation(), Summarizer()), summarize=broken
    )
    state = await store.load(conversation)
    with pytest.raises(RuntimeError):
        await engine.summarize_round(job, state, job.view.surface(()), 640, "pressure")
    after = await store.load(conversation)
    assert after.lease_owner is None and after.records == ()
    end = (await log_of(store, conversation))[-1]
    assert (end["type"], end["error"], end["detail"]) == ("compaction/end", "error", "RuntimeError")


async def test_a_round_cancelled_while_its_failure_is_written_still_frees_the_lease(
    store: Store, conversation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At shutdown a round whose summary just failed is cancelled while its end is being
    written: the end is written again, shielded, so the lease is not left held."""
    engine, summarizer = engine_on(store), Summarizer()
    summarizer.failure = "unreachable"
    job = job_for(conversation, long_conversation(), summarizer)
    writing, end = asyncio.Event(), store.end_compaction
    calls = 0

    async def cut_off_once(*args: Any) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            writing.set()
            await asyncio.sleep(60)  # the write in flight when the round is cancelled
        await end(*args)

    monkeypatch.setattr(store, "end_compaction", cut_off_once)
    state = await store.load(conversation)
    round_ = asyncio.create_task(
        engine.summarize_round(job, state, job.view.surface(()), 640, "precompact")
    )
    await writing.wait()
    round_.cancel()
    with pytest.raises(asyncio.CancelledError):
        await round_
    assert (await store.load(conversation)).lease_owner is None
    last = (await log_of(store, conversation))[-1]
    assert (last["type"], last["detail"]) == ("compaction/end", "CancelledError")


async def test_a_failed_commit_ends_the_attempt_and_frees_the_lease(
    store: Store, conversation: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    engine = engine_on(store)
    job = job_for(conversation, long_conversation(), Summarizer())

    async def refused(*args: Any) -> Any:
        raise StoreUnavailable("commit_compaction", "connection reset")

    monkeypatch.setattr(store, "commit_compaction", refused)
    state = await store.load(conversation)
    with pytest.raises(StoreUnavailable):
        await engine.summarize_round(job, state, job.view.surface(()), 640, "pressure")
    assert (await store.load(conversation)).lease_owner is None
    assert (await log_of(store, conversation))[-1]["error"] == "error"


async def test_ten_concurrent_requests_pay_for_one_summary(store: Store, conversation: str) -> None:
    engine = engine_on(store)
    summarizer = Summarizer(delay=0.2)
    job = job_for(conversation, long_conversation(), summarizer)
    state = await store.load(conversation)
    reliefs = await asyncio.gather(
        *(triggers.relieve_pressure(engine, job, state, LIMITS) for _ in range(10))
    )
    assert len(summarizer.calls) == 1
    assert all(r.measurement.tokens < 3_200 for r in reliefs)
    assert {r.surface.messages[1]["content"] for r in reliefs} == {
        reliefs[0].surface.messages[1]["content"]
    }
    assert await commits(store, conversation) == 1


async def test_first_contact_with_a_huge_history_compacts_progressively(
    store: Store, conversation: str
) -> None:
    engine = engine_on(store, max_rounds=8)
    summarizer = Summarizer()
    history = long_conversation(turns=40)  # several windows long
    job = job_for(conversation, history, summarizer, compaction_retries=0)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert relief.compacted
    assert relief.measurement.tokens < 3_200
    assert len(summarizer.calls) > 1  # more rounds than compaction_retries allows alone
    assert await commits(store, conversation) == len(summarizer.calls)
    # Each later round merged the previous checkpoint: one checkpoint stands in the surface.
    assert [n.kind for n in relief.surface.nodes].count("checkpoint") == 1
    for call in summarizer.calls[1:]:
        assert "<compacted-summary>" in str(call["messages"][1]["content"])
    for call in summarizer.calls:
        tokens = engine.meter.measure_messages("fake-model", call["messages"], call["tools"])
        assert tokens + call["max_tokens"] <= WINDOW


async def test_nothing_compactable_gives_no_range(store: Store, conversation: str) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    messages = [system(), user("x " * 5_000)]
    job = job_for(conversation, messages, summarizer)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert not relief.compacted and summarizer.calls == []


def pruning_job(
    conversation: str, turns: int, summarizer: Summarizer
) -> tuple[CompactionJob, Budgets]:
    """A job whose pruner cuts every observation of ``long_conversation`` to a few lines."""
    job = dataclasses.replace(
        job_for(conversation, long_conversation(turns), summarizer),
        pruner=Pruner(threshold_chars=1_000, head_chars=100, tail_chars=100),
    )
    return job, LIMITS


async def test_a_request_that_waited_on_another_ones_summary_reports_it_compacted(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer(delay=0.3)
    job, limits = pruning_job(conversation, 40, summarizer)  # over the threshold once pruned
    stale = await store.load(conversation)
    first = asyncio.create_task(triggers.relieve_pressure(engine, job, stale, limits))
    while not summarizer.calls:  # the first request holds the lease for its summary call
        await asyncio.sleep(0.01)
    # The second read the state before the first one's prune: its own prune finds the
    # conversation busy, and it waits for the round instead of summarizing again.
    second = await triggers.relieve_pressure(engine, job, stale, limits)
    await first
    assert len(summarizer.calls) == 1
    assert second.compacted
    assert second.measurement.tokens < limits.threshold
    assert "checkpoint" in [node.kind for node in second.surface.nodes]


async def test_a_request_that_waited_on_another_ones_prune_reports_it_pruned(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    job, limits = pruning_job(conversation, 12, summarizer)  # under the threshold once pruned
    stale = await store.load(conversation)
    first = await triggers.relieve_pressure(engine, job, stale, limits)
    assert first.pruned and not first.compacted
    second = await triggers.relieve_pressure(engine, job, stale, limits)
    assert summarizer.calls == []
    assert second.pruned and not second.compacted
    assert second.measurement.tokens == first.measurement.tokens < limits.threshold


async def test_pressure_prunes_old_observations_but_never_the_long_task(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    task = "FACT-1: reproduce the failure below, then fix it.\n" + "traceback line\n" * 150
    messages = [system(), user(task), *long_conversation(12)[2:]]
    job, limits = pruning_job(conversation, 12, summarizer)
    job = dataclasses.replace(job, view=job_for(conversation, messages, summarizer).view)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), limits)
    assert relief.pruned and len(task) > job.pruner.threshold_chars
    assert [n.start for n in relief.surface.nodes if n.kind == "pruned"]  # observations were
    assert 0 not in {n.start for n in relief.surface.nodes if n.kind == "pruned"}
    assert any(n.message.get("content") == task for n in relief.surface.nodes)


# -- masking ---------------------------------------------------------------------------------


def masking_job(
    conversation: str, messages: list[dict[str, Any]], summarizer: Summarizer, keep: int = 3
) -> CompactionJob:
    """A job that masks, on a provider that caches nothing (where masks pay at once: which
    step a caching provider's prices choose is ``cache_prices``' and ``mask_step``'s)."""
    return dataclasses.replace(
        job_for(conversation, messages, summarizer),
        masker=Masker(keep=keep),
        prices=PRESETS["none"],
    )


async def test_pressure_masks_old_observations_before_paying_for_a_summary(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    job = masking_job(conversation, long_conversation(), summarizer)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)

    assert summarizer.calls == [] and not relief.compacted
    floor = job.masker.clear_at_least_for(WINDOW) if job.masker else 0
    assert relief.measurement.tokens <= LIMITS.threshold - floor
    masks = relief.surface.masks
    assert masks and all(isinstance(r, Prune) and r.masked for r in relief.state.records)
    # Outside the retained tail, and never the newest three observations.
    observed = [i for i, m in enumerate(job.view.body) if m["role"] == "tool"]
    assert {m.position for m in masks}.isdisjoint(observed[-3:])
    for mask in masks:
        assert relief.surface.messages[1 + mask.position] == {
            **job.view.body[mask.position],
            "content": mask.content,
        }
        assert "output of bash(command='step" in mask.content
    events = await log_of(store, conversation)
    assert [e["type"] for e in events] == [
        "compaction/start",
        *["mask"] * len(masks),
        "compaction/end",
    ]
    assert events[0]["kind"] == "mask" and events[-1]["outcome"] == "committed"


async def test_on_a_caching_provider_a_mask_that_does_not_pay_gives_way_to_a_summary(
    store: Store, conversation: str
) -> None:
    """The same pressure on Anthropic's terms: the mask would rewrite the cache from its
    oldest cleared output for less than a checkpoint saves, so the checkpoint is taken."""
    engine, summarizer = engine_on(store), Summarizer()
    job = dataclasses.replace(
        masking_job(conversation, long_conversation(), summarizer), prices=PRESETS["anthropic"]
    )
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert summarizer.calls and relief.compacted
    assert not relief.surface.masks


async def test_the_next_request_of_the_branch_sends_the_same_masked_bytes(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    history = long_conversation()
    first = masking_job(conversation, history, summarizer)
    relief = await triggers.relieve_pressure(engine, first, await store.load(conversation), LIMITS)
    later = masking_job(
        conversation, [*history, assistant("Looking."), user("and now?")], summarizer
    )
    state = await store.load(conversation, later.view.chain)
    again = await triggers.relieve_pressure(engine, later, state, LIMITS)
    assert (
        again.surface.messages[: len(relief.surface.messages) - 1] == (relief.surface.messages[:-1])
    )
    assert again.state.generation == relief.state.generation  # nothing new to commit


async def test_a_mask_replaces_the_prune_at_its_position(store: Store, conversation: str) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    job = dataclasses.replace(
        job_for(conversation, long_conversation(), summarizer),
        pruner=Pruner(threshold_chars=1_000, head_chars=400, tail_chars=100),
    )
    state, surface, pruned = await engine.prune(
        job, await store.load(conversation), job.view.surface(()), "pressure"
    )
    assert pruned and not surface.masks
    candidates = mask_candidates(surface.nodes, job.view.body, 10, Masker(keep=0), lambda _: False)
    state, surface, masked = await engine.mask(job, state, surface, candidates, "pressure")
    assert masked
    at = {c.position for c in candidates}
    held = [r for r in state.records if isinstance(r, Prune) and r.position in at]
    assert held and all(r.masked for r in held)  # the prunes there were dropped
    assert {p.position for p in surface.masks} == at


async def test_when_masking_cannot_leave_room_under_the_threshold_a_summary_is_made(
    store: Store, conversation: str
) -> None:
    """Small observations: clearing them all frees less than ``clear_at_least``."""
    engine, summarizer = engine_on(store), Summarizer()
    messages = [system(), user("Fix it."), *agent_turns(30, output="ok " * 80), user("status?")]
    job = masking_job(conversation, messages, summarizer)
    relief = await triggers.relieve_pressure(engine, job, await store.load(conversation), LIMITS)
    assert relief.compacted and len(summarizer.calls) >= 1
    assert not any(isinstance(r, Prune) and r.masked for r in relief.state.records)


async def test_overflow_recovery_masks_before_it_pays_for_a_summary(
    store: Store, conversation: str
) -> None:
    engine, summarizer = engine_on(store), Summarizer()
    job = masking_job(conversation, long_conversation(), summarizer)
    state = await store.load(conversation)
    await triggers.recover_overflow(engine, job, state, LIMITS.threshold)
    after = await store.load(conversation)
    assert summarizer.calls == [] and await commits(store, conversation) == 1
    assert after.records and all(isinstance(r, Prune) and r.masked for r in after.records)
    surface = job.view.surface(after.records)
    assert (await engine.measure(job, after, surface)).tokens < LIMITS.threshold
