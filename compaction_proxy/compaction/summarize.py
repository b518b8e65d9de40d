"""The summary call and the framing of its result.

One upstream call replays the conversation's own head and tools (``tool_choice: "none"``) and
the selected span verbatim, then asks, in one final user message, for a structured checkpoint.
Replaying the same prefix lets the provider reuse its prompt cache. Only returned text counts:
empty text, ``finish_reason: length``, an error or a timeout is a failure.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Mapping, Sequence
from typing import Any

import orjson
from yarl import URL

from compaction_proxy.conversation.messages import Message
from compaction_proxy.formats.wire import SummaryReader, chat_summary_text
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.overflow import (
    NAMELESS_ERROR,
    ErrorKind,
    classify_overflow,
    error_kind,
    error_message,
)
from compaction_proxy.parsing import jsonio
from compaction_proxy.upstream_seam import (
    Upstream,
    UpstreamBroke,
    UpstreamCall,
    UpstreamUnreachable,
)

SECTIONS = (
    "Primary Request and Intent",
    "Key Technical Concepts",
    "Files and Code",
    "Errors and Fixes",
    "Pending Jobs",
    "Current Work",
    "Next Step",
    "Critical Context",
)

# The fake upstream recognises summary calls by this opening; keep it stable.
INSTRUCTION_OPENING = "Context checkpoint request."

INSTRUCTION = (
    f"{INSTRUCTION_OPENING} Stop the task for a moment: this conversation is about to be "
    "shortened, and everything above this message will be replaced by what you write now. "
    "Write a terse Markdown checkpoint that lets the work continue without the original "
    "messages. Use exactly these sections, in this order, each as a '## ' heading:\n"
    + "\n".join(f"## {section}" for section in SECTIONS)
    + "\n\nRules:\n"
    "- Keep exact file paths, commands, error messages, identifiers, versions and numbers "
    "verbatim; never paraphrase them.\n"
    "- Record decisions and their reasons, what was tried and failed, and what remains.\n"
    "- If the conversation already holds a <compacted-summary>, merge its content into the "
    "new sections (updating what changed) instead of copying it as a block.\n"
    "- Write 'None.' under a section with nothing to say.\n"
    "- Do not call tools. Do not add anything before the first heading or after the last "
    "section."
)

PREAMBLE = (
    "This is established background from earlier in this conversation, condensed to keep it "
    "within the model's context window. Treat it as settled context and continue the task from "
    "where it stands, without acknowledging or mentioning this summary."
)

_SUMMARY_BLOCK = re.compile(r"<compacted-summary>\n?(.*?)\n?</compacted-summary>", re.DOTALL)


class SummaryFailed(Exception):
    """The summary call produced nothing usable; ``reason`` is a short class. An ``overflow``
    (the summary call itself too large) carries the limit the upstream stated, if any."""

    def __init__(
        self,
        reason: str,
        limit: int | None = None,
        upstream_message: str = "",
        retry_after: float | None = None,
        kind: ErrorKind = NAMELESS_ERROR,
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.limit = limit
        self.upstream_message = upstream_message  # the error's own words, for operators
        self.retry_after = retry_after  # seconds a rate-limited caller is told to wait
        self.kind = kind  # the error's type and code, as the upstream named them
        # Whether the call went out on the caller's own credential (not a key the proxy
        # holds): a refusal or a rate limit then concerns that caller's key alone.
        self.caller_credential = False

    @property
    def explanation(self) -> str:
        """One line for an operator: the class, the upstream's words, and what to do."""
        text = _EXPLANATIONS.get(self.reason, "")
        if self.reason in ("http_401", "http_403"):
            text = "the upstream refused the credentials (give the route an api_key_env, "
            text += "or pass the admin call an upstream key)"
        said = f": {self.upstream_message}" if self.upstream_message else ""
        return f"the summary call failed ({self.reason}{said})" + (f"; {text}" if text else "")


_EXPLANATIONS = {
    "timeout": "the summarizer did not answer within summary_timeout_seconds",
    "unreachable": "the summarizer's host could not be reached",
    "overflow": "the summary call itself was over the summarizer's window",
    "malformed": "the summarizer's answer was not a chat completion",
    "length": "the summary was cut at max_tokens",
    "empty": "the summarizer answered with no text",
}


