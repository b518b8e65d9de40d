"""Configuration loading, validation and policy resolution."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from compaction_proxy.compaction.model_policy import Budgets, budgets
from compaction_proxy.config.policy import configured_window, resolve_policy, route_for
from compaction_proxy.config.settings import ConfigError, load_settings, redacted_url
from compaction_proxy.ops.app import create_app
from compaction_proxy.ops.cli import main, resolved_routes, start_up_line

REPO_CONFIG = Path(__file__).parents[2] / "config" / "proxy.yaml"


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "proxy.yaml"
    path.write_text(text)
    return path


def test_shipped_config_holds_the_design_defaults() -> None:
    settings = load_settings(REPO_CONFIG)
    policy = settings.policy
    assert (policy.threshold_ratio, policy.retain_ratio, policy.max_tokens) == (0.8, 0.10, 8192)
    assert (policy.compaction_retries, policy.max_overflow_retries, policy.auto) == (1, 1, True)
    pruner = policy.pruner
    assert (pruner.threshold_chars, pruner.head_chars, pruner.tail_chars) == (8192, 4096, 1024)
    assert settings.store_url == "memory://"
    assert settings.max_body_bytes == 32 * 1024 * 1024


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("colour: blue\n", "colour: unknown key"),
        ("policy:\n  threshold: 0.5\n", "policy.threshold: unknown key"),
        ("policy:\n  retain_ratio: 0.9\n", "retain_ratio (0.9) must be below threshold_ratio"),
        ("policy:\n  retain_ratio: 0.1\n  retain_tokens: 100\n", "either retain_ratio or"),
        ("routes:\n  - model: x\n    base_url: not a url\n", "routes.0.base_url"),
        (
            "routes:\n  - model: x\n    base_url: http://h/v1\n    bogus: 1\n",
            "routes.0.bogus: unknown key",
        ),
        ("policy:\n  pruner:\n    head_chars: 9000\n", "head_chars + tail_chars"),
        # The bridge cuts harder than the pruner, or it would not be worth a cut.
        ("policy:\n  pruner:\n    bridge_head_chars: 5000\n", "bridge_head_chars"),
        ("store_url: mysql://h\n", "store_url"),
    ],
)
def test_invalid_config_fails_naming_the_key(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, text))
    assert named in str(caught.value)


def test_invalid_model_override_names_key_and_model(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "routes:\n  - model: 'gpt-*'\n    base_url: http://h/v1\n"
        "    models:\n      gpt-small:\n        threshold_ratio: 0.1\n",
    )
    with pytest.raises(ConfigError) as caught:
        resolved_routes(load_settings(path))
    assert "gpt-small" in str(caught.value)
    assert "retain_ratio" in str(caught.value)


def test_environment_overrides_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, "port: 9000\npolicy:\n  threshold_ratio: 0.9\n  max_tokens: 100\n")
    monkeypatch.setenv("COMPACTION_PROXY_PORT", "9100")
    monkeypatch.setenv("COMPACTION_PROXY_POLICY__THRESHOLD_RATIO", "0.7")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://upstream.internal:8000/v1")
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/1")
    settings = load_settings(path)
    assert settings.port == 9100
    assert settings.policy.threshold_ratio == 0.7
    assert settings.policy.max_tokens == 100
    assert settings.default_route.base == "http://upstream.internal:8000/v1"
    assert settings.store_url == "redis://cache:6379/1"


ROUTES = """
policy:
  threshold_ratio: 0.8
routes:
  - model: "gpt-4o*"
    base_url: http://openai.example/v1
    api_key_env: OPENAI_KEY
    context_window: 128000
    policy:
      threshold_ratio: 0.7
    models:
      gpt-4o-mini:
        context_window: 64000
        retain_tokens: 5000
  - model: "llama-3"
    base_url: http://vllm.example:8000/v1
