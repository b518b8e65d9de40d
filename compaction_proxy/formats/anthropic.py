"""Anthropic's Messages API's adapter (Claude Code): a body parsed and translated, the surface
written back as turns, summary calls in Messages form.

The translation both ways is ``formats.anthropic_blocks``; the summary calls
``formats.anthropic_summary``. Requests of this format are of the Anthropic family: routed to
``anthropic_base_url`` when no route matches their model, a route's key sent as ``x-api-key``.
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from typing import Any, ClassVar

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats import anthropic_compaction, anthropic_count
from compaction_proxy.formats.answer_edits import AnswerEdit
from compaction_proxy.formats.anthropic_blocks import (
    TranslatedMessages,
    lossless,
    rebreakpointed,
    system_message,
    translate_messages,
    with_checkpoint_breakpoint,
    written_turns,
)
from compaction_proxy.formats.anthropic_summary import (
    cache_safe_summary_body,
    summary_messages_body,
    summary_text_of,
)
from compaction_proxy.formats.asked_compaction import AskedCompaction, ClearedToolUses
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.request import (
    ClientRequest,
    check_object_with_model,
    check_stream,
    parse_object_with_model,
    remembered,
    translated_digests,
)
from compaction_proxy.formats.sealed_checkpoints import MadeCompaction
from compaction_proxy.formats.wire import ParseContext, SummaryPost, WireFormat
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.recent_bodies import Extension, RecentBodies

ANTHROPIC_VERSION = "2023-06-01"  # sent on a summary call when the client named none
LONG_CONTEXT_WINDOW = 1_000_000  # with the 1M-context beta (anthropic-beta: context-1m-...)
CLAUDE_CODE_SESSION_HEADER = "X-Claude-Code-Session-Id"  # as much weight as X-Session-Id
_SUMMARY_HEADERS = {"anthropic-version": ANTHROPIC_VERSION}


def declared_window(beta: Sequence[str]) -> int | None:
    """The window an ``anthropic-beta`` header (or several: each a comma-separated list)
    asks for: 1M tokens with ``context-1m-*``, else None (the model's own)."""
    if not beta:  # most requests: spared the generator
        return None
    features = (part.strip() for value in beta for part in value.split(","))
    return LONG_CONTEXT_WINDOW if any(f.startswith("context-1m") for f in features) else None


def parse_messages_request(
    raw: bytes,
    known: KnownMessages,
    beta: Sequence[str] = (),
    recent: RecentBodies | None = None,
    hint: str | None = None,
) -> ClientRequest:
    """A Messages body as a request for the shared core; ``beta``: the request's
    ``anthropic-beta`` headers. With ``recent``, a body extending one parsed a moment ago is
    parsed from where it differs, and translated and hashed from its first new turn (``hint``:
    the client's name for the conversation), as chat and Responses bodies are."""
    extension = recent.extend(raw, "messages", hint) if recent is not None else None
    if extension is None:
        body = parse_object_with_model(raw)
        translated, reused = translate_messages(body), 0
    else:
        body = check_object_with_model(extension.body)
        prefix, start = _reusable(extension, body)
        reused = 0 if prefix is None else len(prefix.messages)  # before it is extended
        translated = translate_messages(body, prefix, start)
    digests = translated_digests(translated.messages, reused, extension, known)
    lineage = remembered(
        recent, raw, body, "messages", digests, extension, translated, reused, hint
    )
    return ClientRequest(
        body=body,
        model=body["model"],
        messages=translated.messages,
        stream=check_stream(body),
        digests=digests,
        raw=raw,
        wire=MESSAGES,
        groups=translated.groups,
        translation=translated,
        lineage=lineage,
        declared_window=declared_window(beta),
        carries_sealed=translated.sealed,
    )


# Bisection keys in C: a parsed body's entries all have a turn (only a written checkpoint's
# has none), and its groups (the head's empty one aside) all have a last entry.
_entry_turn = attrgetter("turn")
_last_entry = itemgetter(-1)


def _reusable(extension: Extension, body: dict[str, Any]) -> tuple[TranslatedMessages | None, int]:
    """The remembered body's translation of the turns this body shares with it, under the
    same ``system``, and the turn the rest is translated from; (None, 0) when there is none
    to take. The turns shared are its first ``extension.known``, and the one after them too
    when only breakpoints moved on it (``rebreakpointed``)."""
    base = extension.base.translation
    if not isinstance(base, TranslatedMessages):
        return None, 0
    head = 1 if base.groups and not base.groups[0] else 0
    system = body.get("system")
    # The same ``system`` as sent (most bodies: the very object, the rest of the body reused)
    # makes the same head; another may still make it, translated.
    same = system is base.system or system == base.system
    if not same and (base.messages[0] if head else None) != system_message(body):
        return None, 0
    # A parsed body's entries run in turn order, and its groups (the head's empty one aside)
    # in the order of their last entry: both are searched by bisection, not walked.
    entries, known = base.entries, extension.known
    shared = bisect.bisect_left(entries, known, key=_entry_turn)  # the shared turns'
    turns = body.get("messages")
    moved = None
    if isinstance(turns, list) and known < len(turns):
        ends = bisect.bisect_left(entries, known + 1, lo=shared, key=_entry_turn)
        moved = rebreakpointed(turns[known], known, entries[shared:ends])
    kept = entries[:shared]
    if moved is not None:
        kept += moved
        known += 1
    count = bisect.bisect_left(base.groups, len(kept), lo=head, key=_last_entry)
    messages, groups = base.messages[:count], base.groups[:count]
    return TranslatedMessages(messages, groups, kept, base.sealed, system), known


def messages_payload(request: ClientRequest, surface: Surface) -> bytes:
    """The client's body with only ``messages`` rebuilt for ``surface``; every other field,
    and every block the surface keeps, as sent (read again losslessly when the body may hold
    integers beyond 64 bits)."""
    body, translated = lossless(request)
    turns, checkpoints = written_turns(surface, translated)
    turns = with_checkpoint_breakpoint(body, turns, checkpoints)
    return jsonio.dumps({**body, "messages": turns})


# Anthropic's error type for each status it answers with (docs: "Errors"); api_error else.
_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    408: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    504: "timeout_error",
    529: "overloaded_error",
}


