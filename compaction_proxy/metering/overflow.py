"""Context-overflow errors: recognise them and read the limit they state (pure).

Providers word the same failure many ways; one table here, one recorded body per provider in
the tests. Rate limits (429, including OpenAI's "Request too large ... tokens per min") and
parameter-length errors (``string_above_max_length``) are never overflow.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from compaction_proxy.frozen import frozen
from compaction_proxy.metering import lazy_litellm

_OVERFLOW_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_OVERFLOW_PHRASES = (
    "maximum context length is",  # OpenAI, Groq, DeepSeek, Together, vLLM, OpenRouter
    "your input exceeds the context window",  # OpenAI, newer wording
    "input tokens exceed the configured limit",  # Azure OpenAI
    "maximum context length",  # Mistral ("... too large for model with N maximum context length")
    "maximum prompt length is",  # xAI
    "exceeds the available context size",  # llama.cpp
    "exceed_context_size_error",  # llama.cpp error type
    "exceeded max context length",  # Ollama
    "exceeds the maximum number of tokens allowed",  # Gemini (OpenAI-compatible endpoint)
    "prompt is too long",  # Anthropic, and compatible gateways
    "exceed context limit",  # Anthropic: input length and max_tokens together
    "is longer than the model's context length",  # vLLM, older
    "is longer than the maximum model length",  # vLLM, newer
    "context length exceeded",
    "context window exceeded",
    "`inputs` tokens + `max_new_tokens` must be",  # text-generation-inference
)
_NEVER_OVERFLOW = ("string_above_max_length", "tokens per min", "rate limit")
_STATED_LIMITS = (
    re.compile(r"maximum context length is (\d+)", re.IGNORECASE),
    re.compile(r"\d+ tokens > (\d+) maximum", re.IGNORECASE),
    re.compile(r"exceed context limit: \d+ \+ \d+ > (\d+)", re.IGNORECASE),
    re.compile(r"configured limit of (\d+) tokens", re.IGNORECASE),
    re.compile(r"with (\d+) maximum context length", re.IGNORECASE),
    re.compile(r"maximum prompt length is (\d+)", re.IGNORECASE),
    re.compile(r"context window of (?:this model \()?(\d+)", re.IGNORECASE),
    re.compile(r'"n_ctx"\s*:\s*(\d+)'),
    re.compile(r"n_ctx\s*[=:]\s*(\d+)"),
    re.compile(r"maximum number of tokens allowed \((\d+)\)", re.IGNORECASE),
    re.compile(r"must be <= (\d+)", re.IGNORECASE),
    re.compile(r"while limit is (\d+)", re.IGNORECASE),
    re.compile(r"maximum model length of (\d+)", re.IGNORECASE),
)


@frozen
class OverflowVerdict:
    is_overflow: bool
    limit: int | None = None


NOT_OVERFLOW = OverflowVerdict(False)


def stated_limit(text: str) -> int | None:
    """The context limit a message states, if it states one. A limit of 0 states none: no
    model has an empty window, and an error can echo a client's own words (an unknown
    argument's name) that would teach it one."""
    for pattern in _STATED_LIMITS:
        match = pattern.search(text)
        if match:
            return int(match.group(1)) or None
    return None


def error_message(body: bytes) -> str:
    """The human words of an upstream error body (its ``message``, else the body's text)."""
    return " ".join(_error_fields(body)[1].split())


@frozen
class ErrorKind:
    """The ``type`` and ``code`` an upstream error names (OpenAI's shape), each only where it
    is a plain identifier: what clients tell a spent quota (``insufficient_quota``, which
    they do not retry) from a passing rate limit by."""

    error_type: str | None = None
    code: str | None = None


NAMELESS_ERROR = ErrorKind()  # an error that names neither
_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:-]{1,64}")


def _identifier(value: Any) -> str | None:
    return value if isinstance(value, str) and _IDENTIFIER.fullmatch(value) else None


def error_kind(body: bytes) -> ErrorKind:
    """The kind an upstream error body names; an empty kind for any other body."""
    error = _error_object(body)
    if not isinstance(error, dict):
        return NAMELESS_ERROR
    return ErrorKind(_identifier(error.get("type")), _identifier(error.get("code")))


def _error_object(body: bytes) -> Any:
    """An error body's ``error`` object (Gemini wraps the body in a JSON array); the body's
    text when it is no JSON."""
    try:
        parsed: Any = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.decode("utf-8", errors="replace")
    if isinstance(parsed, list) and parsed:
        parsed = parsed[0]
    return parsed.get("error", parsed) if isinstance(parsed, dict) else parsed


def _error_fields(body: bytes) -> tuple[str, str]:
    """(code and type, message) of an error body."""
    error = _error_object(body)
    if not isinstance(error, dict):  # the body's text, or JSON that is no error object
        return "", str(error)
    code = f"{error.get('code') or ''} {error.get('type') or ''} {error.get('status') or ''}"
    message = str(error.get("message") or "")
    return code.lower(), message or body.decode("utf-8", errors="replace")


def _litellm_says_overflow(text: str) -> bool:
    """litellm's own check, once litellm is loaded (it is a dependency)."""
    if not lazy_litellm.available():
        return False
    from litellm.litellm_core_utils.exception_mapping_utils import ExceptionCheckers

    return bool(ExceptionCheckers.is_error_str_context_window_exceeded(text))


def classify_overflow(status: int, body: bytes) -> OverflowVerdict:
    """Whether an upstream error (status, raw body) is a context overflow, and its limit."""
    if status == 429 or not 400 <= status < 600:
        return NOT_OVERFLOW
    code, message = _error_fields(body)
    text = f"{code} {message}".lower()
    if any(marker in text for marker in _NEVER_OVERFLOW):
        return NOT_OVERFLOW
    overflow = any(c in code.split() for c in _OVERFLOW_CODES)
    overflow = overflow or any(phrase in text for phrase in _OVERFLOW_PHRASES)
    overflow = overflow or _litellm_says_overflow(message)
    if not overflow:
        return NOT_OVERFLOW
    raw_text = body.decode("utf-8", errors="replace")
    return OverflowVerdict(True, stated_limit(message) or stated_limit(raw_text))