@frozen
class Summary:
    text: str
    usage: dict[str, Any] | None


def frame(summary: str) -> Message:
    """The checkpoint message that replaces a span."""
    return {
        "role": "user",
        "content": f"{PREAMBLE}\n\n<compacted-summary>\n{summary.strip()}\n</compacted-summary>",
    }


def framed_summary_text(message: Message) -> str | None:
    """The summary inside a checkpoint message, if it is one."""
    content = message.get("content")
    if not isinstance(content, str):
        return None
    match = _SUMMARY_BLOCK.search(content)
    return match.group(1) if match else None


def _uses_completion_tokens_field(model: str) -> bool:
    # OpenAI's reasoning models reject max_tokens and require max_completion_tokens.
    return re.match(r"^(o\d|gpt-5)", model.split("/")[-1]) is not None


KEPT_NOTE = (
    "Exception: whatever follows the last assistant message above is not replaced; it stays "
    "after your checkpoint as it is. Leave it out of the checkpoint."
)


def summary_body(
    model: str,
    head: list[Message],
    span: list[Message],
    tools: Any,
    max_tokens: int,
    instructions: str | None = None,
    kept: Sequence[Message] = (),
) -> dict[str, Any]:
    """The summary call in chat form; ``instructions``, the client's own, follow ours.
    ``kept``: messages past the span (which ends on an assistant message) the call carries as
    well, which the checkpoint leaves in place (the instruction says so: ``KEPT_NOTE``)."""
    ask = INSTRUCTION if not kept else f"{INSTRUCTION}\n\n{KEPT_NOTE}"
    ask = ask if not instructions else f"{ask}\n\nAlso: {instructions.strip()}"
    body: dict[str, Any] = {
        "model": model,
        "messages": [*head, *span, *kept, {"role": "user", "content": ask}],
        "stream": False,
    }
    body["max_completion_tokens" if _uses_completion_tokens_field(model) else "max_tokens"] = (
        max_tokens
    )
    if tools:
        body["tools"] = tools
        body["tool_choice"] = "none"
    return body


def _seconds(header: str | None) -> float | None:
    """A ``Retry-After`` in seconds, bounded to an hour (its date form is not read)."""
    if header is None or not header.strip().isdigit():
        return None
    return float(min(int(header.strip()), 3600))


async def call_summarizer(
    upstream: Upstream,
    url: URL,
    headers: Mapping[str, str],
    body: dict[str, Any],
    timeout_seconds: float,
    read: SummaryReader = chat_summary_text,
) -> Summary:
    """POST the summary request; raise SummaryFailed unless it returns usable text. The
    answer is read by ``read``, the format's (``formats.wire.SummaryPost``): a chat
    completion by default."""
    call = UpstreamCall("POST", url, headers, jsonio.dumps(body))
    try:
        async with asyncio.timeout(timeout_seconds):
            async with upstream.open(call) as response:
                raw = await response.read()
                status = response.status
                retry_after = _seconds(response.headers.get("Retry-After"))
    except TimeoutError as exc:
        raise SummaryFailed("timeout") from exc
    except (UpstreamUnreachable, UpstreamBroke) as exc:
        if isinstance(exc.cause, TimeoutError):  # the session's own read timeout
            raise SummaryFailed("timeout") from exc
        raise SummaryFailed("unreachable") from exc
    if status >= 400:
        verdict = classify_overflow(status, raw)
        if verdict.is_overflow:
            raise SummaryFailed("overflow", verdict.limit)
    if not 200 <= status < 300:  # a redirect included: the proxy follows none
        said = error_message(raw)[:300]
        raise SummaryFailed(
            f"http_{status}", upstream_message=said, retry_after=retry_after, kind=error_kind(raw)
        )
    return _structured_summary(raw, read)


def _structured_summary(raw: bytes, read: SummaryReader) -> Summary:
    """An answer's summary, ``read`` giving its text and whether it was cut at its cap."""
    try:
        parsed = orjson.loads(raw)
        text, cut = read(parsed)
    except (orjson.JSONDecodeError, ValueError) as exc:
        raise SummaryFailed("malformed") from exc
    if cut:
        raise SummaryFailed("length")
    if not text.strip():
        raise SummaryFailed("empty")
    usage = parsed.get("usage") if isinstance(parsed.get("usage"), dict) else None
    return Summary(text.strip(), usage)
