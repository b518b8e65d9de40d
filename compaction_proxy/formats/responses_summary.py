"""Summary calls in OpenAI's Responses format, cache-safe (pure).

A conversation a client holds in Responses form is cached by the provider as it was sent: its
``instructions``, its tools and its input items. A summary call rebuilt in chat form shares
none of that prefix's text as the provider renders it, so it pays for the whole span again
(docs/perf.md has the figures). The cache-safe call starts as the conversation's next request
would: the client's instructions, tools, ``tool_choice`` and cache options (its key, where
breakpoints go, how long entries live) as sent, then the items the proxy forwarded from the
head to the span's end, byte for byte (read losslessly, as the request was forwarded:
``responses.sent_items``), then the instruction as a user message; nothing is stored
(``store: false``).

It is not made for a summary model other than the conversation's (whose cache it could not
read), for a span with messages cut for the call, or when the client's ``tool_choice`` forces
a call (the answer would be a call, never the summary); and the caller makes the chat-form call
when this one gives no summary (offered the client's tools, a model may answer with a call).
"""

from __future__ import annotations

from typing import Any

from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.responses_items import items_for, sent_items
from compaction_proxy.formats.wire import PROMPT_CACHE_OPTIONS

# Request fields that make the cached prefix, or steer which cache a request reads, where it
# writes and how long it keeps it: sent on the cache-safe call as the client sent them.
CACHE_FIELDS = ("instructions", "tools", "tool_choice", *PROMPT_CACHE_OPTIONS)


def forces_a_call(tool_choice: Any) -> bool:
    """Whether a Responses ``tool_choice`` makes the model call a tool (``required``, or a
    named tool)."""
    return tool_choice == "required" or isinstance(tool_choice, dict)


def cache_safe_responses_body(
    request: ClientRequest, prefix: Surface, chat_body: dict[str, Any]
) -> dict[str, Any] | None:
    """The cache-safe summary call (see the module's docstring) for the client's Responses
    ``request``: ``prefix`` is the surface from the head to the span's end, exactly as
    forwarded; ``chat_body`` the chat-form summary request (its model, cap and instruction).
    None when the request is no stateless Responses request, or it forces a call."""
    if request.groups is None:
        return None
    if forces_a_call(request.body.get("tool_choice")):
        return None
    body, sent = sent_items(request)
    items = items_for(prefix, request.groups, sent)
    if not items:
        return None
    instruction = chat_body["messages"][-1]["content"]
    cap = chat_body.get("max_tokens") or chat_body.get("max_completion_tokens") or 1
    call: dict[str, Any] = {
        "model": chat_body["model"],
        "input": [*items, {"type": "message", "role": "user", "content": instruction}],
        "max_output_tokens": cap,
        "store": False,
    }
    call.update({field: body[field] for field in CACHE_FIELDS if field in body})
    return call


def responses_summary_text(answer: Any) -> tuple[str, bool]:
    """A Responses answer's output text, and whether it stopped at ``max_output_tokens``;
    raises ``ValueError`` for what is not a Responses answer."""
    if not isinstance(answer, dict) or not isinstance(answer.get("output"), list):
        raise ValueError("not a Responses answer")
    texts: list[str] = []
    for item in answer["output"]:
        if not isinstance(item, dict) or item.get("type") != "message":
            continue
        content = item.get("content")
        if isinstance(content, list):
            texts += [
                part.get("text", "")
                for part in content
                if isinstance(part, dict) and part.get("type") == "output_text"
            ]
    details = answer.get("incomplete_details")
    cut = isinstance(details, dict) and details.get("reason") == "max_output_tokens"
    return "".join(texts), cut
