"""What a provider's prompt cache does with each prompt the fake upstreams answer, for the
usage they report (test support).

Providers say in every answer's usage how much of its prompt they read from their cache, and
compaction is judged by it: a checkpoint that breaks the cache once and then lets it be read
pays; one that breaks it on every request does not. So the fakes keep a cache as the providers
describe theirs, in two kinds:

* OpenAI's (Chat Completions, Responses): every prompt of at least 1,024 tokens is cached by
  its prefix; a later prompt beginning alike, under the same ``prompt_cache_key`` (or none),
  reads the longest part it shares, in 128-token steps (``cached_tokens``).
* Anthropic's (Messages): a prompt writes the cache only at its breakpoints (``cache_control``
  on a block, or the request's own, for its last block), up to its last one, once that prefix
  reaches 1,024 tokens; it reads the longest prefix an earlier prompt wrote, looking back from
  each of its breakpoints over at most 20 blocks (``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``; ``input_tokens`` counts the rest).

A prompt is a list of ``PromptPart`` in the order the provider reads it (tools, the system
prompt, then the messages or blocks), each with the tokens the fake counts for it; a part is
the same to the cache when its JSON is, ``cache_control`` left out (moving a breakpoint
changes no cached content). One cache per fake, as one organization's: entries never expire
(a test lasts seconds) and are forgotten all at once past ``MAX_ENTRIES``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import orjson

from compaction_proxy.frozen import frozen
from compaction_proxy.testing.fake_answers import text_of

MIN_CACHED_TOKENS = 1_024  # both providers' shortest cacheable prefix (Claude Sonnet, Opus)
OPENAI_STEP = 128  # OpenAI reads its cache in steps of this many tokens
LOOKBACK_BLOCKS = 20  # how far back from a breakpoint Anthropic looks for a cached prefix
MAX_ENTRIES = 200_000


@frozen
class PromptPart:
    """One part of a prompt as its provider's cache sees it."""

    content: Any
    tokens: int
    breakpoint: bool = False


class CacheRead(NamedTuple):
    """One answered prompt as a test reads it back: a summary call's or not, its tokens, and
    those the cache gave."""

    summary: bool
    prompt: int
    read: int


class CacheUse(NamedTuple):
    """The tokens of a prompt read from the cache, and those written to it."""

    read: int
    written: int


def _without_breakpoints(content: Any, depth: int = 3) -> Any:
    """``content`` less its ``cache_control`` fields, down to ``depth`` levels (a turn, its
    block, a tool result's blocks)."""
    if depth and isinstance(content, dict):
        return {
            k: _without_breakpoints(v, depth - 1)
            for k, v in content.items()
            if k != "cache_control"
        }
    if depth and isinstance(content, list):
        return [_without_breakpoints(v, depth - 1) for v in content]
    return content


def _encoded(content: Any) -> bytes:
    """``content``'s bytes for the cache's key; what orjson cannot write (an integer past 64
    bits, nesting past its depth) by its ``repr``, which is as stable within one run."""
    content = _without_breakpoints(content)
    try:
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    except orjson.JSONEncodeError:
        pass
    try:
        return repr(content).encode()
    except RecursionError:  # deeper still: a part no later prompt is taken to share
        return os.urandom(16)


def _prefixes(parts: Sequence[PromptPart], route: str = "") -> tuple[list[bytes], list[int]]:
    """Each prefix's digest (the first ``i + 1`` parts, in the cache ``route`` names) and its
    tokens."""
    chain = hashlib.blake2b(route.encode(), digest_size=16)
    digests: list[bytes] = []
    tokens: list[int] = []
    total = 0
    for part in parts:
        chain.update(_encoded(part.content))
        digests.append(chain.copy().digest())
        total += part.tokens
        tokens.append(total)
    return digests, tokens


