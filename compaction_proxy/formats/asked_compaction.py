"""What a request asks the provider to compact or clear on the way (pure data): Responses'
``context_management`` compaction, Anthropic's ``context_management.edits``. Each format reads
its own option into these (``WireFormat.asked_compaction``); the service serves them where the
upstream lacks them (``service.native_compaction``)."""

from __future__ import annotations

from compaction_proxy.frozen import frozen


@frozen
class ClearToolUses:
    """Old tool results cleared to a placeholder (Anthropic's ``clear_tool_uses_20250919``):
    from ``trigger_tokens`` of input (or ``trigger_tool_uses`` tool uses), all but the newest
    ``keep``, none of ``exclude_tools``, and only when at least ``clear_at_least`` tokens go."""

    trigger_tokens: int | None = 100_000
    trigger_tool_uses: int | None = None
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    # The calls' own inputs cleared too: of every tool (True), of these tools, or none.
    clear_inputs: bool | frozenset[str] = False


@frozen
class AskedCompaction:
    """``threshold``: compact the history on the way once it holds this many tokens (None:
    no compaction asked, or none at a size of its own). ``pause``: answer with the compaction
    alone, not the model's answer. ``instructions``: more for the summary to follow.
    ``clear_tool_uses``: old tool results to clear."""

    threshold: int | None = None
    pause: bool = False
    instructions: str | None = None
    clear_tool_uses: ClearToolUses | None = None
    # Thinking kept for this many of the newest assistant turns, older turns' cleared
    # (Anthropic's ``clear_thinking_20251015``); None: not asked, or every turn's kept.
    keep_thinking_turns: int | None = None


@frozen
class ClearedToolUses:
    """What clearing tool uses took out of a request."""

    tool_uses: int
    tokens: int
    call_ids: tuple[str, ...] = ()  # the calls whose results went
