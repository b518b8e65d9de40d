"""The manual's reference pages, generated so they cannot drift: every setting (from the
settings model) and every metric (from the metrics module). ``python -m
compaction_proxy.ops.reference`` writes them under ``docs/reference/``; a test fails when the
committed pages differ from what this generates.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from prometheus_client.metrics import MetricWrapperBase
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from compaction_proxy import metrics
from compaction_proxy.config.settings import Settings

PAGES = Path(__file__).resolve().parents[2] / "docs" / "reference"
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


def configuration_page() -> str:
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


def metrics_page() -> str:
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


PAGE_MAKERS = {"configuration.md": configuration_page, "metrics.md": metrics_page}


def main() -> int:
    PAGES.mkdir(parents=True, exist_ok=True)
    for name, make in PAGE_MAKERS.items():
        (PAGES / name).write_text(make())
        print(f"wrote {PAGES / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
