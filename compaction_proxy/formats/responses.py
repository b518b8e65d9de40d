"""The Responses API's adapter: a body parsed (from where it extends a recent one), the
surface written back as ``input`` items, summary calls in the client's own format.

The translation both ways is ``formats.responses_items``; the cache-safe summary call
``formats.responses_summary``. A body whose history the provider holds
(``previous_response_id``, ``conversation``) is no request for the core: it is relayed as sent.
"""

from __future__ import annotations

import bisect
import time
import uuid
from collections.abc import Callable
from operator import itemgetter
from typing import Any, ClassVar

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats import responses_compaction
from compaction_proxy.formats.answer_edits import AnswerEdit
from compaction_proxy.formats.asked_compaction import AskedCompaction
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.request import (
    ClientRequest,
    ProviderHeld,
    check_object_with_model,
    check_stream,
    parse_object_with_model,
    remembered,
    translated_digests,
)
from compaction_proxy.formats.responses_items import (
    Translated,
    items_for,
    sent_items,
    translate,
)
from compaction_proxy.formats.responses_socket import RESPONSES_SOCKET
from compaction_proxy.formats.responses_summary import (
    cache_safe_responses_body,
    responses_summary_text,
)
from compaction_proxy.formats.sealed_checkpoints import MadeCompaction
from compaction_proxy.formats.wire import (
    ParseContext,
    SocketDialect,
    SummaryPost,
    WireFormat,
    chat_summary,
)
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.recent_bodies import Extension, RecentBodies


def stateful(body: dict[str, Any]) -> bool:
    """Whether the provider holds the history (``previous_response_id``, ``conversation``)."""
    get = body.get  # the fields named one by one: no generator on every request
    return get("previous_response_id") is not None or get("conversation") is not None


def parse_responses_body(
    raw: bytes, recent: RecentBodies | None = None, hint: str | None = None
) -> tuple[dict[str, Any], Extension | None]:
    """The body as an object naming its model: from where it differs when its ``input``
    extends a body parsed a moment ago (then with that extension), else parsed whole
    (``hint``: the client's name for the conversation)."""
    extension = recent.extend(raw, "input", hint) if recent is not None else None
    if extension is not None:
        return check_object_with_model(extension.body), extension
    return parse_object_with_model(raw), None


# A bisection key in C: the groups after the head's each have a last item.
_last_item = itemgetter(-1)


def _reusable(extension: Extension, body: dict[str, Any]) -> Translated | None:
    """The messages of the remembered body's translation this body's begins with: under the
    same instructions, those made of shared items only, less the last of them (the items
    after it may continue its turn, or it holds reasoning waiting for them), and less the
    assistant messages before it that it followed in the same turn: reasoning kept apart from
    an answer merges with it once a call follows (one assistant message), so that whole turn
    is translated again."""
    base = extension.base.translation
    if not isinstance(base, Translated):
        return None
    head = 1 if base.groups and not base.groups[0] else 0
    instructions = body.get("instructions")
    if (base.messages[0].get("content") if head else None) != instructions:
        return None
    # The groups after the head's run in the order of their last item (``translate``): the
    # first that reaches past the shared items is found by bisection, not walked to.
    count = bisect.bisect_left(base.groups, extension.known, lo=head, key=_last_item)
    count = max(head, count - 1)
    messages = base.messages
    while (
        head < count < len(messages)
        and messages[count - 1].get("role") == "assistant"
        and messages[count].get("role") == "assistant"
    ):
        count -= 1
    return Translated(base.messages[:count], base.groups[:count], base.sealed)


def parse_responses_request(
    body: dict[str, Any],
    raw: bytes,
    known: KnownMessages,
    recent: RecentBodies | None = None,
    extension: Extension | None = None,
    hint: str | None = None,
) -> ClientRequest:
    """A stateless Responses body (see ``stateful``) as a request for the shared core; with
    the ``extension`` it was parsed as, translated and hashed from where the remembered body's
    translation still holds."""
    prefix = _reusable(extension, body) if extension is not None else None
    translated = translate(body, prefix)
    reused = 0 if prefix is None else len(prefix.messages)
    digests = translated_digests(translated.messages, reused, extension, known)
    lineage = remembered(recent, raw, body, "input", digests, extension, translated, reused, hint)
    return ClientRequest(
        body=body,
        model=body["model"],
        messages=translated.messages,
        stream=check_stream(body),
        digests=digests,
        raw=raw,
        wire=RESPONSES,
        groups=translated.groups,
        lineage=lineage,
        carries_sealed=translated.sealed,
    )


