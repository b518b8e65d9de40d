"""Anthropic's Messages API, both ways: turns of content blocks in, chat-shaped messages for the
shared core, and the surface written back as turns (pure; the adapter is ``formats.anthropic``).

The core works on chat messages. A Messages body is translated into them one way, and the
surface the core derives is written back from the client's own blocks, so a block the proxy does
not replace reaches the upstream exactly as sent:

* ``system`` (a string or text blocks) is a system message at the head, for measuring only: the
  field itself is sent as it came;
* a turn whose content is a string is a message of its role with that string;
* a user turn's (or any other role's but the assistant's: Claude Code sends ``system`` turns
  inside ``messages``) ``tool_result`` blocks are each a ``tool`` message answering its ``tool_use``
  (chat's pairing rule then keeps a call and its result on one side of every cut), and its
  other blocks, in runs, user messages (text as text parts, anything else kept as a part);
* an assistant turn is one assistant message: its text, its ``tool_use`` blocks as tool calls,
  and the identity of its ``thinking``/``redacted_thinking`` blocks in its name (the chat form
  never holds their text; the blocks themselves go on byte for byte, in summary calls too when
  those start as the client's next request would: ``anthropic_summary``); any block the proxy
  does not know is a part of it, kept in place, never pruned.

Written back, each turn keeps its role and its blocks; a checkpoint is a user turn of its own
(the API allows consecutive user turns, and the first turn stays the user's), ending in a
``cache_control`` breakpoint when the client caches and has fewer than the API's 4. Raises
``BadRequest`` for what the upstream would reject anyway.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from itertools import repeat
from operator import itemgetter, methodcaller
from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import Surface, written_back
from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.sealed_checkpoints import is_sealed
from compaction_proxy.frozen import frozen
from compaction_proxy.parsing import jsonio

THINKING = frozenset({"thinking", "redacted_thinking"})
_TYPE, _TYPE_OR_NONE = itemgetter("type"), methodcaller("get", "type")
MAX_BREAKPOINTS = 4  # cache_control blocks the API accepts in one request
EPHEMERAL = {"type": "ephemeral"}


def _invalid(param: str, expected: str) -> BadRequest:
    return BadRequest(f"{param}: expected {expected}", param=param, code="invalid_type")


@frozen
class Entry:
    """One piece of what the client sent: a block of turn ``turn`` (or the turn's whole
    string content). ``turn`` is None for a checkpoint's turn, which stands alone."""

    turn: int | None
    role: str
    # A block (a dict); the turn's whole content when that is a string, or an empty list
    content: Any


@frozen
class TranslatedMessages:
    """A Messages body as chat messages: ``messages[i]`` stands for ``entries[j]`` for every
    ``j`` in ``groups[i]`` (none for the system prompt's head message)."""

    messages: list[Message]
    groups: list[tuple[int, ...]]
    entries: list[Entry]
    sealed: bool = False  # it holds a compaction block the proxy made (sealed_checkpoints)
    system: Any = None  # the body's ``system`` as sent, which the head message stands for


def _system_text(system: Any) -> str:
    if isinstance(system, str):
        return system
    if not isinstance(system, list):
        raise _invalid("system", "a string or an array of text blocks")
    texts = []
    for index, block in enumerate(system):
        if not isinstance(block, dict) or not isinstance(block.get("text"), str):
            raise _invalid(f"system.{index}", "a text block")
        texts.append(block["text"])
    return "\n\n".join(texts)


def _all_blocks(content: list[Any]) -> bool:
    """Whether every item of ``content`` is a content block (an object with a string
    ``type``), checked in C: every block of a new turn is."""
    return all(map(isinstance, content, repeat(dict))) and all(
        map(isinstance, map(_TYPE_OR_NONE, content), repeat(str))
    )


def _block(block: Any, turn_param: str, index: int) -> dict[str, Any]:
    """``block`` (``turn_param``'s content block ``index``) when it is one; the parameter is
    named only when it is not (every block of a new turn passes here)."""
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _invalid(f"{turn_param}.content.{index}", "a content block with a string 'type'")
    return block


