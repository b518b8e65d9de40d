"""``compaction-proxy eval`` starts every policy from the route the proxy's configuration gives
the model: its policy, its window, and the prices its bill is taken at."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from compaction_proxy.compaction.cache_prices import PRESETS
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import Policy
from compaction_proxy.ops.eval_replay import Replayed, replay_settings
from compaction_proxy.ops.evaluate import DEFAULT_WINDOW, starting_route

CONFIG = """
routes:
  - model: "house-*"
    base_url: http://127.0.0.1:9/v1
    context_window: 20000
    policy:
      threshold_ratio: 0.6
      pricing: {preset: deepseek}
    models:
      house-small: {context_window: 12000, masking: {keep: 5}}
"""


def arguments(config: Path, model: str, **given: object) -> argparse.Namespace:
    values: dict[str, object] = {"window": None, "preset": None, "api": "openai"}
    return argparse.Namespace(config=str(config), model=model, **{**values, **given})


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(CONFIG)
    return path


def test_the_configured_route_gives_the_policy_window_and_prices(config: Path) -> None:
    replayed = starting_route(arguments(config, "house-large"))
    assert replayed.window == 20_000 and replayed.policy.threshold_ratio == 0.6
    settings, prices = replay_settings(replayed, {}, "http://127.0.0.1:9/v1")
    assert prices == PRESETS["deepseek"]
    assert settings.routes[0].context_window == 20_000


def test_a_models_own_overrides_and_window_are_the_start(config: Path) -> None:
    replayed = starting_route(arguments(config, "house-small"))
    assert replayed.window == 12_000
    assert replayed.policy.masking.keep == 5 and replayed.policy.threshold_ratio == 0.6


def test_a_policy_overrides_the_start_and_its_pricing_bills_it(config: Path) -> None:
    replayed = starting_route(arguments(config, "house-large"))
    overrides = {"masking": {"enabled": False}, "pricing": {"preset": "none"}}
    settings, prices = replay_settings(replayed, overrides, "http://127.0.0.1:9/v1")
    assert prices == PRESETS["none"]
    policy = settings.routes[0].policy
    assert policy.masking is not None and policy.masking.enabled is False


def test_the_command_line_wins_over_the_route(config: Path) -> None:
    replayed = starting_route(arguments(config, "house-large", window=9000, preset="anthropic"))
    assert replayed.window == 9000
    assert (
        replay_settings(replayed, {"pricing": {"preset": "none"}}, "http://h/v1")[1]
        == (PRESETS["anthropic"])
    )


@pytest.mark.parametrize(
    ("family", "model", "preset"),
    [
        (ApiFamily.OPENAI, "gpt-5-mini", "openai"),
        (ApiFamily.OPENAI, "gpt-5.6-mini", "openai-5.6"),
        (ApiFamily.ANTHROPIC, "claude-sonnet-5", "anthropic"),
    ],
)
def test_without_a_route_the_defaults_bill_the_askings_provider_and_model(
    family: ApiFamily, model: str, preset: str
) -> None:
    replayed = Replayed(Policy(), DEFAULT_WINDOW, family, model=model)
    assert replay_settings(replayed, {}, "http://h/v1")[1] == PRESETS[preset]
