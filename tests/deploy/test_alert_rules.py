"""The alerting rules (``charts/compaction-proxy/alerts``), checked by Prometheus's own
``promtool``: each alert fires on the series of its fault, not before its ``for`` has passed,
with annotations that name only labels it carries; none fires on a healthy proxy's series.
What the rules query is what the proxy exports, and the manual explains every alert.

``promtool`` ships with Debian's ``prometheus`` (``.ci/run`` installs it); without it those
checks skip, the others run.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.prometheus_server import (
    ALERT_RULES,
    GROUPING,
    SELECTOR,
    alert_rules,
    exported_labels,
)

ROOT = Path(__file__).parents[2]
PACKAGE = ROOT / "compaction_proxy"
INSTANCE = {"instance": "proxy-0:8080", "job": "compaction-proxy"}


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    """An input series of a promtool test: ``name`` with ``labels`` and the instance's."""
    every = {**INSTANCE, **labels}
    matchers = ", ".join(f'{key}="{value}"' for key, value in sorted(every.items()))
    return {"series": f"{name}{{{matchers}}}", "values": values}


@dataclass(frozen=True)
class Fault:
    """The series of one fault over ``minutes``, the alert they must fire at the end with its
    labels (the severity aside), and the series a healthy proxy shows instead."""

    alert: str
    minutes: int
    faulty: tuple[dict[str, str], ...]
    fired_with: dict[str, str]


FAULTS = (
    Fault(
        "CompactionProxyStoreUnavailable",
        10,
        (series("compaction_proxy_store_circuit_open", "1x10"),),
        INSTANCE,
    ),
    Fault(
        "CompactionProxySummarizerDown",
        20,
        (series("compaction_proxy_summary_breaker_open", "1x20", summarizer="gpt-4o-mini"),),
        {**INSTANCE, "summarizer": "gpt-4o-mini"},
    ),
    Fault(
        "CompactionProxyRequestsBypassed",
        10,
        (
            series(
                "compaction_proxy_bypassed_requests_total", "0+1x10", route="gpt-*", cause="error"
            ),
            # The store's bypasses are the store alert's, not a fault in the proxy.
            series("compaction_proxy_bypassed_requests_total", "0+5x10", route="o*", cause="store"),
        ),
        {"route": "gpt-*"},
    ),
    Fault(
        "CompactionProxyCompactionErrors",
        10,
        (series("compaction_proxy_compaction_errors_total", "0+1x10"),),
        {},
    ),
    Fault(
        "CompactionProxyOverflowsReachClients",
        40,
        (
            series("compaction_proxy_overflow_recoveries_total", "0+2x40", result="passed_through"),
            series("compaction_proxy_requests_total", "0+60x40", route="gpt-*", outcome="ok"),
        ),
        {},
    ),
    Fault(
        "CompactionProxyUpstreamUnreachable",
        20,
        (
            series(
                "compaction_proxy_requests_total",
                "0+10x20",
                route="gpt-*",
                outcome="upstream_unavailable",
            ),
            series("compaction_proxy_requests_total", "0+50x20", route="gpt-*", outcome="ok"),
        ),
        {"route": "gpt-*"},
    ),
    Fault(
        "CompactionProxySlow",
        30,
        (
            series("compaction_proxy_overhead_seconds_bucket", "0x30", route="gpt-*", le="0.05"),
            series("compaction_proxy_overhead_seconds_bucket", "0+2x30", route="gpt-*", le="0.1"),
            series("compaction_proxy_overhead_seconds_bucket", "0+10x30", route="gpt-*", le="0.25"),
            series("compaction_proxy_overhead_seconds_bucket", "0+10x30", route="gpt-*", le="+Inf"),
            series("compaction_proxy_overhead_seconds_count", "0+10x30", route="gpt-*"),
        ),
        {"route": "gpt-*"},
    ),
    Fault(
        "CompactionProxyMeterUndercounts",
        150,
        (
            series("compaction_proxy_meter_error_ratio_bucket", "0+5x150", le="-0.1"),
            series("compaction_proxy_meter_error_ratio_count", "0+10x150"),
        ),
        {},
    ),
    Fault(
        "CompactionProxySummaryCeilingReached",
        10,
        (
            series("compaction_proxy_guard_trips_total", "0+1x10", guard="tenant_ceiling"),
            series("compaction_proxy_guard_trips_total", "0+1x10", guard="miss_guard"),
        ),
        {"guard": "tenant_ceiling"},
    ),
    Fault(
        "CompactionProxyUnreadableStoredData",
        10,
        (series("compaction_proxy_unreadable_records_total", "0 0 0 1 1 1 1 1 1 1 1"),),
        INSTANCE,
    ),
)