def _part(block: dict[str, Any], param: str, index: int | None = None) -> dict[str, Any]:
    """A block as a chat content part: text as text, anything else as it is. ``param``
    names the block (with ``index``, its item ``index``) when it is invalid."""
    if block["type"] == "text":
        if not isinstance(block.get("text"), str):
            where = param if index is None else f"{param}.{index}"
            raise _invalid(f"{where}.text", "a string")
        return {"type": "text", "text": block["text"]}
    return block


def _tool_result(block: dict[str, Any], turn_param: str, offset: int) -> Message:
    """The tool message for ``block``, block ``offset`` of the turn ``turn_param`` names (a
    parameter named only when invalid)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str):
        raise _invalid(f"{turn_param}.content.{offset}.tool_use_id", "a string")
    content = block.get("content")
    if isinstance(content, list):
        param = f"{turn_param}.content.{offset}"
        items = f"{param}.content"
        content = [_part(_block(b, param, i), items, i) for i, b in enumerate(content)]
    elif content is not None and not isinstance(content, str):
        raise _invalid(
            f"{turn_param}.content.{offset}.content", "a string or an array of content blocks"
        )
    return {"role": "tool", "tool_call_id": call_id, "content": content or ""}


def _thinking_name(blocks: Sequence[dict[str, Any]]) -> str:
    """Names a turn's thinking blocks by their signatures (or data), so their identity is part
    of the message's."""
    digest = hashlib.blake2b(jsonio.dumps(list(blocks)), digest_size=16)
    return "thinking:" + digest.hexdigest()


def _assistant(blocks: Sequence[dict[str, Any]], param: str) -> Message:
    parts: list[Any] = []
    calls: list[dict[str, Any]] = []
    thinking: list[dict[str, Any]] = []
    for index, block in enumerate(blocks):
        if block["type"] == "tool_use":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str):
                raise _invalid(f"{param}.{index}", "a tool_use block with a string 'id' and 'name'")
            arguments = jsonio.dumps(block.get("input", {})).decode()
            function = {"name": block["name"], "arguments": arguments}
            calls.append({"id": block["id"], "type": "function", "function": function})
        elif block["type"] in THINKING:
            thinking.append(block)
        else:
            parts.append(_part(block, param, index))
    message: Message = {"role": "assistant", "content": parts or None}
    if calls:
        message["tool_calls"] = calls
    if thinking:
        message["name"] = _thinking_name(thinking)
    return message


def system_message(body: dict[str, Any]) -> Message | None:
    """The head message standing for the body's ``system``, if it has one."""
    system = body.get("system")
    return None if system is None else {"role": "system", "content": _system_text(system)}


