"""Agents that compact on their own: telling their summarization request (pure).

Codex, Claude Code and opencode each summarize their own history when they judge it long: one
request whose last user turn asks the model for a summary of the conversation, usually with no
tools offered, after which the agent replaces its history by that summary. A summary the proxy
prepares for the history being summarized would never be used: the branch is abandoned the
moment the answer arrives. So such a request starts no background round and ends the one in
flight for its branch (``service.prepare``). It is still made to fit the window like any other
request: an agent's compaction request that overflows is the one it cannot recover from.

Known by the agents' own prompts, or, generically, by a last user turn asking for a summary of
the conversation in a request that offers no tools; the last user turn being the request's last
message (the ask closes the request: one that closes with a tool's result is the tool loop).
The history that replaces the old one is known too, by the words each agent opens its summary
with (``is_continued_history``): its first request abandons the old branch, whose round in
flight is then ended.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import text_of

# Words of each agent's compaction prompt, within its first few thousand characters (Claude
# Code's opens with "CRITICAL: Respond with TEXT ONLY" and offers its tools all the same).
KNOWN_PROMPTS = (
    "You are performing a CONTEXT CHECKPOINT COMPACTION",  # Codex
    "Your task is to create a detailed summary of the conversation so far",  # Claude Code
    # opencode 1.18: the whole conversation in one user message, then its summary template
    "Here is the conversation so far:\n\n<conversation>",
    "Provide a detailed prompt for continuing our conversation",  # opencode, earlier
)
_KNOWN = re.compile("|".join(re.escape(prompt) for prompt in KNOWN_PROMPTS), re.IGNORECASE)
_KNOWN_LOWERED = tuple(prompt.lower() for prompt in KNOWN_PROMPTS)
# Every request's last user turn is read, often a long observation. ASCII text (the common
# case) is looked at first with substring searches of its lowered form, exactly what the
# case-insensitive expressions decide on ASCII; the asking expression runs only on text holding
# one of its words. Other text goes to the expressions: lowering it can change its length and
# its word boundaries (``İ``), and the expressions match more than lowering does (a long s, U+017F).
_ASKING_WORDS = ("summar", "recap", "condense")
_ASKS = re.compile(
    r"\b(summar(y|ize|ise)|recap|condense)\b[^.\n]{0,80}\b(conversation|chat|session|history|"
    r"work so far|discussion)\b",
    re.IGNORECASE,
)
_SCANNED_CHARS = 4096  # a compaction prompt states its request up front

# The words each agent opens the summary that replaces its history with.
CONTINUATION_PREFIXES = (
    "Another language model started to solve this problem",  # Codex
    "This session is being continued from a previous conversation",  # Claude Code
)
_CONTINUED_WITHIN = 8  # the summary sits at the start of the new history


def closing_user_text(body: Sequence[Message]) -> str:
    """The start of the request's last message when it is the user's, else nothing: an agent's
    summarization request ends with its ask. A request that ends with a tool's result is a
    step of the agent's tool loop (its last user turn, often the task far back, was looked at
    when it was new), so the common request is decided without a walk back or a scan."""
    if not body:
        return ""
    message = body[-1]
    if message.get("role") != "user":
        return ""
    return (text_of(message.get("content")) or "")[:_SCANNED_CHARS]


def is_client_compaction(body: Sequence[Message], tools: Any) -> bool:
    """Whether the request asks the model to summarize the conversation for the client."""
    text = closing_user_text(body)
    if not text:
        return False  # most requests: an agent's step, ending with a tool's result
    if not text.isascii():
        return _KNOWN.search(text) is not None or (not tools and _ASKS.search(text) is not None)
    lowered = text.lower()
    if any(prompt in lowered for prompt in _KNOWN_LOWERED):
        return True
    if tools or not any(word in lowered for word in _ASKING_WORDS):
        return False
    return _ASKS.search(text) is not None


def is_continued_history(body: Sequence[Message]) -> bool:
    """Whether ``body`` is a history an agent rebuilt from its own summary: one of its first
    messages opens with the agent's continuation words."""
    for message in body[:_CONTINUED_WITHIN]:
        text = (text_of(message.get("content")) or "")[:_SCANNED_CHARS].lstrip()
        if text.startswith(CONTINUATION_PREFIXES):
            return True
    return False
