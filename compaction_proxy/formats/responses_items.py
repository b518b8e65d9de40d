"""The Responses API at the edge: ``input`` items in, chat-shaped messages for the shared core,
and the surface written back as items.

The core (chain hashes, records, meter, pruning, summaries, recovery) works on chat messages.
A Responses body is translated into them one way, item by item, and the surface the core
derives is written back from the client's own items, so an item the proxy does not replace
reaches the upstream exactly as sent:

* a ``message`` item (any role; ``type`` may be left out) is a chat message of its role, its
  ``input_text``/``output_text`` parts as text parts;
* a ``function_call`` is an assistant message with one tool call (its ``call_id`` as the id),
  a ``function_call_output`` a ``tool`` message answering it: pairing works as in chat;
* a ``reasoning`` item, encrypted or not, joins the item after it in one message: the
  provider needs it kept with the call or message it led to, so no span ever separates them,
  and its text is never given to the summarizer (the message names it, nothing more);
* any other item is opaque: an assistant message carrying its JSON, never pruned, kept in
  place;
* ``instructions`` is a system message at the head, for measuring only: the field itself is
  sent as it came.

Pure: no I/O. Raises ``BadRequest`` for what the upstream would reject anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import Surface, written_back
from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import (
    ClientRequest,
)
from compaction_proxy.formats.sealed_checkpoints import is_sealed
from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio

MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text", "refusal", "summary_text"})


def _invalid(param: str, expected: str) -> BadRequest:
    return BadRequest(f"Invalid '{param}': expected {expected}.", param=param, code="invalid_type")


def _content_as_chat(content: Any, param: str) -> Any:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(param, "a string or an array of content parts")
    parts: list[Any] = []
    for index, part in enumerate(content):
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise _invalid(f"{param}[{index}]", "an object with a string 'type'")
        if part["type"] in TEXT_PARTS:
            text = part.get("text")
            if not isinstance(text, str):
                raise _invalid(f"{param}[{index}].text", "a string")
            parts.append({"type": "text", "text": text})
        else:
            parts.append(part)
    return parts


def _string(item: dict[str, Any], key: str, param: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _invalid(f"{param}.{key}", "a string")
    return value


def item_message(item: Any, param: str) -> Message:
    """The chat message one input item stands for (reasoning items are joined elsewhere)."""
    if not isinstance(item, dict):
        raise _invalid(param, "an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if not isinstance(role, str) or role not in MESSAGE_ROLES:
            roles = ", ".join(sorted(MESSAGE_ROLES))
            raise _invalid(f"{param}.role", f"one of {roles}")
        content = item.get("content")
        if not isinstance(content, str):  # a string, most items: taken as it is
            content = _content_as_chat(content, f"{param}.content")
        return {"role": role, "content": content}
    if kind == "function_call":
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
        if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(arguments, str)):
            for key in ("call_id", "name", "arguments"):
                _string(item, key, param)  # raises, naming the first that is not a string
        function = {"name": name, "arguments": arguments}
        call = {"id": call_id, "type": "function", "function": function}
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    if kind == "function_call_output":
        output, call_id = item.get("output"), item.get("call_id")
        if not isinstance(output, str):
            output = _content_as_chat(output, f"{param}.output")
        if not isinstance(call_id, str):
            _string(item, "call_id", param)  # raises
        return {"role": "tool", "tool_call_id": call_id, "content": output}
    if not isinstance(kind, str):
        raise _invalid(f"{param}.type", "a string")
    # Opaque: kept in place, carried as its JSON (what a summary would read of it).
    return {"role": "assistant", "name": f"item:{kind}", "content": jsonio.dumps(item).decode()}


def _reasoning_name(items: Sequence[dict[str, Any]]) -> str:
    """Names the reasoning items a message carries, by id (or their encrypted content's
    digest when an item has no id), so their identity is part of the message's."""
    names = []
    for item in items:
        ident = item.get("id")
        if not isinstance(ident, str):
            ident = jsonio.dumps(item.get("encrypted_content")).hex()[:32]
        names.append(ident)
    return "reasoning:" + ",".join(names)


@frozen
class Translated:
    """A Responses body as chat messages: ``messages[i]`` stands for ``input[j]`` for every j
    in ``groups[i]`` (empty for the instructions' head message)."""

    messages: list[Message]
    groups: list[tuple[int, ...]]
    sealed: bool = False  # it holds a compaction item the proxy made (sealed_checkpoints)


