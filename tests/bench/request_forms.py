"""A transcript's requests as each wire format's agents send them, for the request-path benches
(``overhead``, ``instruction_count``): the path, the body and the headers that authenticate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.transcripts import Message, as_messages_body, as_responses_body

MODEL = "bench-model"


@dataclass(frozen=True)
class RequestForm:
    """One wire format's requests: ``POST path`` with ``body_of(history)``; Anthropic's clients
    send their key as ``x-api-key``, the others as a bearer token."""

    path: str
    body_of: Callable[[list[Message]], dict[str, Any]]
    anthropic_key: bool = False

    def headers(self, session: str, key: str = "bench") -> dict[str, str]:
        auth = (
            {"x-api-key": key, "anthropic-version": "2023-06-01"}
            if self.anthropic_key
            else {"Authorization": f"Bearer {key}"}
        )
        return {**auth, "Content-Type": "application/json", "X-Session-Id": session}


REQUEST_FORMS: dict[str, RequestForm] = {
    "chat": RequestForm(
        "/v1/chat/completions", lambda history: {"model": MODEL, "messages": history}
    ),
    "responses": RequestForm("/v1/responses", lambda history: as_responses_body(MODEL, history)),
    "messages": RequestForm(
        "/v1/messages", lambda history: as_messages_body(MODEL, history), anthropic_key=True
    ),
}
CHAT = REQUEST_FORMS["chat"]
