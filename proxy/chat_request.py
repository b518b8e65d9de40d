"""Validation of incoming chat-completion bodies.

Every field the proxy reads is checked for its type, at every level it reads: ``model``,
``messages`` as a list of objects, each with a known ``role``, ``content`` as null, a string or a
list of part objects (a text part's ``text`` a string), ``tool_calls`` as a list of objects,
``name`` and ``tool_call_id`` as strings, ``function_call`` as an object. What OpenAI would reject
anyway gets a 400 in its shape before anything is forwarded. Every other field, known to us or
not, is kept as sent and reaches the upstream unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from proxy import jsonio
from proxy.conversation import MESSAGE_ROLES
from proxy.errors import BadRequest
from proxy.known_messages import KnownMessages

_ROLES = ", ".join(f"'{r}'" for r in sorted(MESSAGE_ROLES))


def _invalid(param: str, expected: str, got: Any) -> BadRequest:
    return BadRequest(
        f"Invalid type for '{param}': expected {expected}, but got {_kind(got)}.",
        param=param,
        code="invalid_type",
    )


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def _check_content(content: Any, param: str) -> None:
    if content is None or isinstance(content, str):
        return
    if not isinstance(content, list):
        raise _invalid(param, "a string or an array of content parts", content)
    for index, part in enumerate(content):
        where = f"{param}[{index}]"
        if not isinstance(part, dict):
            raise _invalid(where, "an object", part)
        kind = part.get("type")
        if not isinstance(kind, str):
            raise _invalid(f"{where}.type", "a string", kind)
        if kind == "text" and not isinstance(part.get("text"), str):
            raise _invalid(f"{where}.text", "a string", part.get("text"))


def _check_message(message: Any, param: str) -> None:
    if not isinstance(message, dict):
        raise _invalid(param, "an object", message)
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
            raise _invalid(f"{param}.{key}", "a string", value)
    function_call = message.get("function_call")
    if function_call is not None and not isinstance(function_call, dict):
        raise _invalid(f"{param}.function_call", "an object", function_call)
    tool_calls = message.get("tool_calls")
    if tool_calls is None:
        return
    if not isinstance(tool_calls, list):
        raise _invalid(f"{param}.tool_calls", "an array", tool_calls)
    for index, call in enumerate(tool_calls):
        where = f"{param}.tool_calls[{index}]"
        if not isinstance(call, dict):
            raise _invalid(where, "an object", call)
        function = call.get("function")
        if function is not None and not isinstance(function, dict):
            raise _invalid(f"{where}.function", "an object", function)


@dataclass(frozen=True)
class ChatRequest:
    """A validated body, as chat messages whatever API it came in. ``body`` is the client's
    object as parsed, never modified.

    ``api`` says which endpoint it goes to and how its surface is written back: ``chat``
    (``messages`` are the body's own) or ``responses`` (``messages`` translated from the
    ``input`` items, ``groups[i]`` the items ``messages[i]`` stands for; see
    ``proxy.responses_request``)."""

    body: dict[str, Any]
    model: str
    messages: list[dict[str, Any]]
    stream: bool
    digests: list[str] | None = None  # each message's ``message_digest``, when computed
    raw: bytes = b""  # the body as received (parsed with ``jsonio.loads_fast``)
    api: Literal["chat", "responses"] = "chat"
    groups: list[tuple[int, ...]] | None = None

    @property
    def upstream_path(self) -> str:
        return "/responses" if self.api == "responses" else "/chat/completions"


def _validate(message: Any, index: int) -> None:
    _check_message(message, f"messages[{index}]")


def parse_object_with_model(raw: bytes) -> dict[str, Any]:
    """A JSON object naming its ``model`` as a string (what every API here needs first)."""
    try:
        body = jsonio.loads_fast(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if "model" not in body:
        raise BadRequest("you must provide a model parameter", param="model")
    if not isinstance(body["model"], str):
        raise _invalid("model", "a string", body["model"])
    return body


def check_stream(body: dict[str, Any]) -> bool:
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _invalid("stream", "a boolean", stream)
    return bool(stream)


def parse_chat_request(raw: bytes, known: KnownMessages | None = None) -> ChatRequest:
    """Parse and validate a body; raises BadRequest with OpenAI's wording where it has one.

    With ``known``, messages are validated and hashed in the same walk, and a message this
    process already validated is neither validated nor canonicalized again."""
    body = parse_object_with_model(raw)
    if "messages" not in body:
        raise BadRequest(
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    messages = body["messages"]
    if not isinstance(messages, list):
        raise _invalid("messages", "an array", messages)
    digests = None
    if known is None:
        for index, message in enumerate(messages):
            _validate(message, index)
    else:
        digests = known.digests(messages, _validate)
    return ChatRequest(
        body=body,
        model=body["model"],
        messages=messages,
        stream=check_stream(body),
        digests=digests,
        raw=raw,
    )
