"""The Helm chart rendered by Helm's own engine (helm-python-sdk, no binary), every manifest
validated against the Kubernetes schemas."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from helm_python import Chart

CHART = Path(__file__).parents[2] / "charts" / "compaction-proxy"
KUBE_VERSION = "1.30.0"


@pytest.fixture(scope="module")
def chart() -> Iterator[Chart]:
    loaded = Chart.load(CHART)
    yield loaded
    loaded.close()


def render(chart: Chart, values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Rendered manifests by template file name (empty renders left out)."""
    out = chart.render(values, name="cp", namespace="default", is_install=True)
    manifests = {}
    for path, text in out.items():
        if not path.endswith(".yaml"):
            continue  # NOTES.txt
        document = yaml.safe_load(text)
        if document:
            manifests[Path(path).name] = document
    return manifests


def env_of(manifests: dict[str, dict[str, Any]]) -> dict[str, Any]:
    container = manifests["deployment.yaml"]["spec"]["template"]["spec"]["containers"][0]
    return {item["name"]: item for item in container["env"]}


@pytest.mark.parametrize("values", [None, {"secrets": {"existingSecret": "operator-secrets"}}])
def test_every_rendered_manifest_is_a_valid_kubernetes_object(
    chart: Chart, values: dict[str, Any] | None
) -> None:
    for name, manifest in render(chart, values).items():
        try:
            kubernetes_validate.validate(manifest, KUBE_VERSION, strict=True)
        except kubernetes_validate.ValidationError as error:
            pytest.fail(f"{name}: {error}")


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
