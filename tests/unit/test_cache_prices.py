"""What a step costs on each provider's terms (``compaction.cache_prices``), and the budgets
of a soft target (``model_policy.budgets``): pure tables."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.cache_prices import (
    PRESETS,
    StepPrice,
    bills_cache_writes,
    cache_prices,
    is_warm,
    net_value,
    once,
    pays,
    turns_ahead,
)
from compaction_proxy.compaction.model_policy import budgets
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import Policy, PricingPolicy

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

# Clearing 3,000 tokens of observations 20,000 tokens deep: only the prefix before it is read.
DEEP_MASK = StepPrice(saved=3_000, rewritten=20_000)
# Clearing 8,000 tokens whose rewrite is the 2,000 tokens of the newest turns.
SHALLOW_MASK = StepPrice(saved=8_000, rewritten=2_000)
# Summarizing a 20,000-token span into 1,500, with 2,000 tokens of retained tail after it.
CHECKPOINT = StepPrice(
    saved=18_500, rewritten=3_500, call_read=22_000, call_written=100, call_output=1_500
)


@pytest.mark.parametrize(
    ("preset", "step", "turns", "expected"),
    [
        # A deep mask rewrites more than it saves on every caching provider...
        ("anthropic", DEEP_MASK, 30, False),
        ("openai", DEEP_MASK, 30, False),
        ("deepseek", DEEP_MASK, 10, False),
        # ... and pays at once on a provider that caches nothing.
        ("none", DEEP_MASK, 1, True),
        # A shallow mask pays within a few turns.
        ("anthropic", SHALLOW_MASK, 3, True),
        ("anthropic", SHALLOW_MASK, 2, False),
        ("openai", SHALLOW_MASK, 3, True),
        # A checkpoint pays back its summary call and rewrite over enough turns.
        ("anthropic", CHECKPOINT, 10, True),
        ("anthropic", CHECKPOINT, 5, False),
        ("openai", CHECKPOINT, 5, False),
        ("openai", CHECKPOINT, 10, True),
        ("deepseek", CHECKPOINT, 4, True),
        ("deepseek", CHECKPOINT, 3, False),
        ("none", CHECKPOINT, 1, False),
        ("none", CHECKPOINT, 2, True),
    ],
)
def test_a_step_pays_only_when_its_savings_over_the_turns_ahead_exceed_its_cost(
    preset: str, step: StepPrice, turns: int, expected: bool
) -> None:
    assert pays(PRESETS[preset], step, turns) is expected


def test_a_cold_cache_makes_a_rewrite_free_but_not_the_summary_call() -> None:
    prices = PRESETS["anthropic"]
    assert once(prices, DEEP_MASK, warm=False) == 0
    assert once(prices, CHECKPOINT, warm=False) == pytest.approx(
        22_000 * 0.1 + 100 * 1.25 + 1_500 * 5.0
    )
    assert pays(prices, DEEP_MASK, 1, warm=False)


def test_a_step_that_saves_nothing_never_pays() -> None:
    for prices in PRESETS.values():
        assert not pays(prices, StepPrice(saved=0, rewritten=0), 1_000)


@given(
    saved=st.integers(0, 100_000),
    rewritten=st.integers(0, 200_000),
    call_read=st.integers(0, 200_000),
    turns=st.integers(1, 500),
    preset=st.sampled_from(sorted(PRESETS)),
)
def test_more_turns_ahead_never_make_a_paying_step_stop_paying(
    saved: int, rewritten: int, call_read: int, turns: int, preset: str
) -> None:
    step = StepPrice(saved=saved, rewritten=rewritten, call_read=call_read)
    prices = PRESETS[preset]
    assert net_value(prices, step, turns + 1) >= net_value(prices, step, turns)
    if pays(prices, step, turns):
        assert pays(prices, step, turns + 1)


@pytest.mark.parametrize(
    ("turns_so_far", "room", "growth", "expected"),
    [
        (40, 100_000, 1_000.0, 40),  # as many as it has had...
        (40, 10_000, 1_000.0, 10),  # ... while the saving lasts
        (40, -5_000, 1_000.0, 1),  # at least the next request
        (0, 10_000, 1_000.0, 1),
        (12, 10_000, 0.0, 12),
    ],
)
def test_the_turns_ahead_are_the_turns_so_far_while_the_saving_lasts(
    turns_so_far: int, room: int, growth: float, expected: int
) -> None:
    assert turns_ahead(turns_so_far, room, growth) == expected


def test_the_cache_is_warm_only_within_its_lifetime() -> None:
    anthropic = PRESETS["anthropic"]
    assert is_warm(anthropic, None, 1_000.0)
    assert is_warm(anthropic, 1_000.0 - 299, 1_000.0)
    assert not is_warm(anthropic, 1_000.0 - 301, 1_000.0)
    assert not is_warm(PRESETS["none"], 1_000.0, 1_000.0)


def test_auto_prices_follow_the_wire_format_and_figures_override_the_preset() -> None:
    assert cache_prices(PricingPolicy(), ApiFamily.ANTHROPIC) == PRESETS["anthropic"]
    assert cache_prices(PricingPolicy(), ApiFamily.OPENAI) == PRESETS["openai"]
    custom = cache_prices(PricingPolicy(preset="openai", cache_read=0.5), ApiFamily.ANTHROPIC)
    assert (custom.read, custom.write) == (0.5, PRESETS["openai"].write)
    assert cache_prices(PricingPolicy(preset="none"), ApiFamily.ANTHROPIC).caches is False


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("gpt-5.6", True),
        ("gpt-5.6-mini", True),
        ("gpt-5.6-codex", True),
        ("gpt-5.6-2026-06-27", True),
        ("GPT-5.7", True),
        ("gpt-5.10", True),
        ("gpt-6", True),
        ("gpt-6.1-nano", True),
        ("openai/gpt-5.6", True),
        ("gpt-5.5", False),
        ("gpt-5", False),
        ("gpt-5-mini", False),
        ("gpt-4.1", False),
        ("gpt-4o", False),
        ("o3", False),
        ("gpt-oss-120b", False),
        ("ft:gpt-4o-mini:acme::x1", False),
        ("claude-sonnet-5", False),
        ("my-gpt-5.6", False),
        ("", False),
    ],
)
def test_cache_writes_are_billed_from_openais_gpt_5_6_family_on(model: str, expected: bool) -> None:
    assert bills_cache_writes(model) is expected


def test_auto_prices_an_openai_model_on_its_familys_terms() -> None:
    """From GPT-5.6 on OpenAI bills a cache write at 1.25x and keeps entries 30 minutes: a
    step's rewrite is dearer, and a conversation idle for ten minutes is still cached."""
    later = cache_prices(PricingPolicy(), ApiFamily.OPENAI, "gpt-5.6-mini")
    assert later == PRESETS["openai-5.6"] and (later.write, later.lifetime_seconds) == (1.25, 1800)
    assert cache_prices(PricingPolicy(), ApiFamily.OPENAI, "gpt-5.5") == PRESETS["openai"]
    assert cache_prices(PricingPolicy(preset="openai"), ApiFamily.OPENAI, "gpt-6").write == 1.0
    assert is_warm(later, 1_000.0 - 600, 1_000.0)
    assert not is_warm(PRESETS["openai"], 1_000.0 - 600, 1_000.0)
    # 8,000 tokens saved, 2,200 written again: paid back in three turns at a write's plain
    # price (1,980 units), not at a quarter more (2,530).
    mask = StepPrice(saved=8_000, rewritten=2_200)
    assert pays(PRESETS["openai"], mask, 3) and not pays(later, mask, 3)


