"""Validation of incoming chat-completion bodies.

Only what the proxy relies on is checked (a JSON object, ``model``, ``messages`` as a list of
objects with a known ``role``); every other field, known to us or not, is kept as sent and
reaches the upstream unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from proxy import jsonio
from proxy.conversation import MESSAGE_ROLES
from proxy.errors import BadRequest


class _ChatBody(BaseModel):
    """The top-level fields the proxy relies on. Messages are checked by hand below: a
    validating model per message would copy every message of a long history on each request."""

    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[Any]
    stream: bool | None = None


def _check_messages(messages: list[Any]) -> None:
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequest(
                f"Invalid value for 'messages[{index}]': a message must be an object.",
                param=f"messages[{index}]",
                code="invalid_value",
            )
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            roles = ", ".join(f"'{r}'" for r in sorted(MESSAGE_ROLES))
            raise BadRequest(
                f"Invalid value for 'messages[{index}].role': expected one of {roles}, "
                f"got {role!r}.",
                param=f"messages[{index}].role",
                code="invalid_value",
            )


@dataclass(frozen=True)
class ChatRequest:
    """A validated body. ``body`` is the client's object as parsed, never modified."""

    body: dict[str, Any]
    model: str
    messages: list[dict[str, Any]]
    stream: bool


def _param(loc: tuple[int | str, ...]) -> str:
    param = ""
    for part in loc:
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    return param


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Parse and validate a body; raises BadRequest with OpenAI's wording where it has one."""
    try:
        body = jsonio.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise BadRequest(f"We could not parse the JSON body of your request: {exc}") from exc
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    if "model" not in body:
        raise BadRequest("you must provide a model parameter", param="model")
    if "messages" not in body:
        raise BadRequest(
            "Missing required parameter: 'messages'.",
            param="messages",
            code="missing_required_parameter",
        )
    try:
        parsed = _ChatBody.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(first["loc"])
        raise BadRequest(
            f"Invalid value for '{param}': {first['msg']}", param=param, code="invalid_value"
        ) from exc
    _check_messages(parsed.messages)
    return ChatRequest(
        body=body,
        model=parsed.model,
        messages=body["messages"],
        stream=bool(parsed.stream),
    )