def translate(body: dict[str, Any], prefix: Translated | None = None) -> Translated:
    """The chat messages for a Responses body's ``instructions`` and ``input``. ``prefix``:
    messages already made of this very body's instructions and first items (see
    ``_reusable``), taken as they are; the items after theirs are translated."""
    messages: list[Message] = []
    groups: list[tuple[int, ...]] = []
    if prefix is not None:
        messages, groups = list(prefix.messages), list(prefix.groups)
    elif (instructions := body.get("instructions")) is not None:
        if not isinstance(instructions, str):
            raise _invalid("instructions", "a string")
        messages.append({"role": "system", "content": instructions})
        groups.append(())
    raw_input = body.get("input")
    if isinstance(raw_input, str):
        items: list[Any] = [{"role": "user", "content": raw_input}]
    elif isinstance(raw_input, list):
        items = raw_input
    else:
        raise _invalid("input", "a string or an array of items")
    sealed = prefix.sealed if prefix is not None else False
    pending: list[int] = []  # reasoning items waiting for the item they led to
    # Groups are made in item order and a turn's group only grows by later items, so the
    # last non-empty group ends at the last item translated (the head's group is empty).
    start = next((group[-1] for group in reversed(groups) if group), -1) + 1
    for index in range(start, len(items)):
        item = items[index]
        if isinstance(item, dict) and item.get("type") == "reasoning":
            pending.append(index)
            continue
        message = item_message(item, f"input[{index}]")
        if message.get("name") == "item:compaction" and is_sealed(item.get("encrypted_content")):
            sealed = True
        group = (*pending, index)
        if _continues_a_turn(messages, groups, message, group):
            # One assistant turn, as chat has it: its text and all its calls in one message,
            # so the results that follow answer one message (chat's pairing rule).
            turn = messages[-1] = {**messages[-1]}  # a copy: a prefix's messages are shared
            turn["tool_calls"] = [*(turn.get("tool_calls") or []), *message["tool_calls"]]
            reasoning = [i for i in (*groups[-1], *group) if items[i].get("type") == "reasoning"]
            if reasoning:
                turn["name"] = _reasoning_name([items[i] for i in reasoning])
            groups[-1] = (*groups[-1], *group)
        else:
            if pending:
                message["name"] = _reasoning_name([items[i] for i in pending])
            messages.append(message)
            groups.append(group)
        pending = []
    if pending:  # reasoning at the very end: kept as an item of its own
        messages.append(
            {
                "role": "assistant",
                "content": None,
                "name": _reasoning_name([items[i] for i in pending]),
            }
        )
        groups.append(tuple(pending))
    return Translated(messages, groups, sealed)


def _continues_a_turn(
    messages: list[Message], groups: list[tuple[int, ...]], call: Message, group: tuple[int, ...]
) -> bool:
    """Whether ``call`` (a function call, with the reasoning before it) directly follows an
    assistant message or call of the same turn."""
    if not call.get("tool_calls") or not messages or not groups[-1]:
        return False
    previous = messages[-1]
    opaque = str(previous.get("name") or "").startswith("item:")
    return previous.get("role") == "assistant" and not opaque and groups[-1][-1] + 1 == group[0]


def _pruned_item(item: dict[str, Any], pruned: Message) -> dict[str, Any]:
    """``item`` with the text the pruner left in place of its content."""
    text = text_of(pruned.get("content")) or ""
    if item.get("type") == "function_call_output":
        return {**item, "output": text}
    return {**item, "content": text}


def _summary_item(message: Message) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text_of(message.get("content")) or ""}


def items_for(surface: Surface, groups: Sequence[tuple[int, ...]], sent: list[Any]) -> list[Any]:
    """The ``input`` to send for ``surface``: the client's own items wherever the surface keeps
    a message, a summary message where a checkpoint stands, pruned content where a prune does.
    ``sent`` is the client's ``input`` list; ``groups`` maps messages (head, then body) to it."""
    return written_back(surface, groups, sent, _pruned_item, _summary_item)


def sent_items(request: ClientRequest) -> tuple[dict[str, Any], list[Any]]:
    """The client's body and its ``input`` as items, as sent (read again losslessly when the
    body may hold integers beyond 64 bits)."""
    body = request.lossless_body()
    raw_input = body.get("input")
    sent = raw_input if isinstance(raw_input, list) else [{"role": "user", "content": raw_input}]
    return body, sent
