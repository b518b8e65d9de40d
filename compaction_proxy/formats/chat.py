"""Chat completions' adapter: validation of incoming bodies, and the surface written back.

Every field the proxy reads is checked for its type, at every level it reads: ``model``,
``messages`` as a list of objects, each with a known ``role``, ``content`` as null, a string or a
list of part objects (a text part's ``text`` a string), ``tool_calls`` as a list of objects,
``name`` and ``tool_call_id`` as strings, ``function_call`` as an object. What OpenAI would reject
anyway gets a 400 in its shape before anything is forwarded. Every other field, known to us or
not, is kept as sent and reaches the upstream unchanged.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.conversation.messages import MESSAGE_ROLES, Message
from compaction_proxy.conversation.surface import Surface, written_back
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.request import (
    ClientRequest,
    check_object_with_model,
    check_stream,
    invalid,
    parse_object_with_model,
)
from compaction_proxy.formats.wire import (
    PROMPT_CACHE_OPTIONS,
    ParseContext,
    SummaryPost,
    WireFormat,
    chat_summary,
)
from compaction_proxy.parsing import jsonio
from compaction_proxy.parsing.recent_bodies import Extension, Lineage, RecentBodies, first_of

_ROLES = ", ".join(f"'{r}'" for r in sorted(MESSAGE_ROLES))


def _check_content(content: Any, param: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise invalid(param, "a string or an array of content parts", content)
    for index, part in enumerate(content):
        where = f"{param}[{index}]"
        if not isinstance(part, dict):
            raise invalid(where, "an object", part)
        kind = part.get("type")
        if not isinstance(kind, str):
            raise invalid(f"{where}.type", "a string", kind)
        if kind == "text" and not isinstance(part.get("text"), str):
            raise invalid(f"{where}.text", "a string", part.get("text"))


def _check_message(message: Any, param: str) -> None:
    if not isinstance(message, dict):
        raise invalid(param, "an object", message)
    role = message.get("role")
    if not isinstance(role, str) or role not in MESSAGE_ROLES:
        raise BadRequest(
            f"Invalid value for '{param}.role': expected one of {_ROLES}, got {role!r}.",
            param=f"{param}.role",
            code="invalid_value",
        )
    _check_content(message.get("content"), f"{param}.content")
    for key in ("name", "tool_call_id"):
        value = message.get(key)
        if value is not None and not isinstance(value, str):
            raise invalid(f"{param}.{key}", "a string", value)
    function_call = message.get("function_call")
    if function_call is not None and not isinstance(function_call, dict):
        raise invalid(f"{param}.function_call", "an object", function_call)
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return
    if not isinstance(tool_calls, list):
        raise invalid(f"{param}.tool_calls", "an array", tool_calls)
    for index, call in enumerate(tool_calls):
        where = f"{param}.tool_calls[{index}]"
        if not isinstance(call, dict):
            raise invalid(where, "an object", call)
        function = call.get("function")
        if function is not None and not isinstance(function, dict):
            raise invalid(f"{where}.function", "an object", function)


def _validate(message: Any, index: int) -> None:
    _check_message(message, f"messages[{index}]")


def parse_chat_request(
    raw: bytes,
    known: KnownMessages | None = None,
    recent: RecentBodies | None = None,
    hint: str | None = None,
) -> ClientRequest:
    """Parse and validate a body; raises BadRequest with OpenAI's wording where it has one.

    With ``known``, messages are validated and hashed in the same walk, and a message this
    process already validated is neither validated nor canonicalized again. With ``recent`` as
    well, a body extending one parsed a moment ago is parsed from where it differs (``hint``:
    the client's name for the conversation, which says where to look first)."""
    if known is not None and recent is not None:
        extension = recent.extend(raw, hint=hint)
        if extension is not None:
            return _extended(raw, extension, known, recent, hint)
    body = parse_object_with_model(raw)
    if "messages" not in body:
        raise BadRequest(
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    messages = body["messages"]
    if not isinstance(messages, list):
        raise invalid("messages", "an array", messages)
    digests, lineage = None, None
    if known is None:
        for index, message in enumerate(messages):
            _validate(message, index)
    else:
        digests = known.digests(messages, _validate)
        if recent is not None:
            lineage = recent.remember(raw, messages, digests, hint=hint)
    return _request(raw, body, messages, digests, lineage)


def _extended(
    raw: bytes,
    extension: Extension,
    known: KnownMessages,
    recent: RecentBodies,
    hint: str | None,
) -> ClientRequest:
    """The rest of a body a remembered one begins: only its new messages are validated and
    hashed (the others passed both when the remembered body was parsed)."""
    body = check_object_with_model(extension.body)
    messages = body["messages"]
    first = extension.known
    new = known.digests(messages[first:], lambda message, index: _validate(message, first + index))
    digests = first_of(extension.base.digests, first, new)
    lineage = recent.remember(raw, messages, digests, replaces=extension, hint=hint)
    return _request(raw, body, messages, digests, lineage)


def _request(
    raw: bytes,
    body: dict[str, Any],
    messages: list[Any],
    digests: list[str] | None,
    lineage: Lineage | None,
) -> ClientRequest:
    return ClientRequest(
        body=body,
        model=body["model"],
        messages=messages,
        stream=check_stream(body),
        digests=digests,
        raw=raw,
        wire=CHAT,
        lineage=lineage,
    )


def chat_payload(request: ClientRequest, surface: Surface) -> bytes:
    """The client's body with only ``messages`` replaced by ``surface``.

    The body was read with orjson alone, which turns integers beyond 64 bits into floats; a
    body that may hold one (rare) is read again losslessly, and the surface is rebuilt from
    that reading's messages."""
    if not request.may_hold_a_big_integer():
        return jsonio.dumps({**request.body, "messages": surface.messages})
    exact = jsonio.loads(request.raw)
    sent: list[Message] = exact["messages"]
    one_each = [(index,) for index in range(len(sent))]
    messages = written_back(surface, one_each, sent, _with_pruned_content, lambda m: m)
    return jsonio.dumps({**exact, "messages": messages})


def _with_pruned_content(sent: Message, pruned: Message) -> Message:
    return {**sent, "content": pruned.get("content")}


def cache_safe_chat_summary(request: ClientRequest, body: dict[str, Any]) -> SummaryPost | None:
    """The chat-form summary call ``body`` with the client's ``PROMPT_CACHE_OPTIONS``: its
    messages and tools are the conversation's as forwarded already, but OpenAI routes a call
    without the client's ``prompt_cache_key`` to another cache than the one its requests
    wrote. None when the client sent none of them (the rebuilt call is the same). Made again
    without them only when the upstream refused the body: any other failure the same call
    would have again."""
    fields = {name: request.body[name] for name in PROMPT_CACHE_OPTIONS if name in request.body}
    if not fields:
        return None
    return replace(chat_summary({**body, **fields}), rebuilt_after=frozenset({"http_400"}))


class ChatFormat(WireFormat):
    """``POST /v1/chat/completions``: the messages are the body's own."""

    name: ClassVar[str] = "chat"
    family: ClassVar[ApiFamily] = ApiFamily.OPENAI
    upstream_path: ClassVar[str] = "/chat/completions"
    answer_cap_fields: ClassVar[tuple[str, ...]] = ("max_completion_tokens", "max_tokens")
    stored_by_default: ClassVar[bool] = False

    def parse(self, raw: bytes, context: ParseContext) -> ClientRequest:
        return parse_chat_request(raw, context.known, context.recent, context.session_id)

    def payload(self, request: ClientRequest, surface: Surface) -> bytes:
        return chat_payload(request, surface)

    def cache_safe_summary(
        self, request: ClientRequest, prefix: Surface, body: dict[str, Any]
    ) -> SummaryPost | None:
        return cache_safe_chat_summary(request, body)

    def rebuilt_summary(self, body: dict[str, Any]) -> SummaryPost:
        return chat_summary(body)


CHAT = ChatFormat()