"""


@pytest.mark.parametrize(
    ("model", "base"),
    [
        ("gpt-4o", "http://openai.example/v1"),
        ("gpt-4o-mini", "http://openai.example/v1"),
        ("llama-3", "http://vllm.example:8000/v1"),
        ("llama-3.1", "https://api.openai.com/v1"),
    ],
)
def test_first_matching_route_wins_else_the_default(tmp_path: Path, model: str, base: str) -> None:
    assert route_for(load_settings(write(tmp_path, ROUTES)), model).base == base


def test_policy_layers_defaults_route_then_exact_model(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, ROUTES))
    route = route_for(settings, "gpt-4o-mini")
    broad = resolve_policy(settings, route, "gpt-4o")
    exact = resolve_policy(settings, route, "gpt-4o-mini")
    assert (broad.threshold_ratio, broad.retain_ratio, broad.retain_tokens) == (0.7, 0.10, None)
    assert (exact.threshold_ratio, exact.retain_ratio, exact.retain_tokens) == (0.7, None, 5000)
    assert configured_window(route, "gpt-4o") == 128000
    assert configured_window(route, "gpt-4o-mini") == 64000


@pytest.mark.parametrize(
    ("ratios", "window", "expected"),
    [
        ((0.8, 0.16, None), 16_000, (12_800, 2_560)),
        ((0.8, 0.16, None), 16_385, (13_108, 2_621)),
        ((0.8, None, 3_000), 10_000, (8_000, 3_000)),
    ],
)
def test_budgets_are_floored_shares_of_the_window(
    ratios: tuple[float, float | None, int | None], window: int, expected: tuple[int, int]
) -> None:
    from compaction_proxy.config.settings import Policy

    threshold, retain_ratio, retain_tokens = ratios
    policy = Policy(
        threshold_ratio=threshold, retain_ratio=retain_ratio, retain_tokens=retain_tokens
    )
    result = budgets(policy, window)
    assert (result.threshold, result.retain) == expected


@pytest.mark.parametrize("reserve", [None, 0, 1_000, 6_000])
def test_an_answer_reserve_changes_the_budgets_in_that_field_alone(reserve: int | None) -> None:
    every_field_set = Budgets(
        window=100_000,
        threshold=80_000,
        retain=16_000,
        precompact=70_000,
        answer_reserve=3_000,
        priced_below=60_000,
        window_threshold=85_000,
    )
    expected = dataclasses.replace(every_field_set, answer_reserve=reserve)
    assert every_field_set.with_answer_reserve(reserve) == expected


def test_check_config_prints_each_route_policy_and_key_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_KEY", "sk-route-secret")
    assert main(["check-config", str(write(tmp_path, ROUTES))]) == 0
    out = capsys.readouterr().out
    assert "gpt-4o-mini" in out and "retain_tokens: 5000" in out and "llama-3" in out
    assert "key_source: route (OPENAI_KEY)" in out and "key_source: client" in out
    assert "sk-route-secret" not in out


@pytest.mark.parametrize("value", [None, "", "  "])
def test_a_route_key_variable_that_is_unset_or_empty_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    value: str | None,
) -> None:
    """Otherwise the client's own key would quietly go to that route's host."""
    if value is not None:
        monkeypatch.setenv("OPENAI_KEY", value)
    assert main(["check-config", str(write(tmp_path, ROUTES))]) == 1
    assert "routes[0].api_key_env: names OPENAI_KEY, which is unset" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="OPENAI_KEY"):
        create_app(load_settings(write(tmp_path, ROUTES)))


SUMMARY_ELSEWHERE = """
policy:
  summary_model: cheap-summarizer
routes:
  - model: cheap-summarizer
    base_url: http://summaries.example/v1
