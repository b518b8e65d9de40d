"""Validation of incoming chat-completion bodies.

Only what the proxy relies on is checked (a JSON object, ``model``, ``messages`` as a list of
objects with a known ``role``); every other field, known to us or not, is kept as sent and
reaches the upstream unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, ValidationError

from proxy.errors import BadRequest

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class _Message(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: Role


class _ChatBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: str
    messages: list[_Message]
    stream: bool | None = None


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
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
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
    return ChatRequest(
        body=body,
        model=parsed.model,
        messages=body["messages"],
        stream=bool(parsed.stream),
    )
