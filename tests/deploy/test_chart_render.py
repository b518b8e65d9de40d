"""The Helm chart rendered by Helm's own engine (helm-python-sdk, no binary), every manifest
validated against the Kubernetes schemas."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import orjson
import pytest
import yaml

from compaction_proxy.config.settings import (
    Policy,
    PricePreset,
    PrunerPolicy,
    Route,
    Settings,
)

pytest.importorskip("helm_python")
pytest.importorskip("kubernetes_validate")

import helm_python
import kubernetes_validate
from helm_python import Chart

CHART = Path(__file__).parents[2] / "charts" / "compaction-proxy"
KUBE_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def chart() -> Iterator[Chart]:
    loaded = Chart.load(CHART)
    yield loaded
    loaded.close()


def render(chart: Chart, values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Rendered manifests by template file name, a file's later documents as ``name#2`` and
    on (empty renders left out)."""
    out = chart.render(values, name="cp", namespace="default", is_install=True)
    manifests = {}
    for path, text in out.items():
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        documents = [d for d in yaml.safe_load_all(text) if d]
        for index, document in enumerate(documents, start=1):
            name = Path(path).name
            manifests[name if index == 1 else f"{name}#{index}"] = document
    return manifests


def env_of(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    container = manifests["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item for item in container["env"]}


EVERYTHING_ON: dict[str, Any] = {
    "redis": {"enabled": True},
    "replicaCount": 3,
    "imagePullSecrets": [{"name": "registry"}],
    "serviceAccount": {"create": True, "name": "proxy", "annotations": {"team": "llm"}},
    "podAnnotations": {"example.com/a": "b"},
    "podLabels": {"tier": "gateway"},
    "secrets": {"existingSecret": "operator-secrets"},
    "upstreamKeys": [{"env": "OPENAI_API_KEY", "secretName": "openai", "secretKey": "api-key"}],
    "extraEnv": [{"name": "COMPACTION_PROXY_LOG_LEVEL", "value": "DEBUG"}],
    "config": {
        "routes": [
            {
                "model": "gpt-*",
                "base_url": "https://api.openai.com/v1",
                "api_key_env": "OPENAI_API_KEY",
                "context_window": 128000,
            }
        ]
    },
    "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
    "grafanaDashboard": {"enabled": True},
    "prometheusRule": {
        "enabled": True,
        "labels": {"release": "prometheus"},
        "ruleLabels": {"team": "llm-platform", "severity": "page"},
    },
    "autoscaling": {"enabled": True},
    "podDisruptionBudget": {"enabled": True},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "llm", "operator": "Exists", "effect": "NoSchedule"}],
}
VALUE_SETS = {
    "defaults": None,
    "existing-secret": {"secrets": {"existingSecret": "operator-secrets"}},
    "everything-on": EVERYTHING_ON,
}
# Custom resources Kubernetes' own schemas do not describe.
NOT_IN_KUBERNETES = {"ServiceMonitor", "PrometheusRule"}


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_every_rendered_manifest_is_a_valid_kubernetes_object(
    chart: Chart, values: dict[str, Any] | None
) -> None:
    manifests = render(chart, values)
    if values is EVERYTHING_ON:
        kinds = {m["kind"] for m in manifests.values()}
        assert {
            "ServiceMonitor",
            "PrometheusRule",
            "HorizontalPodAutoscaler",
            "PodDisruptionBudget",
        } <= kinds
        redis_url = env_of(manifests)["REDIS_URL"]["value"]
        redis_services = [
            m["metadata"]["name"] for m in manifests.values() if m["kind"] == "Service"
        ]
        assert redis_url == "redis://cp-compaction-proxy-redis:6379/0"
        assert "cp-compaction-proxy-redis" in redis_services
        # The proxy's Service must not send clients to the Redis pod.
        selector = manifests["service.yaml"]["spec"]["selector"].items()
        assert (
            not selector
            <= manifests["redis.yaml"]["spec"]["template"]["metadata"]["labels"].items()
        )
    for name, manifest in manifests.items():
        if manifest["kind"] in NOT_IN_KUBERNETES:
            continue
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{name}: {error}")


def test_the_prometheus_rule_carries_the_tested_alerting_rules(chart: Chart) -> None:
    """The PrometheusRule's groups are the rules file's, alert for alert, each with the
    ``ruleLabels`` added (its own severity kept), its ``$labels`` templates left to
    Prometheus (Helm does not read the file as a template)."""
    manifests = render(chart, EVERYTHING_ON)
    rule = manifests["prometheusrule.yaml"]
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    shipped = yaml.safe_load((CHART / "alerts" / "compaction-proxy.rules.yml").read_text())
    for group in shipped["groups"]:
        for alert in group["rules"]:
            alert["labels"] = {"team": "llm-platform", **alert["labels"]}
    assert rule["spec"] == shipped
    assert "{{ $labels.summarizer }}" in orjson.dumps(rule["spec"]).decode()
    plain = render(chart, {"prometheusRule": {"enabled": True}})["prometheusrule.yaml"]
    shipped = yaml.safe_load((CHART / "alerts" / "compaction-proxy.rules.yml").read_text())
    assert plain["spec"] == shipped