def test_a_soft_target_sets_the_watermarks_and_prices_what_lies_between_it_and_the_window() -> None:
    limits = budgets(Policy(target_tokens=32_000), 128_000)
    assert (limits.threshold, limits.precompact, limits.retain) == (25_600, 22_400, 3_200)
    assert limits.priced_below == 89_600  # the window's own precompaction watermark
    assert limits.priced(22_400) and limits.priced(89_599) and not limits.priced(89_600)
    # Knowing nothing of the answer, the window's own margin is halved for it, not the target's.
    assert limits.must_compact == 128_000 - (128_000 - 102_400) // 2


@pytest.mark.parametrize(
    ("policy", "window"),
    [
        (Policy(), 128_000),  # no target
        (Policy(target_tokens=200_000), 128_000),  # a target above the window is the window
    ],
)
def test_without_a_soft_zone_no_checkpoint_is_a_choice(policy: Policy, window: int) -> None:
    limits = budgets(policy, window)
    assert limits.priced_below == 0 and not limits.priced(1)


def test_with_no_background_rounds_a_soft_target_is_priced_to_the_windows_threshold() -> None:
    # Precompaction off, or a client that compacts on its own: between the target's threshold
    # and the window's a checkpoint is still a choice, made on the request if it pays.
    off = budgets(Policy(target_tokens=32_000, precompact_ratio=0), 128_000)
    on = budgets(Policy(target_tokens=32_000), 128_000).without_precompaction()
    for limits in (off, on):
        assert (limits.threshold, limits.precompact) == (25_600, 0)
        assert limits.priced_below == limits.window_threshold == 102_400
        assert limits.priced(25_600) and limits.priced(102_399) and not limits.priced(102_400)
    assert budgets(Policy(), 128_000).without_precompaction().priced_below == 0
