"""The background watermark: when a round starts, and with which retain budget (pure)."""

from __future__ import annotations

import pytest

from proxy.compaction.background import precompaction_retain, wants_precompaction
from proxy.config import ConfigError, Policy, load_settings
from proxy.policy import Budgets, budgets


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
    """With a checkpoint on its way, a request waits only in the upper half of the margin."""
    limits = Budgets(window=16_000, threshold=12_800, retain=2_560, precompact=precompact)
    assert limits.must_compact == must_compact
