"""The bytes sent upstream for a surface: the client's body with only its messages (or
``input`` items) replaced, every other field as sent."""

from __future__ import annotations

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import Surface, written_back
from compaction_proxy.formats.messages import messages_payload
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.responses import responses_payload
from compaction_proxy.parsing import jsonio


def payload_for(client_request: ClientRequest, surface: Surface) -> bytes:
    """The client's body with only its messages replaced by ``surface``; every other field,
    and every message the surface keeps, as sent.

    The body was read with orjson alone, which turns integers beyond 64 bits into floats; a
    body that may hold one (rare) is read again losslessly, and the surface is rebuilt from
    that reading's messages."""
    if client_request.api == "responses":
        return responses_payload(client_request, surface)
    if client_request.api == "messages":
        return messages_payload(client_request, surface)
    if not client_request.may_hold_a_big_integer():
        return jsonio.dumps({**client_request.body, "messages": surface.messages})
    exact = jsonio.loads(client_request.raw)
    sent: list[Message] = exact["messages"]
    one_each = [(index,) for index in range(len(sent))]
    messages = written_back(surface, one_each, sent, _with_pruned_content, lambda m: m)
    return jsonio.dumps({**exact, "messages": messages})


def _with_pruned_content(sent: Message, pruned: Message) -> Message:
    return {**sent, "content": pruned.get("content")}
