"""Summary calls in Anthropic's Messages format (pure).

Two forms. The **cache-safe** one (``cache_safe_summary_body``) starts as the conversation's
own next request would: the client's tools, system prompt, thinking and ``tool_choice`` as
sent, then the turns the proxy forwarded, head to the span's end, byte for byte, then the
instruction. Anthropic's cache key covers tools, system, messages and the thinking settings,
and a changed ``tool_choice`` invalidates the cached turns; so this call reads the prefix the
client's own requests wrote, at a tenth of the price, where a rebuilt one pays it again in
full. A breakpoint ends the prefix when the client caches and the API's limit leaves room.
Anthropic reads only where an earlier prompt set one, so a span ending on the model's answer
is carried on to the end of the prompt that followed it, which the instruction then says stays
(``compaction.planning.ReadThrough``, chosen for this format by ``caches_at_breakpoints``).

The **rebuilt** one (``summary_messages_body``) is made from the chat form alone, with
``tool_choice`` none: for a summary model other than the conversation's (whose cache it could
not read anyway), a span with messages cut for the call, or when the cache-safe call gave no
summary (offered the client's tools as the client offered them, a model may answer with a
tool call; or the client's thinking budget left the summary too little room).
"""

from __future__ import annotations

from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.anthropic_blocks import (
    TranslatedMessages,
    lossless,
    with_breakpoint_at,
    with_checkpoint_breakpoint,
    written_turns,
)
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.parsing import jsonio

# Request fields that are part of the cache key, or decide where the cache is read: sent on
# the cache-safe call as the client sent them.
CACHE_FIELDS = ("system", "tools", "tool_choice", "thinking", "cache_control")
CONTINUES = "(The conversation so far continues below.)"


def _blocks_of(content: Any) -> list[Any]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if isinstance(content, list):
        return [
            {"type": "text", "text": p["text"]} if p.get("type") == "text" else p
            for p in content
            if isinstance(p, dict)
        ]
    return []


def _assistant_blocks(message: Message) -> list[Any]:
    blocks = _blocks_of(message.get("content"))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        try:
            arguments = jsonio.loads(function.get("arguments") or "{}")
        except ValueError:
            arguments = {}
        blocks.append(
            {
                "type": "tool_use",
                "id": call.get("id"),
                "name": function.get("name"),
                "input": arguments if isinstance(arguments, dict) else {},
            }
        )
    return blocks or [{"type": "text", "text": "(no text)"}]


def summary_messages_body(chat_body: dict[str, Any]) -> dict[str, Any]:
    """A chat summary request (``compaction.summarize.summary_body``) in Messages form: system
    messages as ``system``, tool calls as ``tool_use`` blocks with their results in the next
    user turn, the first turn the user's; thinking is not there to send (the chat messages only
    name it)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in chat_body.get("messages", []):
        role = message.get("role")
        if role in ("system", "developer"):
            system.append(text_of(message.get("content")) or "")
        elif role == "assistant":
            turns.append({"role": "assistant", "content": _assistant_blocks(message)})
        elif role == "tool":
            result = {
                "type": "tool_result",
                "tool_use_id": message.get("tool_call_id"),
                "content": text_of(message.get("content")) or "",
            }
            if turns and turns[-1]["role"] == "user" and turns[-1].get("results"):
                turns[-1]["content"].append(result)
            else:
                turns.append({"role": "user", "content": [result], "results": True})
        else:
            content = message.get("content")
            if not isinstance(content, str):
                content = _blocks_of(content)
            turns.append({"role": "user", "content": content or "(empty)"})
    for turn in turns:
        turn.pop("results", None)
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": CONTINUES})
    cap = chat_body.get("max_tokens") or chat_body.get("max_completion_tokens")
    body: dict[str, Any] = {"model": chat_body["model"], "max_tokens": cap, "messages": turns}
    if system:
        body["system"] = "\n\n".join(system)
    if chat_body.get("tools"):
        body["tools"] = chat_body["tools"]
        body["tool_choice"] = {"type": "none"}
    return body


def summary_text_of(answer: Any) -> tuple[str, bool]:
    """A Messages answer's text, and whether it stopped at its ``max_tokens``; raises
    ``ValueError`` for what is not a Messages answer."""
    if not isinstance(answer, dict) or not isinstance(answer.get("content"), list):
        raise ValueError("not a Messages answer")
    text = "".join(
        block.get("text", "")
        for block in answer["content"]
        if isinstance(block, dict) and block.get("type") == "text"
    )
    return text, answer.get("stop_reason") == "max_tokens"


def forces_a_tool(tool_choice: Any) -> bool:
    """Whether a Messages ``tool_choice`` makes the model call a tool (``any``, or a named
    ``tool``): a call keeping it would be answered with a tool call, not a summary."""
    return isinstance(tool_choice, dict) and tool_choice.get("type") in ("any", "tool")


def thinking_budget(thinking: Any) -> int | None:
    """The output tokens ``thinking`` (a Messages ``thinking`` field) may take before the
    answer: ``budget_tokens`` when enabled; None when it sets no budget (adaptive thinking
    takes what it needs); 0 when off or absent."""
    if not isinstance(thinking, dict) or thinking.get("type") in (None, "disabled"):
        return 0
    budget = thinking.get("budget_tokens")
    return budget if isinstance(budget, int) and budget > 0 else None


def max_tokens_with_thinking(cap: int, body: dict[str, Any]) -> int:
    """``max_tokens`` for a summary of ``cap`` tokens that thinks as the client's request
    does: the budget on top (thinking settings are part of the cache key, so they stay), yet
    never more than the client asked, whose request fit its window with a longer prompt."""
    budget = thinking_budget(body.get("thinking"))
    if budget == 0:
        return cap
    wanted = cap + (cap if budget is None else budget)
    asked = body.get("max_tokens")
    if isinstance(asked, int) and asked > (budget or 0):
        return min(wanted, asked)
    return wanted


def cache_safe_summary_body(
    request: ClientRequest, prefix: Surface, chat_body: dict[str, Any]
) -> dict[str, Any] | None:
    """The cache-safe summary call (see the module's docstring) for the client's Messages
    ``request``: ``prefix`` is the surface from the head to the span's end (or read through
    past it), exactly as forwarded; ``chat_body`` the chat-form summary request (its model,
    cap and instruction).
    None when the request cannot be written back, or its ``tool_choice`` forces a tool."""
    if forces_a_tool(request.body.get("tool_choice")):
        return None  # its answer would be a tool call, never the summary
    if not isinstance(request.translation, TranslatedMessages):
        return None
    body, translated = lossless(request)
    turns, checkpoints = written_turns(prefix, translated)
    if not turns:
        return None
    # The prefix's end: the call reads the longest prefix the client's requests wrote up to
    # 20 blocks before it.
    turns = with_checkpoint_breakpoint(body, turns, checkpoints)
    turns = with_breakpoint_at(body, turns, len(turns) - 1)
    instruction = chat_body["messages"][-1]["content"]
    cap = chat_body.get("max_tokens") or chat_body.get("max_completion_tokens") or 1
    call: dict[str, Any] = {
        "model": chat_body["model"],
        "max_tokens": max_tokens_with_thinking(cap, body),
        "messages": [*turns, {"role": "user", "content": instruction}],
    }
    call.update({field: body[field] for field in CACHE_FIELDS if field in body})
    return call