# What a healthy proxy shows of the same metrics for three hours: no alert may fire on it.
HEALTHY = (
    series("compaction_proxy_store_circuit_open", "0x180"),
    series("compaction_proxy_summary_breaker_open", "0x180", summarizer="gpt-4o-mini"),
    series("compaction_proxy_bypassed_requests_total", "0x180", route="gpt-*", cause="error"),
    series("compaction_proxy_bypassed_requests_total", "0x180", route="gpt-*", cause="store"),
    series("compaction_proxy_compaction_errors_total", "0x180"),
    series("compaction_proxy_overflow_recoveries_total", "0+1x180", result="retried"),
    series("compaction_proxy_overflow_recoveries_total", "0x180", result="passed_through"),
    series("compaction_proxy_requests_total", "0+60x180", route="gpt-*", outcome="ok"),
    series("compaction_proxy_requests_total", "0+1x180", route="gpt-*", outcome="upstream_error"),
    series("compaction_proxy_overhead_seconds_bucket", "0+55x180", route="gpt-*", le="0.005"),
    series("compaction_proxy_overhead_seconds_bucket", "0+59x180", route="gpt-*", le="0.1"),
    series("compaction_proxy_overhead_seconds_bucket", "0+60x180", route="gpt-*", le="+Inf"),
    series("compaction_proxy_overhead_seconds_count", "0+60x180", route="gpt-*"),
    # A route with a request a minute, each waiting for its summary: slow, but not the proxy.
    series("compaction_proxy_overhead_seconds_bucket", "0x180", route="batch-*", le="0.1"),
    series("compaction_proxy_overhead_seconds_bucket", "0x180", route="batch-*", le="1"),
    series("compaction_proxy_overhead_seconds_bucket", "0+1x180", route="batch-*", le="+Inf"),
    series("compaction_proxy_overhead_seconds_count", "0+1x180", route="batch-*"),
    series("compaction_proxy_meter_error_ratio_bucket", "0+1x180", le="-0.1"),
    series("compaction_proxy_meter_error_ratio_count", "0+40x180"),
    series("compaction_proxy_guard_trips_total", "0+1x180", guard="miss_guard"),
    series("compaction_proxy_unreadable_records_total", "0x180"),
    series("compaction_proxy_unreadable_state_fields_total", "0x180", field="generation"),
)

TEMPLATED_LABEL = re.compile(r"\{\{\s*\$labels\.([a-z_]+)\s*\}\}")


def rendered(text: str, labels: dict[str, str]) -> str:
    """An annotation as Prometheus renders it for an alert with ``labels``; a label the alert
    does not carry fails the test (Prometheus would render it empty)."""

    def label(match: re.Match[str]) -> str:
        name = match.group(1)
        assert name in labels, f"the annotation names {name}, which the alert does not carry"
        return labels[name]

    return TEMPLATED_LABEL.sub(label, text)


def duration_minutes(text: str) -> int:
    amount, unit = int(text[:-1]), text[-1]
    return amount * {"s": 0, "m": 1, "h": 60}[unit]


def promtool_tests() -> list[dict[str, Any]]:
    """A promtool test per fault (fired at its end, not yet a minute before its ``for`` has
    passed since the series began) and one of the healthy series (no alert at any time)."""
    by_name = {rule["alert"]: rule for rule in alert_rules()}
    tests = []
    for fault in FAULTS:
        rule = by_name[fault.alert]
        labels = {"alertname": fault.alert, **fault.fired_with, **rule["labels"]}
        expected = {
            "exp_labels": {k: v for k, v in labels.items() if k != "alertname"},
            "exp_annotations": {k: rendered(v, labels) for k, v in rule["annotations"].items()},
        }
        checks = [
            {"eval_time": f"{fault.minutes}m", "alertname": fault.alert, "exp_alerts": [expected]}
        ]
        waits = duration_minutes(rule.get("for", "0m"))
        if waits > 1:
            checks.append(
                {"eval_time": f"{waits - 1}m", "alertname": fault.alert, "exp_alerts": []}
            )
        tests.append(
            {"interval": "1m", "input_series": list(fault.faulty), "alert_rule_test": checks}
        )
    quiet = [
        {"eval_time": f"{minutes}m", "alertname": rule["alert"], "exp_alerts": []}
        for rule in alert_rules()
        for minutes in (30, 90, 180)
    ]
    tests.append({"interval": "1m", "input_series": list(HEALTHY), "alert_rule_test": quiet})
    return tests


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.skip("promtool is not installed (Debian's prometheus has it; .ci/run installs it)")
    return found


def test_promtool_finds_the_rules_well_formed() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(ALERT_RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_alert_fires_on_its_fault_alone_and_none_on_a_healthy_proxy(tmp_path: Path) -> None:
    binary = promtool()
    suite = tmp_path / "alerts.test.yml"
    suite.write_text(
        yaml.safe_dump(
            {
                "rule_files": [str(ALERT_RULES)],
                "evaluation_interval": "1m",
                "tests": promtool_tests(),
            }
        )
    )
    done = subprocess.run([binary, "test", "rules", str(suite)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_fault_a_severity_and_its_words() -> None:
    names = [rule["alert"] for rule in alert_rules()]
    assert len(names) == len(set(names))
    assert sorted(names) == sorted(fault.alert for fault in FAULTS)
    for rule in alert_rules():
        assert rule["labels"]["severity"] in ("warning", "info"), rule["alert"]
        assert set(rule["annotations"]) == {"summary", "description"}, rule["alert"]


def test_rules_query_only_what_the_proxy_exports_as_it_names_it() -> None:
    """Every metric and label a rule names is exported, and each label value a rule matches
    is one the package's code writes (a value the proxy never emits would match nothing)."""
    exported = exported_labels()
    source = "\n".join(path.read_text() for path in PACKAGE.rglob("*.py"))
    for rule in alert_rules():
        expr = rule["expr"]
        used = SELECTOR.findall(expr)
        assert used, rule["alert"]
        for name, matchers in used:
            assert name in exported, (rule["alert"], name)
            for label, value in re.findall(r'([a-z_]+)=~?"([^"]*)"', matchers):
                assert label in exported[name], (rule["alert"], name, label)
                if label == "le":
                    continue
                for alternative in value.split("|"):
                    assert f'"{alternative}"' in source, (rule["alert"], label, alternative)
        for grouping in GROUPING.findall(expr):
            names = {label.strip() for label in grouping.split(",")}
            assert all(names <= exported[n] for n, _ in used), (rule["alert"], expr)


def test_the_manual_explains_every_alert() -> None:
    manual = (ROOT / "docs" / "operating.md").read_text()
    section = manual[manual.index("## Alerts") :]
    for rule in alert_rules():
        assert f"`{rule['alert']}`" in section, rule["alert"]