def responses_payload(request: ClientRequest, surface: Surface) -> bytes:
    """The client's body with only ``input`` rebuilt for ``surface``; every other field, and
    every item the surface keeps, as sent (``sent_items``)."""
    assert request.groups is not None
    body, sent = sent_items(request)
    return jsonio.dumps({**body, "input": items_for(surface, request.groups, sent)})


class ResponsesFormat(WireFormat):
    """``POST /v1/responses``: ``input`` items translated to messages and back."""

    name: ClassVar[str] = "responses"
    family: ClassVar[ApiFamily] = ApiFamily.OPENAI
    upstream_path: ClassVar[str] = "/responses"
    answer_cap_fields: ClassVar[tuple[str, ...]] = ("max_output_tokens",)
    stored_by_default: ClassVar[bool] = True
    socket: ClassVar[SocketDialect | None] = RESPONSES_SOCKET

    def asks_for_compaction(self, body: dict[str, Any]) -> bool:
        return responses_compaction.asks_for_compaction(body)

    def asked_compaction(self, body: dict[str, Any]) -> AskedCompaction | None:
        if "context_management" not in body:  # most bodies: nothing more to look at
            return None
        return responses_compaction.asked_compaction(body)

    def without_asked_compaction(self, request: ClientRequest) -> bytes:
        body = responses_compaction.without_compaction_option(request.lossless_body())
        return jsonio.dumps(body)

    def opened_checkpoints(self, body: Any, opened: Callable[[str], str]) -> dict[str, Any] | None:
        return responses_compaction.opened_items(body, opened)

    def compaction_edit(
        self,
        made: MadeCompaction | None,
        applied: tuple[dict[str, Any], ...],
        asked: AskedCompaction,
    ) -> AnswerEdit | None:
        if made is None:
            return None
        item = responses_compaction.compaction_item(made.token)
        return responses_compaction.FirstOutputItem(item)

    def compaction_answer(self, model: str, made: MadeCompaction, stream: bool) -> bytes:
        created = int(time.time())
        return responses_compaction.trigger_answer(
            f"resp_{uuid.uuid4().hex}", model, created, made, stream
        )

    def provider_holds(self, body: dict[str, Any]) -> bool:
        """Whether the provider holds the body's history (``stateful``): the proxy cannot
        read it, so it neither compacts nor answers for it."""
        return stateful(body)

    def compact_request(self, body: dict[str, Any]) -> bytes:
        """A ``/v1/responses/compact`` body as a Responses request ending with a trigger."""
        return jsonio.dumps(responses_compaction.compact_request_body(body))

    def compacted_answer(self, request: ClientRequest, made: MadeCompaction) -> bytes:
        """``/v1/responses/compact``'s answer for ``request`` (a ``compact_request``)."""
        items = request.body.get("input")
        created = int(time.time())
        return responses_compaction.compacted_answer(
            f"cmp_{uuid.uuid4().hex}", created, items if isinstance(items, list) else [], made
        )

    def parse(self, raw: bytes, context: ParseContext) -> ClientRequest | ProviderHeld:
        body, extension = parse_responses_body(raw, context.recent, context.session_id)
        if stateful(body):
            return ProviderHeld(body, raw, body["model"])
        return parse_responses_request(
            body, raw, context.known, context.recent, extension, context.session_id
        )

    def payload(self, request: ClientRequest, surface: Surface) -> bytes:
        return responses_payload(request, surface)

    def cache_safe_summary(
        self, request: ClientRequest, prefix: Surface, body: dict[str, Any]
    ) -> SummaryPost | None:
        written = cache_safe_responses_body(request, prefix, body)
        if written is None:
            return None
        return SummaryPost("/responses", written, responses_summary_text)

    def rebuilt_summary(self, body: dict[str, Any]) -> SummaryPost:
        # An OpenAI-family route answers chat completions as well.
        return chat_summary(body)


RESPONSES = ResponsesFormat()
