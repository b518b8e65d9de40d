"""``/v1/messages/count_tokens`` with ``context_management``, for an upstream that has none
(pure): the body as the edits would leave it, so the count is of what the model would see.

Only the clearing edits change a count (a compaction happens on a message, not a count): tool
results older than the newest ``keep`` cleared to a placeholder (and, asked, their calls'
inputs), once the history reaches the edit's trigger; thinking older than the newest turns
kept. The placeholder is the API's kind of line, not the proxy's masking placeholder: the count
asks what would remain, and either is a few tokens.
"""

from __future__ import annotations

from typing import Any

from compaction_proxy.formats.anthropic_compaction import edited_turns
from compaction_proxy.formats.asked_compaction import AskedCompaction, ClearedToolUses

CLEARED = "[tool result cleared to save context]"
CHARS_PER_TOKEN = 4


def cleared_for_count(
    body: dict[str, Any], asked: AskedCompaction, input_tokens: int
) -> dict[str, Any] | None:
    """``body`` (without ``context_management``) as ``asked`` would clear it, given its
    uncleared count; None when nothing would be cleared."""
    turns = body.get("messages")
    if not isinstance(turns, list):
        return None
    clear = asked.clear_tool_uses
    names: dict[str, str] = {}
    results: list[tuple[int, int, str]] = []  # (turn, block, tool_use_id)
    for index, turn in enumerate(turns):
        content = turn.get("content") if isinstance(turn, dict) else None
        for place, block in enumerate(content if isinstance(content, list) else []):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and isinstance(block.get("id"), str):
                names[block["id"]] = str(block.get("name"))
            if block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
                results.append((index, place, block["tool_use_id"]))
    cleared: ClearedToolUses | None = None
    edited = [dict(turn) if isinstance(turn, dict) else turn for turn in turns]
    if clear is not None and _triggered(
        clear.trigger_tokens, clear.trigger_tool_uses, input_tokens, len(results)
    ):
        # The newest ``keep`` stay (``[:-0 or None]`` is every result: keep 0 clears all).
        old = [
            r for r in results[: -clear.keep or None] if names.get(r[2]) not in clear.exclude_tools
        ]
        chars = 0
        for index, place, _ in old:
            content = list(edited[index]["content"])
            chars += len(str(content[place].get("content", "")))
            content[place] = {**content[place], "content": CLEARED}
            edited[index] = {**edited[index], "content": content}
        saved = max(0, chars - len(CLEARED) * len(old)) // CHARS_PER_TOKEN
        if old and saved >= clear.clear_at_least:
            cleared = ClearedToolUses(len(old), saved, tuple(r[2] for r in old))
        else:
            edited = [dict(turn) if isinstance(turn, dict) else turn for turn in turns]
    if cleared is None and asked.keep_thinking_turns is None:
        return None
    result, applied = edited_turns({**body, "messages": edited}, asked, cleared)
    return result if applied else None


def _triggered(tokens: int | None, tool_uses: int | None, input_tokens: int, uses: int) -> bool:
    if tool_uses is not None:
        return uses >= tool_uses
    return tokens is None or input_tokens >= tokens
