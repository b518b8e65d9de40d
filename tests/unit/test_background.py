"""The background watermark: when a round starts, with which retain budget, and whether a
tenant may take a slot (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from compaction_proxy.compaction.background import may_take_a_slot
from compaction_proxy.compaction.model_policy import (
    Budgets,
    answer_reserve,
    budgets,
    precompaction_retain,
    wants_precompaction,
)
from compaction_proxy.config.settings import ConfigError, Policy, load_settings


@pytest.mark.parametrize(
    ("policy", "precompact"),
    [
        ({}, 11_200),  # 0.1 below the default 0.8
        ({"precompact_ratio": 0.5}, 8_000),
        ({"precompact_ratio": 0}, 0),
        ({"threshold_ratio": 0.05, "retain_ratio": 0.01}, 0),
    ],
)
def test_the_background_watermark_sits_below_the_threshold(
    policy: dict[str, float], precompact: int
) -> None:
    assert budgets(Policy(**policy), 16_000).precompact == precompact


def test_a_watermark_at_or_above_the_threshold_is_refused() -> None:
    with pytest.raises(ConfigError, match="precompact_ratio"):
        load_settings(None, policy={"threshold_ratio": 0.8, "precompact_ratio": 0.8})


LIMITS = Budgets(window=16_000, threshold=12_800, retain=2_560, precompact=11_200)


@pytest.mark.parametrize(
    ("tokens", "wanted"),
    [
        (11_199, False),
        (11_200, True),
        (12_799, True),
        (12_800, True),
        (14_399, True),
        (14_400, False),
    ],
)
def test_a_round_starts_from_the_watermark_up_to_where_a_request_must_wait(
    tokens: int, wanted: bool
) -> None:
    assert wants_precompaction(tokens, LIMITS) is wanted
    assert not wants_precompaction(tokens, Budgets(16_000, 12_800, 2_560, precompact=0))


@pytest.mark.parametrize(
    ("tokens", "retain"), [(11_200, 960), (12_000, 1_760), (9_000, 0), (13_000, 2_560)]
)
def test_the_span_leaves_room_for_the_growth_before_the_threshold(tokens: int, retain: int) -> None:
    """Used at the threshold, the tail is back to the usual retain budget."""
    assert precompaction_retain(tokens, LIMITS) == retain


@pytest.mark.parametrize(("precompact", "must_compact"), [(11_200, 14_400), (0, 12_800)])
def test_requests_wait_from_the_threshold_only_without_precompaction(
    precompact: int, must_compact: int
) -> None:
    """Knowing nothing of the answer, a request with a checkpoint on its way waits only in the
    upper half of the margin."""
    limits = Budgets(window=16_000, threshold=12_800, retain=2_560, precompact=precompact)
    assert limits.must_compact == must_compact


@pytest.mark.parametrize(
    ("declared", "largest", "reserve"),
    [
        (None, None, None),  # nothing known: must_compact keeps half the margin
        (4_096, None, 4_096),  # the client's cap is what the provider holds the prompt to
        (4_096, 200, 4_096),  # and it wins over what answers looked like
        (None, 200, 500),  # small answers: a 32nd of the window, for the meter's error
        (None, 1_200, 1_500),  # else a quarter more than the largest answer
    ],
)
def test_the_answer_reserve_is_the_declared_cap_else_the_largest_answer_with_headroom(
    declared: int | None, largest: int | None, reserve: int | None
) -> None:
    assert answer_reserve(16_000, declared, largest) == reserve


@pytest.mark.parametrize(
    ("reserve", "must_compact"),
    [(None, 14_400), (500, 15_500), (1_500, 14_500), (8_000, 12_800), (20_000, 12_800)],
)
def test_with_precompaction_a_request_waits_only_where_its_answer_would_not_fit(
    reserve: int | None, must_compact: int
) -> None:
    """``must_compact`` is the window less the answer's reserve, never below the threshold;
    without precompaction it is the threshold whatever the reserve."""
    limits = Budgets(16_000, 12_800, 2_560, precompact=11_200, answer_reserve=reserve)
    assert limits.must_compact == must_compact
    assert dataclasses.replace(limits, precompact=0).must_compact == 12_800


@pytest.mark.parametrize(
    ("cap", "threshold", "precompact", "retain"),
    [
        (None, 51_200, 44_800, 10_240),  # nothing declared: as configured
        (8_000, 51_200, 44_800, 10_240),  # the window less the cap is above the threshold
        (32_000, 32_000, 25_600, 10_240),  # Claude Code's 32k: a 35k prompt would be refused
        (63_000, 8_000, 1_600, 8_000),  # never below an eighth of the window
    ],
)
def test_a_declared_answer_cap_lowers_the_threshold_to_what_the_provider_accepts(
    cap: int | None, threshold: int, precompact: int, retain: int
) -> None:
    configured = Budgets(window=64_000, threshold=51_200, retain=10_240, precompact=44_800)
    lowered = configured.under_declared_cap(cap)
    assert (lowered.threshold, lowered.precompact, lowered.retain) == (
        threshold,
        precompact,
        retain,
    )
    assert configured.threshold == 51_200  # the budgets themselves are left as they were


def test_a_clients_own_compaction_is_compacted_only_to_fit_and_prepares_nothing() -> None:
    limits = Budgets(window=16_000, threshold=12_800, retain=2_560, precompact=11_200)
    own = limits.for_client_compaction()
    assert own.threshold == limits.must_compact > limits.threshold
    assert own.precompact == 0 and own.must_compact == limits.must_compact
    assert not wants_precompaction(limits.precompact, own)


def test_a_client_that_compacts_on_its_own_gets_no_background_round() -> None:
    limits = Budgets(window=16_000, threshold=12_800, retain=2_560, precompact=11_200)
    left_to_it = limits.without_precompaction()
    assert (left_to_it.threshold, left_to_it.precompact) == (limits.threshold, 0)
    assert left_to_it.must_compact == limits.threshold  # from there, synchronously
    assert not wants_precompaction(12_000, left_to_it)


@pytest.mark.parametrize(
    ("held", "running", "concurrency", "may"),
    [
        (0, 0, 8, True),
        (0, 7, 8, True),  # under its share (2 of 8): the last free slot too
        (1, 7, 8, True),
        (0, 8, 8, False),  # none free
        (2, 2, 8, True),  # at its share, 6 free: more than a share stays free
        (5, 5, 8, True),
        (6, 6, 8, False),  # alone, all but one share
        (3, 6, 8, False),
        (0, 0, 1, True),
        (1, 1, 2, False),  # the share is one slot, at least
        (0, 1, 2, True),
        (0, 0, 0, False),  # precompaction without slots
    ],
)
def test_a_tenant_takes_a_slot_under_its_share_or_while_a_share_stays_free(
    held: int, running: int, concurrency: int, may: bool
) -> None:
    assert may_take_a_slot(held, running, concurrency) is may