@dataclass
class PromptCaches:
    """The caches of one fake provider's account."""

    _openai: set[bytes] = field(default_factory=set)
    _anthropic: set[bytes] = field(default_factory=set)

    def _bounded(self, entries: set[bytes]) -> set[bytes]:
        if len(entries) > MAX_ENTRIES:
            entries.clear()
        return entries

    def openai(self, parts: Sequence[PromptPart], cache_key: Any = None) -> int:
        """The tokens of this prompt OpenAI reads from its cache (``cached_tokens``); the
        prompt is cached in turn. A request's ``prompt_cache_key`` routes it to a cache of
        its own: prompts under different keys (or one under none) share nothing."""
        route = f"key:{cache_key}" if isinstance(cache_key, str) else ""
        digests, tokens = _prefixes(parts, route)
        entries = self._bounded(self._openai)
        shared = next(
            (tokens[i] for i in range(len(digests) - 1, -1, -1) if digests[i] in entries), 0
        )
        if tokens and tokens[-1] >= MIN_CACHED_TOKENS:
            entries.update(digests)
        if shared < MIN_CACHED_TOKENS:
            return 0
        return shared - (shared - MIN_CACHED_TOKENS) % OPENAI_STEP

    def anthropic(self, parts: Sequence[PromptPart]) -> CacheUse:
        """What Anthropic's cache does with this prompt; what it writes is cached in turn."""
        digests, tokens = _prefixes(parts)
        entries = self._bounded(self._anthropic)
        marks = [i for i, part in enumerate(parts) if part.breakpoint]
        read_at = -1  # the last part of the prefix read
        for mark in marks:
            for index in range(mark, max(-1, mark - LOOKBACK_BLOCKS - 1), -1):
                if index > read_at and digests[index] in entries:
                    read_at = index
                    break
        read = tokens[read_at] if read_at >= 0 else 0
        written = 0
        if marks and tokens[marks[-1]] >= MIN_CACHED_TOKENS:
            entries.update(digests[mark] for mark in marks if tokens[mark] >= MIN_CACHED_TOKENS)
            written = max(0, tokens[marks[-1]] - read)
        return CacheUse(read, written)


def _marked(value: Any) -> bool:
    return isinstance(value, dict) and bool(value.get("cache_control"))


def chat_prompt(
    body: Mapping[str, Any], message_tokens: Callable[[Any], int], tools_tokens: int
) -> list[PromptPart]:
    """A chat prompt's parts: its tools, then each message."""
    parts = [PromptPart(body["tools"], tools_tokens)] if body.get("tools") else []
    return parts + [PromptPart(m, message_tokens(m)) for m in body.get("messages") or []]


def messages_prompt(
    body: dict[str, Any], count_text: Callable[[str], int], block_tokens: Callable[[Any], int]
) -> list[PromptPart]:
    """A Messages prompt's parts: its tools, its system prompt, then each block of each turn
    (a turn's own 3 tokens on its first), breakpoints where ``cache_control`` is, and on the
    last part with the request's own."""
    parts: list[PromptPart] = []
    tools, system = body.get("tools"), body.get("system")
    if tools:
        marked = isinstance(tools, list) and any(_marked(tool) for tool in tools)
        parts.append(PromptPart(tools, count_text(text_of(tools)), marked))
    if system is not None:
        text = system if isinstance(system, str) else text_of(system)
        marked = isinstance(system, list) and any(_marked(block) for block in system)
        parts.append(PromptPart(system, count_text(text), marked))
    for turn in body.get("messages") or []:
        content = turn.get("content") if isinstance(turn, dict) else None
        if isinstance(content, str):
            parts.append(PromptPart(turn, 3 + count_text(content)))
            continue
        role = turn.get("role") if isinstance(turn, dict) else None
        blocks = content if isinstance(content, list) and content else [None]
        for index, block in enumerate(blocks):
            tokens = block_tokens(block) + (3 if index == 0 else 0)
            parts.append(PromptPart({"role": role, "block": block}, tokens, _marked(block)))
    if parts and _marked(body):
        parts[-1] = PromptPart(parts[-1].content, parts[-1].tokens, True)
    return parts
