"""Overflow classification: one recorded error body per provider (tests/data)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from compaction_proxy.metering.overflow import (
    NAMELESS_ERROR,
    ErrorKind,
    classify_overflow,
    error_kind,
    stated_limit,
)

RECORDED = orjson.loads((Path(__file__).parents[1] / "data" / "upstream_errors.json").read_bytes())


@pytest.mark.parametrize("case", RECORDED["overflow"], ids=lambda c: c["provider"])
def test_provider_overflow_is_recognised_with_its_limit(case: dict[str, Any]) -> None:
    verdict = classify_overflow(case["status"], case["body"].encode())
    assert verdict.is_overflow
    assert verdict.limit == case["limit"]


@pytest.mark.parametrize("case", RECORDED["not_overflow"], ids=lambda c: c["case"])
def test_other_errors_are_not_overflow(case: dict[str, Any]) -> None:
    assert not classify_overflow(case["status"], case["body"].encode()).is_overflow


def test_every_provider_named_in_the_design_has_a_recorded_body() -> None:
    providers = {c["provider"] for c in RECORDED["overflow"]}
    assert providers >= {
        "openai",
        "openai-new",
        "azure",
        "groq",
        "deepseek",
        "mistral",
        "xai",
        "together",
        "vllm-old",
        "vllm-new",
        "llama.cpp",
        "ollama",
        "gemini",
        "openrouter",
        "anthropic-gateway",
    }


@pytest.mark.parametrize(
    ("text", "limit"),
    [
        ("maximum context length is 8192 tokens", 8192),
        ("12 tokens > 10 maximum", 10),
        ("nothing stated here", None),
        ("maximum context length is 0 tokens", None),  # no window is empty
    ],
)
def test_stated_limit(text: str, limit: int | None) -> None:
    assert stated_limit(text) == limit


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (
            b'{"error": {"message": "You exceeded your current quota", '
            b'"type": "insufficient_quota", "param": null, "code": "insufficient_quota"}}',
            ErrorKind("insufficient_quota", "insufficient_quota"),
        ),
        (
            b'{"error": {"type": "requests", "code": "rate_limit_exceeded"}}',
            ErrorKind("requests", "rate_limit_exceeded"),
        ),
        (
            b'{"type": "error", "error": {"type": "rate_limit_error", "message": "slow"}}',
            ErrorKind("rate_limit_error", None),
        ),
        (b'[{"error": {"code": 429, "status": "RESOURCE_EXHAUSTED"}}]', NAMELESS_ERROR),
        (b'{"error": {"type": "a\\nline", "code": "' + b"x" * 65 + b'"}}', NAMELESS_ERROR),
        (b"<html>Too Many Requests</html>", NAMELESS_ERROR),
        (b'"just a string"', NAMELESS_ERROR),
    ],
)
def test_an_error_names_its_type_and_code_only_as_plain_identifiers(
    body: bytes, kind: ErrorKind
) -> None:
    assert error_kind(body) == kind