"""


def test_a_summary_model_on_another_host_without_its_own_key_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match=r"summary_model cheap-summarizer.*another host"):
        create_app(load_settings(write(tmp_path, SUMMARY_ELSEWHERE)))
    keyed = SUMMARY_ELSEWHERE + "    api_key_env: SUMMARY_KEY\n"
    monkeypatch.setenv("SUMMARY_KEY", "sk-summaries")
    client_keys = {"client_key_digests": ["0" * 64]}  # the proxy now holds a key
    create_app(load_settings(write(tmp_path, keyed), **client_keys))


@pytest.mark.parametrize("name", ["TENANT_SECRET", "ADMIN_TOKEN"])
@pytest.mark.parametrize("value", ["", "   "])
def test_an_empty_secret_setting_means_unset(
    monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(f"COMPACTION_PROXY_{name}", value)
    settings = load_settings(None)
    assert getattr(settings, name.lower()) is None


def test_a_short_admin_token_refuses_to_start_naming_the_setting() -> None:
    with pytest.raises(ConfigError, match=r"admin_token: .*at least 16 characters"):
        load_settings(None, admin_token="short-token")
    assert load_settings(None, admin_token="x" * 16).admin_token is not None


def test_check_config_rejects_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["check-config", str(write(tmp_path, "routes: 3\n"))]) == 2
    assert "routes" in capsys.readouterr().err


def test_an_unknown_setting_variable_is_named_by_check_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from compaction_proxy.config.settings import unknown_environment

    monkeypatch.setenv("COMPACTION_PROXY_TRESHOLD_RATIO", "0.5")  # misspelled
    monkeypatch.setenv("COMPACTION_PROXY_POLICY__THRESHOLD_RATIO", "0.5")  # nested: known
    monkeypatch.setenv("COMPACTION_PROXY_ADMIN_URL", "http://127.0.0.1:8080")  # the admin CLI's
    assert main(["check-config", str(write(tmp_path, "port: 8081\n"))]) == 0
    captured = capsys.readouterr()
    assert "warning: COMPACTION_PROXY_TRESHOLD_RATIO names no setting" in captured.err
    assert "POLICY__THRESHOLD_RATIO" not in captured.err and "ADMIN_URL" not in captured.err
    assert f"config_file: {tmp_path}" in captured.out
    assert unknown_environment({"COMPACTION_PROXY_PORT": "1", "OTHER": "x"}) == []


def test_version_is_printed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("compaction-proxy ")


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("port: 8080\nhost: h\nstore_url: mysql://h\n", "proxy.yaml:3)"),
        (
            "routes:\n  - model: x\n    base_url: http://h/v1\n    bogus: 1\n",
            "proxy.yaml:4)",
        ),
        ("policy:\n  pruner:\n\n    head_chars: x\n", "proxy.yaml:4)"),
    ],
)
def test_an_invalid_value_in_the_file_names_its_line(tmp_path: Path, text: str, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_settings(write(tmp_path, text))


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("COMPACTION_PROXY_PORT", "abc"),
        ("REDIS_URL", "redis://localhost:abc/0"),
        ("COMPACTION_PROXY_POLICY__THRESHOLD_RATIO", "3"),
    ],
)
def test_an_invalid_environment_variable_is_named_not_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings(write(tmp_path, "port: 8080\n"))
    assert f"(environment variable {variable})" in str(caught.value)
    assert "proxy.yaml" not in str(caught.value)


def test_a_yaml_syntax_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"proxy\.yaml:2:6: invalid YAML"):
        load_settings(write(tmp_path, "port: 80\n  bad: [\n"))


@pytest.mark.parametrize(
    ("url", "problem"),
    [("redis://localhost:abc/0", "port is not a number"), ("redis:///0", "names no host")],
)
def test_a_malformed_redis_url_is_refused_at_start(tmp_path: Path, url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        load_settings(write(tmp_path, f"store_url: '{url}'\n"))


def test_a_password_never_reaches_a_report() -> None:
    assert redacted_url("redis://user:s3cret@h:6379/0") == "redis://user:***@h:6379/0"
    assert redacted_url("redis://h:6379/0") == "redis://h:6379/0"


def test_a_configuration_several_replicas_share_refuses_the_in_process_store(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Set by the Helm chart with several pods: each would otherwise hold its own part of every
    conversation, silently."""
    monkeypatch.setenv("COMPACTION_PROXY_REQUIRE_SHARED_STORE", "true")
    monkeypatch.delenv("REDIS_URL", raising=False)
    with pytest.raises(ConfigError, match="require_shared_store"):
        load_settings(None)
    monkeypatch.setenv("REDIS_URL", "redis://cache:6379/0")
    assert load_settings(None).store_url == "redis://cache:6379/0"


def test_the_start_up_line_and_check_config_say_where_anthropic_traffic_goes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COMPACTION_PROXY_ANTHROPIC_BASE_URL", "https://claude.internal/v1")
    assert "Anthropic upstream https://claude.internal/v1" in start_up_line(
        load_settings(None), None
    )
    assert main(["check-config", str(write(tmp_path, "port: 8081\n"))]) == 0
    assert "anthropic_base_url: https://claude.internal/v1" in capsys.readouterr().out


def test_a_models_overrides_read_alike_flat_or_under_policy(tmp_path: Path) -> None:
    """A model override written the way a route's is (under ``policy:``) was refused with
    no hint; both shapes now mean the same."""
    route = "routes:\n  - model: gpt-*\n    base_url: https://x.example/v1\n    models:\n"
    flat = load_settings(write(tmp_path, route + "      gpt-4o: {threshold_ratio: 0.7}\n"))
    nested = load_settings(
        write(tmp_path, route + "      gpt-4o: {policy: {threshold_ratio: 0.7}}\n")
    )
    assert flat.routes[0].models == nested.routes[0].models
    assert nested.routes[0].models["gpt-4o"].threshold_ratio == 0.7
    with pytest.raises(ConfigError, match="threshold_ratio given both"):
        load_settings(
            write(
                tmp_path,
                route + "      gpt-4o: {threshold_ratio: 0.6, policy: {threshold_ratio: 0.7}}\n",
            )
        )
