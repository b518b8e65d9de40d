"""Grading a probe's answer (pure): by match where the answer is a fact; else the grader
model's verdict on ``probes.RUBRIC`` is read here."""

from __future__ import annotations

import re

from compaction_proxy.evaluation.probes import Probe


def _normal(text: str) -> str:
    text = text.strip().strip("`'\"").strip()
    text = text.removeprefix("./")
    return re.sub(r"\s+", " ", text).rstrip(".").lower()


def matches(probe: Probe, answer: str) -> bool:
    """Whether ``answer`` states the probe's fact: the same text, whitespace, quotes and a
    leading ``./`` aside, or holding it whole (a model may add words around it)."""
    expected, given = _normal(probe.answer), _normal(answer)
    if not given or given == "unknown":
        return False
    return given == expected or expected in given


def verdict(reply: str) -> bool:
    """The grader model's verdict: CORRECT or WRONG, first word."""
    words = reply.strip().split()
    return bool(words) and words[0].strip(".:*").upper() == "CORRECT"