def translate_messages(
    body: dict[str, Any], prefix: TranslatedMessages | None = None, start: int = 0
) -> TranslatedMessages:
    """The chat messages for a Messages body's ``system`` and ``messages``; with ``prefix``,
    the translation of its first ``start`` turns and its head (a turn's messages depend on
    that turn alone), the rest translated after it. The prefix's lists are the caller's to
    give: they are extended in place, not copied (``_reusable`` slices them for this body)."""
    turns = body.get("messages")
    if prefix is not None:
        messages, groups, entries = prefix.messages, prefix.groups, prefix.entries
        sealed = prefix.sealed
    else:
        sealed = False
        messages, groups, entries = [], [], []
        head = system_message(body)
        if head is not None:
            messages.append(head)
            groups.append(())
        start = 0
    if not isinstance(turns, list):
        raise _invalid("messages", "an array of messages")
    for turn_index in range(start, len(turns)):
        turn = turns[turn_index]
        param = f"messages.{turn_index}"
        role = turn.get("role") if isinstance(turn, dict) else None
        if not isinstance(role, str) or not role:
            raise _invalid(f"{param}.role", "a role such as 'user' or 'assistant'")
        content = turn.get("content")
        if isinstance(content, str) or content == []:
            entries.append(Entry(turn_index, role, content))
            messages.append({"role": role, "content": content or ""})
            groups.append((len(entries) - 1,))
            continue
        if not isinstance(content, list):
            raise _invalid(f"{param}.content", "a string or an array of content blocks")
        if not _all_blocks(content):
            for index, item in enumerate(content):
                _block(item, param, index)  # raises, naming the first that is not a block
        blocks: list[dict[str, Any]] = content
        sealed = sealed or (
            "compaction" in map(_TYPE, blocks)
            and any(
                b["type"] == "compaction" and is_sealed(b.get("encrypted_content")) for b in blocks
            )
        )
        first = len(entries)
        entries += map(Entry, repeat(turn_index), repeat(role), blocks)
        if role == "assistant":
            messages.append(_assistant(blocks, f"{param}.content"))
            groups.append(tuple(range(first, len(entries))))
            continue
        run: list[int] = []  # the user blocks waiting to be one message
        where = f"{param}.content"
        for offset, block in enumerate(blocks):
            if block["type"] == "tool_result":
                _close_run(messages, groups, entries, run, where, first)
                messages.append(_tool_result(block, param, offset))
                groups.append((first + offset,))
            else:
                run.append(first + offset)
        _close_run(messages, groups, entries, run, where, first)
    return TranslatedMessages(messages, groups, entries, sealed, body.get("system"))


# Blocks whose translation leaves their own ``cache_control`` out (text as a text part, a call
# as a tool call, a result as a tool message): moving a breakpoint on them moves nothing in it.
_BREAKPOINT_FREE = frozenset({"text", "tool_use", "tool_result"})


def _unmarked(block: dict[str, Any]) -> dict[str, Any]:
    unmarked = block.copy()  # copied and popped in C: a comprehension is a loop in Python
    unmarked.pop("cache_control", None)
    return unmarked


def rebreakpointed(turn: Any, turn_index: int, old: Sequence[Entry]) -> list[Entry] | None:
    """The entries of ``turn`` when it holds the very blocks of ``old`` (a remembered body's
    entries of that turn) but for the ``cache_control`` breakpoints on them: Claude Code moves
    its breakpoint off the turn it sent last on every request. Its translation is then the
    remembered one, message for message; only the entries, which are written back as sent,
    are the new blocks. None for any other difference, and where a breakpoint moved on a
    block whose translation keeps it (an image, say, is a part as sent)."""
    content = turn.get("content") if isinstance(turn, dict) else None
    if not isinstance(content, list) or not old or len(content) != len(old):
        return None
    role = turn.get("role")
    if role != old[0].role:
        return None
    for block, entry in zip(content, old, strict=True):
        was = entry.content
        if block == was:
            continue
        if (
            not isinstance(block, dict)
            or not isinstance(was, dict)
            or block.get("type") not in _BREAKPOINT_FREE
            or _unmarked(block) != _unmarked(was)
        ):
            return None
    return [Entry(turn_index, role, block) for block in content]


def _close_run(
    messages: list[Message],
    groups: list[tuple[int, ...]],
    entries: list[Entry],
    run: list[int],
    where: str,
    first: int,
) -> None:
    """The user blocks of ``run`` (entry indices; the turn's first is ``first``, its blocks
    the parameter ``where``) as one message of parts."""
    if not run:
        return
    parts = [_part(entries[i].content, where, i - first) for i in run]
    messages.append({"role": entries[run[0]].role, "content": parts})
    groups.append(tuple(run))
    run.clear()


def _pruned_entry(entry: Entry, pruned: Message) -> Entry:
    """``entry`` with the text the pruner left in place of its content."""
    text = text_of(pruned.get("content")) or ""
    if isinstance(entry.content, str):
        return Entry(entry.turn, entry.role, text)
    if entry.content.get("type") == "tool_result":
        return Entry(entry.turn, entry.role, {**entry.content, "content": text})
    return Entry(entry.turn, entry.role, {**entry.content, "type": "text", "text": text})


