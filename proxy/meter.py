"""Token meter: prompt tokens of the surface about to be forwarded.

Counting follows OpenAI's scheme: 3 tokens per message plus its text, 1 more for a ``name``,
tool calls as name and arguments, image parts at a fixed price, tool schemas as their JSON, and
3 tokens priming the reply. Per-message counts are cached by content digest in a bounded LRU,
so a request's metering cost grows with its new messages, not with its history.

**Anchoring**: after an answer, the upstream's ``usage.prompt_tokens`` for a forwarded surface
becomes the conversation's anchor. A later surface that extends the anchored one (same tools,
same first ``node_count`` messages) is measured as ``anchor + estimate(new messages)``.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Protocol

import orjson

from proxy.conversation import Message, message_digest
from proxy.store.base import Anchor
from proxy.tokenizers import encoding, use_bundled_tokenizers

log = logging.getLogger(__name__)

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING_TOKENS = 3
IMAGE_PART_TOKENS = 85
# Usage below the estimate by more than this share is taken as under-reporting and ignored.
UNDER_REPORT_MARGIN = 0.2

# Models counted with cl100k_base; everything else OpenAI-like uses o200k_base.
_CL100K_MODELS = re.compile(r"^(gpt-4(?!o|\.|-?5)|gpt-3\.5|text-embedding-(ada|3))", re.IGNORECASE)
# litellm ships these tokenizers as files; others (llama, cohere) would be downloaded.
_BUNDLED_HF_KINDS = frozenset({"anthropic", "deepseek"})


class TextCounter(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, text: str) -> int: ...


@dataclass(frozen=True)
class _TiktokenCounter:
    name: str

    def __call__(self, text: str) -> int:
        return len(encoding(self.name).encode(text, disallowed_special=()))


@dataclass(frozen=True)
class _HuggingFaceCounter:
    name: str
    tokenizer: Any

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)


def _litellm_counter(model: str) -> TextCounter | None:
    """litellm's own tokenizer for the model when it ships one as a file; never downloads."""
    use_bundled_tokenizers()
    try:
        from litellm.utils import huggingface_tokenizer_kind, select_tokenizer
    except ImportError:
        return None
    kind = huggingface_tokenizer_kind(model)
    if kind not in _BUNDLED_HF_KINDS:
        return None
    selected = select_tokenizer(model)
    if selected.get("type") != "huggingface_tokenizer":
        return None
    return _HuggingFaceCounter(name=f"hf:{kind}", tokenizer=selected["tokenizer"])


@cache
def counter_for(model: str) -> TextCounter:
    """The best offline tokenizer for ``model``."""
    hf = _litellm_counter(model)
    if hf is not None:
        return hf
    return _TiktokenCounter("cl100k_base" if _CL100K_MODELS.match(model) else "o200k_base")


def message_tokens(message: Message, count: TextCounter) -> int:
    """Tokens one message adds to a prompt (pure given the counter)."""
    total = TOKENS_PER_MESSAGE + count(str(message.get("role", "")))
    content = message.get("content")
    if isinstance(content, str):
        total += count(content)
    elif isinstance(content, list):
        for part in content:
            if isinstance(part, dict) and part.get("type") == "text":
                total += count(str(part.get("text", "")))
            else:
                total += IMAGE_PART_TOKENS
    elif content is not None:
        total += count(orjson.dumps(content).decode())
    name = message.get("name")
    if name:
        total += count(str(name)) + TOKENS_PER_NAME
    tool_call_id = message.get("tool_call_id")
    if tool_call_id:
        total += count(str(tool_call_id))
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        function = function if isinstance(function, dict) else {}
        total += TOKENS_PER_TOOL_CALL
        total += count(str(function.get("name", ""))) + count(str(function.get("arguments", "")))
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        total += count(str(function_call.get("name", "")))
        total += count(str(function_call.get("arguments", "")))
    return total


def tools_digest(tools: Any) -> str:
    return hashlib.blake2b(orjson.dumps(tools or None), digest_size=16).hexdigest()


def surface_prefix_hashes(tools_hash: str, digests: Sequence[str]) -> list[str]:
    """``p[k]`` names the first ``k+1`` forwarded messages together with the tool schemas."""
    hashes: list[str] = []
    previous = bytes.fromhex(tools_hash)
    for digest in digests:
        previous = hashlib.blake2b(previous + bytes.fromhex(digest), digest_size=16).digest()
        hashes.append(previous.hex())
    return hashes


@dataclass(frozen=True)
class Measurement:
    tokens: int
    estimated: int
    anchored: bool
    node_tokens: tuple[int, ...]
    prefix_hashes: tuple[str, ...]

    def anchor_for(self, prompt_tokens: int) -> Anchor | None:
        """The anchor to store for this surface, or None if usage looks under-reported."""
        if not self.prefix_hashes or prompt_tokens < self.estimated * (1 - UNDER_REPORT_MARGIN):
            return None
        return Anchor(
            surface_hash=self.prefix_hashes[-1],
            node_count=len(self.prefix_hashes),
            prompt_tokens=prompt_tokens,
            estimated_tokens=self.estimated,
        )


class TokenMeter:
    """Counts prompt tokens with a bounded LRU of per-message counts."""

    def __init__(self, cache_size: int = 100_000) -> None:
        self._cache: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._cache_size = cache_size

    def _message(self, message: Message, digest: str, count: TextCounter) -> int:
        key = (count.name, digest)
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            return cached
        tokens = message_tokens(message, count)
        self._cache[key] = tokens
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
        return tokens

    def tools_tokens(self, tools: Any, count: TextCounter) -> int:
        if not tools:
            return 0
        raw = orjson.dumps(tools)
        key = (count.name, "tools:" + hashlib.blake2b(raw, digest_size=16).hexdigest())
        cached = self._cache.get(key)
        if cached is None:
            cached = count(raw.decode())
            self._cache[key] = cached
        return cached

    def measure(
        self,
        model: str,
        messages: Sequence[Message],
        tools: Any = None,
        digests: Sequence[str | None] | None = None,
        anchor: Anchor | None = None,
    ) -> Measurement:
        """Tokens of ``messages`` (+ tools) as forwarded; ``digests[i]`` may name message i."""
        count = counter_for(model)
        known = digests if digests is not None else [None] * len(messages)
        resolved = [
            d if d is not None else message_digest(m) for m, d in zip(messages, known, strict=True)
        ]
        node_tokens = tuple(
            self._message(m, d, count) for m, d in zip(messages, resolved, strict=True)
        )
        estimated = REPLY_PRIMING_TOKENS + self.tools_tokens(tools, count) + sum(node_tokens)
        prefixes = tuple(surface_prefix_hashes(tools_digest(tools), resolved))
        tokens, anchored = estimated, False
        if (
            anchor is not None
            and 0 < anchor.node_count <= len(prefixes)
            and prefixes[anchor.node_count - 1] == anchor.surface_hash
        ):
            tokens = anchor.prompt_tokens + sum(node_tokens[anchor.node_count :])
            anchored = True
        return Measurement(tokens, estimated, anchored, node_tokens, prefixes)
