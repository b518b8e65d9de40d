"""What an evaluation found, per policy (pure): retention by probe kind with a confidence
interval, what was forwarded and billed; as a terminal table, JSON, and an HTML chart of
retention against cost.

**Retention** of a kind: of its probes the model answered right with the whole history (or,
where the whole history does not fit the model, of all of them), the share it still answered
right with what the policy forwarded. The interval is Wilson's, 95 %.

**Billed** is the replay's prompt bill on the provider's caching terms (``CachePrices``: a
request's prefix that the one before it sent is read from cache, the rest written), with the
summary calls' prompts at the plain price and their output at the output price, as a multiple
of what the same requests cost sent as the client sent them.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from compaction_proxy.evaluation.probes import ProbeKind
from compaction_proxy.frozen import frozen

Z95 = 1.96


@frozen
class Asked:
    """One probe, asked under one policy: right with the whole history (None: it does not
    fit the model, so it was not asked) and right with what was forwarded."""

    kind: ProbeKind
    full: bool | None
    compacted: bool


@frozen
class Retention:
    probes: int
    right: int
    low: float
    high: float

    @property
    def share(self) -> float | None:
        return self.right / self.probes if self.probes else None


@dataclass
class PolicyRun:
    """One policy's replay: the probes asked, what the requests sent and forwarded (prompt
    tokens), the bill as a multiple of the raw one, the summary calls, the change points."""

    name: str
    asked: list[Asked] = field(default_factory=list)
    raw_tokens: int = 0
    forwarded_tokens: int = 0
    billed: float = 1.0
    summary_calls: int = 0
    change_points: int = 0
    statuses: dict[str, int] = field(default_factory=dict)  # X-Compaction-Status: requests
    generated_probes: int = 0  # of those asked, the probes the model wrote
    # The prices billed: a cached token read and written, an output token (uncached input: 1).
    prices: dict[str, float] = field(default_factory=dict)


def wilson(right: int, probes: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of ``right`` out of ``probes``."""
    if probes == 0:
        return 0.0, 1.0
    share = right / probes
    centre = share + z * z / (2 * probes)
    spread = z * math.sqrt(share * (1 - share) / probes + z * z / (4 * probes * probes))
    scale = 1 + z * z / probes
    low, high = (centre - spread) / scale, (centre + spread) / scale
    # The bounds hold the share exactly (rounding would put 1.0 above a bound of 0.99...).
    return max(0.0, min(low, share)), min(1.0, max(high, share))


def retention(asked: Sequence[Asked], kind: ProbeKind | None = None) -> Retention:
    """Retention of ``kind`` (every kind: None)."""
    eligible = [a for a in asked if (kind is None or a.kind is kind) and a.full is not False]
    right = sum(1 for a in eligible if a.compacted)
    low, high = wilson(right, len(eligible))
    return Retention(len(eligible), right, low, high)


def bill_units(requests: Sequence[Sequence[tuple[str, int]]], read: float, write: float) -> float:
    """What ``requests`` (each its messages as (digest, tokens), in order) cost in uncached
    input units: the messages a request shares, from its start, with the request before it
    read from cache at ``read``, the rest written at ``write``."""
    units = 0.0
    before: Sequence[tuple[str, int]] = ()
    for sent in requests:
        shared = 0
        for mine, theirs in zip(sent, before, strict=False):
            if mine[0] != theirs[0]:
                break
            shared += 1
        units += read * sum(t for _, t in sent[:shared]) + write * sum(t for _, t in sent[shared:])
        before = sent
    return units