def _summary_entry(message: Message) -> Entry:
    text = text_of(message.get("content")) or ""
    return Entry(None, "user", {"type": "text", "text": text})


def turns_for(surface: Surface, translated: TranslatedMessages) -> list[dict[str, Any]]:
    """The ``messages`` to send for ``surface``: the client's own blocks wherever the surface
    keeps a message, in their turns; a user turn of its own where a checkpoint stands; pruned
    content where a prune does."""
    return written_turns(surface, translated)[0]


def written_turns(
    surface: Surface, translated: TranslatedMessages
) -> tuple[list[dict[str, Any]], list[int]]:
    """``turns_for``, and the indices of the checkpoints' turns in it."""
    kept = written_back(
        surface, translated.groups, translated.entries, _pruned_entry, _summary_entry
    )
    turns: list[dict[str, Any]] = []
    checkpoints: list[int] = []
    last: int | None = None
    for entry in kept:
        if entry.turn is not None and entry.turn == last:
            turns[-1]["content"].append(entry.content)
            continue
        if entry.turn is None:
            checkpoints.append(len(turns))
        whole = isinstance(entry.content, str | list)  # the turn's content, as sent
        content = entry.content if whole else [entry.content]
        turns.append({"role": entry.role, "content": content})
        last = entry.turn
    return turns, checkpoints


def _marked(value: Any) -> int:
    return 1 if isinstance(value, dict) and value.get("cache_control") else 0


def breakpoints_in(body: dict[str, Any], turns: Sequence[Any]) -> int:
    """The ``cache_control`` breakpoints a request with ``body``'s other fields and
    ``turns`` as its messages carries: in the system prompt, the tools and the turns' blocks,
    and the top-level one of automatic caching."""
    found = 1 if body.get("cache_control") else 0
    for field in ("system", "tools"):
        value = body.get(field)
        found += sum(_marked(item) for item in value) if isinstance(value, list) else 0
    for turn in turns:
        content = turn.get("content") if isinstance(turn, dict) else None
        found += sum(_marked(block) for block in content) if isinstance(content, list) else 0
    return found


def with_breakpoint_at(
    body: dict[str, Any], turns: list[dict[str, Any]], index: int
) -> list[dict[str, Any]]:
    """``turns`` with a breakpoint on the last block of turn ``index`` (a string content
    becomes the one text block it stands for), when the client caches (it sent a breakpoint
    of its own) and the API's limit leaves room for one more. The client's breakpoints are
    never moved."""
    if not 0 < breakpoints_in(body, turns) < MAX_BREAKPOINTS:
        return turns
    content = turns[index]["content"]
    blocks = [{"type": "text", "text": content}] if isinstance(content, str) else list(content)
    if not blocks or not isinstance(blocks[-1], dict):
        return turns
    blocks[-1] = {**blocks[-1], "cache_control": EPHEMERAL}
    return [*turns[:index], {**turns[index], "content": blocks}, *turns[index + 1 :]]


def with_checkpoint_breakpoint(
    body: dict[str, Any], turns: list[dict[str, Any]], checkpoints: Sequence[int]
) -> list[dict[str, Any]]:
    """``turns`` with a breakpoint at the end of the last checkpoint's turn
    (``with_breakpoint_at``), so the compacted prefix is read from cache whatever the tail
    after it does. Those of a shadowed span went with it."""
    return with_breakpoint_at(body, turns, checkpoints[-1]) if checkpoints else turns


def lossless(request: ClientRequest) -> tuple[dict[str, Any], TranslatedMessages]:
    """A Messages request's body and translation, read again losslessly when the body may
    hold integers beyond 64 bits (the parse kept for the core may have rounded them)."""
    body, translated = request.lossless_body(), request.translation
    if body is not request.body:
        translated = translate_messages(body)
    assert isinstance(translated, TranslatedMessages)
    return body, translated