class MessagesFormat(WireFormat):
    """``POST /v1/messages``: turns of blocks translated to messages and back."""

    name: ClassVar[str] = "messages"
    family: ClassVar[ApiFamily] = ApiFamily.ANTHROPIC
    upstream_path: ClassVar[str] = "/messages"
    answer_cap_fields: ClassVar[tuple[str, ...]] = ("max_tokens",)
    stored_by_default: ClassVar[bool] = False
    session_headers: ClassVar[tuple[str, ...]] = (CLAUDE_CODE_SESSION_HEADER,)
    caches_at_breakpoints: ClassVar[bool] = True
    end_user_fields: ClassVar[tuple[tuple[str, type], ...]] = (("metadata", dict),)  # user_id

    def asked_compaction(self, body: dict[str, Any]) -> AskedCompaction | None:
        if "context_management" not in body:  # most bodies: nothing more to look at
            return None
        return anthropic_compaction.asked_compaction(body)

    def without_asked_compaction(self, request: ClientRequest) -> bytes:
        body = anthropic_compaction.without_context_management(request.lossless_body())
        return jsonio.dumps(body)

    def opened_checkpoints(self, body: Any, opened: Callable[[str], str]) -> dict[str, Any] | None:
        return anthropic_compaction.opened_blocks(body, opened)

    def cleared_as_asked(
        self, payload: bytes, asked: AskedCompaction, cleared: ClearedToolUses | None
    ) -> tuple[bytes, tuple[dict[str, Any], ...]]:
        if asked.clear_tool_uses is None and asked.keep_thinking_turns is None:
            return payload, ()
        edited, applied = anthropic_compaction.edited_turns(jsonio.loads(payload), asked, cleared)
        return jsonio.dumps(edited), tuple(applied)

    def compaction_edit(
        self,
        made: MadeCompaction | None,
        applied: tuple[dict[str, Any], ...],
        asked: AskedCompaction,
    ) -> AnswerEdit | None:
        clearing = asked.clear_tool_uses is not None or asked.keep_thinking_turns is not None
        if made is None and not clearing:
            return None
        return anthropic_compaction.ManagedAnswer(made, applied if clearing else None)

    def count_bodies(
        self, body: dict[str, Any], asked: AskedCompaction, input_tokens: int | None
    ) -> dict[str, Any] | None:
        """A ``count_tokens`` body asking ``asked``: without the option (``input_tokens``
        None: the count of the history as sent), else as its edits would clear it given that
        count (None: they would clear nothing)."""
        plain = anthropic_compaction.without_context_management(body)
        if input_tokens is None:
            return plain
        return anthropic_count.cleared_for_count(plain, asked, input_tokens)

    def compaction_answer(self, model: str, made: MadeCompaction, stream: bool) -> bytes:
        message_id = f"msg_{uuid.uuid4().hex}"
        return anthropic_compaction.paused_answer(message_id, model, made, stream)

    def error_body(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> dict[str, Any]:
        """Anthropic's ``{"type": "error", "error": {"type", "message"}}``, the type the one
        Anthropic gives ``status`` (its SDK picks the exception class by status and reads
        ``error.type``): OpenAI's ``type``, ``param`` and ``code`` have no place in it."""
        kind = _ERROR_TYPES.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}

    def parse(self, raw: bytes, context: ParseContext) -> ClientRequest:
        return parse_messages_request(
            raw, context.known, context.beta, context.recent, context.session_id
        )

    def payload(self, request: ClientRequest, surface: Surface) -> bytes:
        return messages_payload(request, surface)

    def cache_safe_summary(
        self, request: ClientRequest, prefix: Surface, body: dict[str, Any]
    ) -> SummaryPost | None:
        written = cache_safe_summary_body(request, prefix, body)
        if written is None:
            return None
        return SummaryPost("/messages", written, summary_text_of, _SUMMARY_HEADERS)

    def rebuilt_summary(self, body: dict[str, Any]) -> SummaryPost:
        return SummaryPost(
            "/messages", summary_messages_body(body), summary_text_of, _SUMMARY_HEADERS
        )


MESSAGES = MessagesFormat()