def as_json(runs: Sequence[PolicyRun]) -> dict[str, Any]:
    def kind_row(asked: Sequence[Asked], kind: ProbeKind | None) -> dict[str, Any]:
        found = retention(asked, kind)
        return {
            "probes": found.probes,
            "right": found.right,
            "retention": found.share,
            "interval": [round(found.low, 4), round(found.high, 4)],
        }

    return {
        "policies": [
            {
                "name": run.name,
                "retention": kind_row(run.asked, None),
                "by_kind": {kind.value: kind_row(run.asked, kind) for kind in ProbeKind},
                "probes_asked": len(run.asked),
                "probes_generated": run.generated_probes,
                "raw_tokens": run.raw_tokens,
                "forwarded_tokens": run.forwarded_tokens,
                "forwarded_share": (
                    round(run.forwarded_tokens / run.raw_tokens, 4) if run.raw_tokens else None
                ),
                "billed_vs_raw": round(run.billed, 4),
                "prices": dict(run.prices),
                "summary_calls": run.summary_calls,
                "change_points": run.change_points,
                "statuses": dict(run.statuses),
            }
            for run in runs
        ]
    }


def _share(found: Retention) -> str:
    share = found.share
    if share is None:
        return "-"
    return f"{share:.2f} [{found.low:.2f}, {found.high:.2f}] n={found.probes}"


def table(runs: Sequence[PolicyRun]) -> str:
    """The report for a terminal: one row per policy."""
    kinds = list(ProbeKind)
    head = ["policy", "retention", *(k.value for k in kinds), "forwarded", "billed", "summaries"]
    rows = [head]
    for run in runs:
        forwarded = run.forwarded_tokens / run.raw_tokens if run.raw_tokens else 0.0
        rows.append(
            [
                run.name,
                _share(retention(run.asked)),
                *(_share(retention(run.asked, k)) for k in kinds),
                f"{forwarded:.2f}x",
                f"{run.billed:.3f}x",
                str(run.summary_calls),
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]
    return "\n".join(line.rstrip() for line in lines)


def chart_html(runs: Sequence[PolicyRun], title: str) -> str:
    """Retention against billed cost, one point per policy (its interval as a bar): a
    self-contained HTML page."""
    width, height, pad = 640, 420, 60
    costs = [run.billed for run in runs] or [1.0]
    low_cost, high_cost = min(0.0, *costs), max(1.0, *costs)

    def x(cost: float) -> float:
        return pad + (cost - low_cost) / (high_cost - low_cost or 1) * (width - 2 * pad)

    def y(share: float) -> float:
        return height - pad - share * (height - 2 * pad)

    marks = [
        f'<line x1="{pad}" y1="{height - pad}" x2="{width - pad}" y2="{height - pad}" '
        'stroke="#444"/>',
        f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{height - pad}" stroke="#444"/>',
        f'<text x="{width / 2}" y="{height - 15}" text-anchor="middle">billed / raw</text>',
        f'<text x="15" y="{height / 2}" transform="rotate(-90 15 {height / 2})" '
        'text-anchor="middle">retention</text>',
    ]
    for tick in (0.0, 0.5, 1.0):
        marks.append(f'<text x="{pad - 8}" y="{y(tick) + 4}" text-anchor="end">{tick:.1f}</text>')
    for tick in sorted({low_cost, high_cost, *costs}):
        marks.append(
            f'<text x="{x(tick)}" y="{height - pad + 18}" text-anchor="middle">{tick:.2f}</text>'
        )
    for run in runs:
        found = retention(run.asked)
        share = found.share if found.share is not None else 0.0
        cx, cy = x(run.billed), y(share)
        name = html.escape(run.name)
        marks += [
            f'<line x1="{cx}" y1="{y(found.low)}" x2="{cx}" y2="{y(found.high)}" stroke="#999"/>',
            f'<circle cx="{cx}" cy="{cy}" r="5" fill="#2a6"/>',
            f'<text x="{cx + 8}" y="{cy - 8}">{name} ({share:.2f}, n={found.probes})</text>',
        ]
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">{"".join(marks)}</svg>'
    )
    rows = html.escape(table(runs))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"</head><body><h1>{html.escape(title)}</h1>{svg}<pre>{rows}</pre></body></html>"
    )