def test_without_an_existing_secret_a_tenant_secret_is_generated_and_kept(chart: Chart) -> None:
    manifests = render(chart)
    secret = manifests["tenant-secret.yaml"]
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(secret["data"]["tenant-secret"])) == 48
    env = env_of(manifests)
    reference = env["COMPACTION_PROXY_TENANT_SECRET"]["valueFrom"]["secretKeyRef"]
    assert reference == {"name": secret["metadata"]["name"], "key": "tenant-secret"}
    assert "COMPACTION_PROXY_ADMIN_TOKEN" not in env  # the admin API stays off


def test_an_existing_secret_is_used_and_none_is_generated(chart: Chart) -> None:
    manifests = render(chart, {"secrets": {"existingSecret": "operator-secrets"}})
    assert "tenant-secret.yaml" not in manifests
    env = env_of(manifests)
    for name in ("COMPACTION_PROXY_TENANT_SECRET", "COMPACTION_PROXY_ADMIN_TOKEN"):
        assert env[name]["valueFrom"]["secretKeyRef"]["name"] == "operator-secrets"


@pytest.mark.parametrize("values", VALUE_SETS.values(), ids=VALUE_SETS.keys())
def test_helm_lint_strict_finds_nothing(values: dict[str, Any] | None) -> None:
    report = helm_python.lint(CHART, values, strict=True, kube_version=f"v{KUBE_VERSION}")
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []  # warnings, errors


def test_every_policy_key_the_proxy_takes_passes_the_charts_schema() -> None:
    """The schema closes ``policy`` and ``pruner``: a key the proxy accepts but the schema
    lacks would make Helm refuse a valid configuration."""
    policy = Policy().model_dump(mode="json")
    policy["retain_tokens"] = None
    report = helm_python.lint(
        CHART, {"config": {"policy": policy}}, strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    assert set(policy["pruner"]) == set(PrunerPolicy.model_fields)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize(
    "several", [{"replicaCount": 2}, {"autoscaling": {"enabled": True}}], ids=["replicas", "hpa"]
)
def test_several_pods_without_a_shared_store_are_refused_at_render(
    chart: Chart, several: dict[str, Any]
) -> None:
    with pytest.raises(Exception, match="need a store they share"):
        render(chart, several)


def test_several_pods_with_a_shared_store_each_refuse_the_in_process_store(chart: Chart) -> None:
    """Whether the operator's secret holds a Redis URL is unknown at render: the pods are told
    to refuse the in-process store, so a missing one stops them with a message instead of
    splitting every conversation between them."""
    several = render(chart, {"replicaCount": 2, "secrets": {"existingSecret": "operator"}})
    assert env_of(several)["COMPACTION_PROXY_REQUIRE_SHARED_STORE"]["value"] == "true"
    assert "COMPACTION_PROXY_REQUIRE_SHARED_STORE" not in env_of(render(chart))


def test_the_grace_period_outlasts_a_drain_and_the_last_log_writes(chart: Chart) -> None:
    shutdown_timeout = Settings().shutdown_timeout
    spec = render(chart)["deployment.yaml"]["spec"]["template"]["spec"]
    assert spec["terminationGracePeriodSeconds"] > 2 * shutdown_timeout


def test_the_charts_schema_takes_every_price_preset_the_proxy_takes() -> None:
    schema = orjson.loads((Path(CHART) / "values.schema.json").read_bytes())
    policy = schema["properties"]["config"]["properties"]["policy"]["properties"]
    assert policy["pricing"]["properties"]["preset"]["enum"] == list(get_args(PricePreset))


def test_every_route_key_the_proxy_takes_passes_the_charts_schema() -> None:
    schema = orjson.loads((Path(CHART) / "values.schema.json").read_bytes())
    route = schema["properties"]["config"]["properties"]["routes"]["items"]["properties"]
    assert set(route) == set(Route.model_fields)
    config = {
        "routes": [
            {
                "model": "gpt-*",
                "base_url": "https://api.openai.com/v1",
                "account_endpoints": "owned",
            }
        ]
    }
    report = helm_python.lint(
        CHART, {"config": config}, strict=True, kube_version=f"v{KUBE_VERSION}"
    )
    assert report["errors"] == []
