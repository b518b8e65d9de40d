"""The manual's reference pages, generated so they cannot drift: every setting (from the
settings model), every metric (from the metrics module) and every Helm value (from the chart's
``values.yaml``, its comments and its schema). ``python -m compaction_proxy.ops.reference``,
run in a checkout, writes them under ``docs/reference/``; a test fails when the committed
pages differ from what this generates.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from compaction_proxy import metrics
from compaction_proxy.config.settings import Settings

CHECKOUT = Path(__file__).resolve().parents[2]
PAGES = Path("docs") / "reference"
CHART = Path("charts") / "compaction-proxy"
ENV_PREFIX = "COMPACTION_PROXY_"


def _default(field: Any) -> str:
    if field.default is PydanticUndefined:
        return "(required)" if field.default_factory is None else "(computed)"
    value = field.default
    if isinstance(value, BaseModel):
        return "(see below)"
    return f"`{value!r}`" if value not in (None, "") else f"`{value}`"


def _cell(text: str) -> str:
    """``text`` in a table cell: its pipes escaped."""
    return text.replace("|", "\\|")


def _type(annotation: Any) -> str:
    text = getattr(annotation, "__name__", None) or str(annotation)
    return text.replace("typing.", "").replace("compaction_proxy.config.settings.", "")


def _rows(model: type[BaseModel], prefix: str, env: str | None) -> list[str]:
    rows = []
    nested: list[tuple[str, type[BaseModel]]] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        variable = f"`{env}{name.upper()}`" if env is not None else ""
        kind, default = _cell(_type(field.annotation)), _cell(_default(field))
        rows.append(f"| `{key}` | {kind} | {default} | {variable or '-'} |")
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            nested.append((key, annotation))
    for key, inner in nested:
        rows += _rows(inner, f"{key}.", f"{env}{key.upper()}__" if env is not None else None)
    return rows


def configuration_page(checkout: Path) -> str:
    from compaction_proxy.config.settings import ModelOverride, PolicyOverrides, Route

    head = "| key | type | default | environment variable |\n|---|---|---|---|"
    sections = [
        "# Configuration reference",
        "",
        "Every key the proxy takes, generated from its settings model "
        "(`python -m compaction_proxy.ops.reference`). What each means, with its default, is "
        "documented in `config/proxy.yaml`; how settings are read and overridden, in "
        "[Configuration](../configuration.md). Nested keys are joined with `__` in an "
        "environment variable (`COMPACTION_PROXY_POLICY__THRESHOLD_RATIO`).",
        "",
        "## Settings",
        "",
        head,
        *_rows(Settings, "", ENV_PREFIX),
        "",
        "## A route (`routes:` items)",
        "",
        head,
        *_rows(Route, "", None),
        "",
        "## A route's or a model's `policy:` overrides",
        "",
        head,
        *_rows(PolicyOverrides, "", None),
        "",
        "## A model's overrides (`models:` under a route)",
        "",
        head,
        *_rows(ModelOverride, "", None),
    ]
    return "\n".join(sections) + "\n"


def metrics_page(checkout: Path) -> str:
    found = sorted(
        (m for m in vars(metrics).values() if isinstance(m, MetricWrapperBase)),
        key=lambda m: m._name,
    )
    rows = [
        "# Metrics reference",
        "",
        "Every metric the proxy exports on `/metrics`, generated from the metrics module "
        "(`python -m compaction_proxy.ops.reference`); what they show together, in "
        "[Operating it](../operating.md).",
        "",
        "| metric | type | labels | what it counts |",
        "|---|---|---|---|",
    ]
    for metric in found:
        name = metric._name + ("_total" if metric._type == "counter" else "")
        labels = ", ".join(metric._labelnames) or "-"
        text = " ".join(metric._documentation.split()).replace("|", "\\|")
        rows.append(f"| `{name}` | {metric._type} | {labels} | {text} |")
    return "\n".join(rows) + "\n"


def _values_comments(text: str) -> dict[str, str]:
    """Each key's comment in a values file, by dotted path: the comment lines right above it
    (no blank line between) and a comment at the end of its line."""
    found: dict[str, str] = {}
    path: list[tuple[int, str]] = []
    above: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        key = re.match(r"([A-Za-z_][\w-]*):(.*)$", stripped)
        if key is None:
            above = []
            continue
        indent = len(line) - len(line.lstrip())
        while path and path[-1][0] >= indent:
            path.pop()
        path.append((indent, key[1]))
        notes = [*above]
        if " #" in key[2]:
            notes.append(key[2].split(" #", 1)[1].strip())
        if notes:
            found[".".join(name for _, name in path)] = " ".join(notes)
        above = []
    return found


def _schema_type(schema: dict[str, Any]) -> str:
    kind = schema.get("type")
    if "enum" in schema:
        return " or ".join(f"`{value}`" for value in schema["enum"])
    if isinstance(kind, list):
        return " or ".join(kind)
    return str(kind or "any")


def _value_rows(
    values: dict[str, Any], schema: dict[str, Any], comments: dict[str, str], prefix: str
) -> list[str]:
    rows = []
    properties = schema.get("properties", {})
    for name, value in values.items():
        key, inner = f"{prefix}{name}", properties.get(name, {})
        if key == "config":
            text = "The proxy's configuration, every key of the " + (
                "[configuration reference](configuration.md), rendered into its ConfigMap."
            )
            rows.append(f"| `config` | object | see below | {text} |")
            continue
        if isinstance(value, dict) and value and inner.get("properties"):
            if key in comments:
                rows.append(f"| `{key}` | object | | {_cell(comments[key])} |")
            rows += _value_rows(value, inner, comments, f"{key}.")
            continue
        default = json.dumps(value, ensure_ascii=False)
        note = comments.get(key) or inner.get("description") or ""
        rows.append(f"| `{key}` | {_schema_type(inner)} | `{default}` | {_cell(note)} |")
    return rows


def helm_values_page(checkout: Path) -> str:
    chart = checkout / CHART
    text = (chart / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((chart / "values.schema.json").read_text())
    config = "\n".join(
        f"  {line}" if line else ""
        for line in yaml.safe_dump(values["config"], sort_keys=False).splitlines()
    )
    return (
        "\n".join(
            [
                "# Helm values reference",
                "",
                "Every value of `charts/compaction-proxy`, with its default and its comment in "
                "`values.yaml`, generated from the chart "
                "(`python -m compaction_proxy.ops.reference`); "
                "`values.schema.json` refuses anything else. How to install it: "
                "[Deploying](../deploying.md).",
                "",
                "| value | type | default | what it does |",
                "|---|---|---|---|",
                *_value_rows(values, schema, _values_comments(text), ""),
                "",
                "## `config` as the chart ships it",
                "",
                "```yaml",
                "config:",
                config,
                "```",
            ]
        )
        + "\n"
    )


PAGE_MAKERS: dict[str, Callable[[Path], str]] = {
    "configuration.md": configuration_page,
    "metrics.md": metrics_page,
    "helm-values.md": helm_values_page,
}


def main() -> int:
    pages = CHECKOUT / PAGES
    pages.mkdir(parents=True, exist_ok=True)
    for name, make in PAGE_MAKERS.items():
        (pages / name).write_text(make(CHECKOUT))
        print(f"wrote {pages / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
