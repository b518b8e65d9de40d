"""Token meter: prompt tokens of the surface about to be forwarded.

Counting follows OpenAI's scheme: 3 tokens per message plus its text, 1 more for a ``name``,
tool calls as name and arguments, image parts at a fixed price, tool schemas as their JSON, and
3 tokens priming the reply. Per-message counts are cached by content digest in a bounded LRU,
so a request's metering cost grows with its new messages, not with its history.

**Anchoring**: after an answer, the upstream's ``usage.prompt_tokens`` for a forwarded surface
becomes the conversation's anchor. A later surface that extends the anchored one (same tools,
same head and replacements, same body chain up to the anchored tip) is measured as
``anchor + estimate(new messages) x ratio``, the ratio being what the upstream counted of the
anchored surface over what the meter did.

**Calibration**: a tokenizer the meter lacks (Anthropic's is not public) is stood in for by the
nearest it has, which counts the same text differently. Before a conversation is anchored, its
estimate is scaled by what the upstream reported over what the meter estimated for the same
tenant's earlier conversations of the model (``calibrate``), or, before any, by
``STAND_IN_MARGIN`` for a model counted with a stand-in: an estimate under the truth compacts
too late, one over it only early. What is learned stays with the tenant it was learned from:
one tenant's content the meter undercounts (screenshots, at ``IMAGE_PART_TOKENS`` each) would
otherwise make the proxy cut another tenant's first requests, which fit.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from collections.abc import Sequence
from functools import cache
from typing import Any, Protocol

from compaction_proxy.conversation.messages import Message, message_digest
from compaction_proxy.conversation.replacements import pruned_message
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.frozen import frozen
from compaction_proxy.lru import LRU
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metering.tokenizers import encoding
from compaction_proxy.parsing import jsonio

log = logging.getLogger(__name__)

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING_TOKENS = 3
IMAGE_PART_TOKENS = 85
# Usage below the estimate by more than this share is taken as under-reporting and ignored.
UNDER_REPORT_MARGIN = 0.2
# Before a model's first answer, the estimate of a model counted with a stand-in tokenizer is
# scaled by this: Claude's tokenizers count up to a fifth more than the stand-ins on code.
STAND_IN_MARGIN = 1.2
_STAND_IN_MODELS = re.compile(r"^(anthropic/|bedrock/)?(claude|anthropic\.claude)", re.IGNORECASE)
# What the upstream counts over what the meter does, as learned: the newest weighs this much.
_CALIBRATION_WEIGHT = 0.3
_RATIO_BOUNDS = (1 - UNDER_REPORT_MARGIN, 3.0)

# Models counted with cl100k_base; everything else OpenAI-like uses o200k_base.
_CL100K_MODELS = re.compile(r"^(gpt-4(?!o|\.|-?5)|gpt-3\.5|text-embedding-(ada|3))", re.IGNORECASE)
# litellm ships these tokenizers as files; others (llama, cohere) would be downloaded.
_BUNDLED_HF_KINDS = frozenset({"anthropic", "deepseek"})


class TextCounter(Protocol):
    @property
    def name(self) -> str: ...

    def __call__(self, text: str) -> int: ...


# Above this many characters a text is counted into tiktoken's token buffer instead of a list:
# building a Python list of millions of ints holds the interpreter for its whole length, while
# the buffer is filled with it released, so other threads and the event loop run.
_BUFFERED_COUNT_CHARS = 64 * 1024


@frozen
class _TiktokenCounter:
    name: str

    def __call__(self, text: str) -> int:
        tokenizer = encoding(self.name)
        core: Any = getattr(tokenizer, "_core_bpe", None)
        to_buffer = getattr(core, "encode_to_tiktoken_buffer", None)
        if len(text) > _BUFFERED_COUNT_CHARS and to_buffer is not None:
            # What ``Encoding.encode_to_numpy`` does, without needing numpy; same tokens as
            # ``encode(text, disallowed_special=())``.
            tokens = memoryview(to_buffer(text, set()))
            return tokens.nbytes // tokens.itemsize
        return len(tokenizer.encode(text, disallowed_special=()))


@frozen
class _HuggingFaceCounter:
    name: str
    tokenizer: Any

    def __call__(self, text: str) -> int:
        return len(self.tokenizer.encode(text).ids)


def _litellm_counter(model: str) -> TextCounter | None:
    """litellm's own tokenizer for the model when it ships one as a file; never downloads.
    Call only once ``lazy_litellm.available()``."""
    from litellm.utils import huggingface_tokenizer_kind, select_tokenizer

    kind = huggingface_tokenizer_kind(model)
    if kind not in _BUNDLED_HF_KINDS:
        return None
    selected = select_tokenizer(model)
    if selected.get("type") != "huggingface_tokenizer":
        return None
    return _HuggingFaceCounter(name=f"hf:{kind}", tokenizer=selected["tokenizer"])


def counter_for(model: str) -> TextCounter:
    """The best offline tokenizer for ``model`` (tiktoken's while litellm is being loaded)."""
    if lazy_litellm.available():
        return _best_counter(model)
    return _tiktoken_counter(model)


@cache
def _best_counter(model: str) -> TextCounter:
    hf = _litellm_counter(model)
    if hf is not None:
        return hf
    return _tiktoken_counter(model)


def _tiktoken_counter(model: str) -> TextCounter:
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
        total += count(jsonio.dumps(content).decode())
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


class MeteredRequest(Protocol):
    """What the meter reads of a request (``RequestView`` provides it)."""

    @property
    def tenant(self) -> str: ...
    @property
    def model(self) -> str: ...
    @property
    def head(self) -> list[Message]: ...
    @property
    def head_digests(self) -> list[str]: ...
    @property
    def body(self) -> list[Message]: ...
    @property
    def body_digests(self) -> list[str]: ...
    @property
    def chain(self) -> list[str]: ...
    @property
    def tools(self) -> Any: ...
    @property
    def tools_digest(self) -> str: ...


def prefix_key(request: MeteredRequest, surface: Surface, tip: int) -> str | None:
    """Names the forwarded surface up to body position ``tip``: tools, head, the replacements
    standing in it, and the body chain at ``tip``. None if ``tip`` falls inside a checkpoint."""
    if not 0 <= tip < len(request.body):
        return None
    h = hashlib.blake2b(digest_size=16)
    h.update(bytes.fromhex(request.tools_digest))
    for digest in request.head_digests:
        h.update(bytes.fromhex(digest))
    for checkpoint in surface.checkpoints:
        if checkpoint.start <= tip < checkpoint.end:
            return None
        if checkpoint.end <= tip:
            h.update(f"c{checkpoint.start}:{checkpoint.end}:".encode())
            h.update(bytes.fromhex(message_digest(checkpoint.message)))
    for prune in surface.prunes:
        if prune.position <= tip:
            h.update(f"p{prune.position}:".encode())
            h.update(jsonio.dumps(prune.content))
    h.update(bytes.fromhex(request.chain[tip]))
    return h.hexdigest()


@frozen
class Measurement:
    tokens: int
    estimated: int
    anchored: bool
    anchor_key: str | None = None
    tip: int = -1
    tip_hash: str = ""  # the body chain hash at ``tip``

    def anchor_for(self, prompt_tokens: int) -> Anchor | None:
        """The anchor to store for this surface, or None if usage looks under-reported."""
        if self.anchor_key is None or prompt_tokens < self.estimated * (1 - UNDER_REPORT_MARGIN):
            return None
        return Anchor(
            key=self.anchor_key,
            tip=self.tip,
            prompt_tokens=prompt_tokens,
            estimated_tokens=self.estimated,
            tip_hash=self.tip_hash,
        )


def _bounded(ratio: float) -> float:
    low, high = _RATIO_BOUNDS
    return min(high, max(low, ratio))


class TokenMeter:
    """Counts prompt tokens with bounded LRUs: per message (by content digest) and per body
    prefix (by chain hash, cumulative). Measuring a request costs its head, its replacements
    and its new messages; the history already seen is two cache lookups."""

    def __init__(self, cache_size: int = 100_000, calibrations: int = 65_536) -> None:
        self._messages: LRU[tuple[str, str], int] = LRU(cache_size)
        self._prefixes: LRU[tuple[str, str], int] = LRU(cache_size)
        self._ratios: LRU[tuple[str, str], float] = LRU(calibrations)  # by tenant and model

    def calibrate(self, tenant: str, model: str, estimated: int, reported: int) -> None:
        """Learn from a tenant's unanchored request what the upstream counts of ``model``'s
        prompts over the meter's estimate."""
        if estimated <= 0 or reported <= 0:
            return
        ratio = _bounded(reported / estimated)
        known = self._ratios.get((tenant, model))
        if known is not None:
            ratio = known + _CALIBRATION_WEIGHT * (ratio - known)
        self._ratios.put((tenant, model), ratio)

    def first_contact_ratio(self, tenant: str, model: str) -> float:
        """The scale of an unanchored estimate of ``tenant``'s ``model`` prompts (see
        Calibration above)."""
        learned = self._ratios.get((tenant, model))
        if learned is not None:
            return learned
        return STAND_IN_MARGIN if _STAND_IN_MODELS.match(model) else 1.0

    def message(self, message: Message, count: TextCounter, digest: str | None = None) -> int:
        key = (count.name, digest or message_digest(message))
        cached = self._messages.get(key)
        if cached is None:
            cached = message_tokens(message, count)
            self._messages.put(key, cached)
        return cached

    def tools_tokens(self, tools: Any, count: TextCounter, digest: str | None = None) -> int:
        """Tokens of the tool definitions, cached by their digest (``digest``, when the caller
        has it: ``RequestView.tools_digest`` hashes the same bytes; serializing an agent's
        tools, tens of KiB, is then done once a request, not once a measurement)."""
        if not tools:
            return 0
        raw = None
        if digest is None:
            raw = jsonio.dumps(tools)
            digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
        key = (count.name, "tools:" + digest)
        cached = self._messages.get(key)
        if cached is None:
            cached = count((raw if raw is not None else jsonio.dumps(tools)).decode())
            self._messages.put(key, cached)
        return cached

    def _through(self, request: MeteredRequest, position: int, count: TextCounter) -> int:
        """Tokens of ``body[0..position]`` (0 for position -1), cached per chain hash."""
        if position < 0:
            return 0
        cached = self._prefixes.get((count.name, request.chain[position]))
        if cached is not None:
            return cached
        known, total = position - 1, 0
        while known >= 0:
            hit = self._prefixes.get((count.name, request.chain[known]))
            if hit is not None:
                total = hit
                break
            known -= 1
        for i in range(known + 1, position + 1):
            total += self.message(request.body[i], count, request.body_digests[i])
            self._prefixes.put((count.name, request.chain[i]), total)
        return total

    def _body_tokens_after(
        self, request: MeteredRequest, surface: Surface, after: int, count: TextCounter
    ) -> int:
        """Tokens of the surface's body nodes past body position ``after``."""
        last = len(request.body) - 1
        total = self._through(request, last, count) - self._through(request, after, count)
        for checkpoint in surface.checkpoints:
            if checkpoint.start > after:
                shadowed = self._through(request, checkpoint.end, count) - self._through(
                    request, checkpoint.start - 1, count
                )
                total += self.message(checkpoint.message, count) - shadowed
        for prune in surface.prunes:
            if prune.position > after:
                original = request.body[prune.position]
                pruned = pruned_message(original, prune)
                total += self.message(pruned, count) - self.message(
                    original, count, request.body_digests[prune.position]
                )
        return total

    def measure(
        self, request: MeteredRequest, surface: Surface, anchor: Anchor | None = None
    ) -> Measurement:
        """Prompt tokens of ``surface`` as forwarded for ``request``."""
        count = counter_for(request.model)
        head = sum(
            self.message(m, count, d)
            for m, d in zip(request.head, request.head_digests, strict=True)
        )
        tools = self.tools_tokens(request.tools, count, request.tools_digest)
        fixed = REPLY_PRIMING_TOKENS + tools + head
        estimated = fixed + self._body_tokens_after(request, surface, -1, count)
        tip = len(request.body) - 1
        key = prefix_key(request, surface, tip)
        tokens = math.ceil(estimated * self.first_contact_ratio(request.tenant, request.model))
        anchored = False
        if anchor is not None and prefix_key(request, surface, anchor.tip) == anchor.key:
            ratio = _bounded(anchor.prompt_tokens / max(1, anchor.estimated_tokens))
            after = self._body_tokens_after(request, surface, anchor.tip, count)
            tokens, anchored = anchor.prompt_tokens + math.ceil(after * ratio), True
        return Measurement(tokens, estimated, anchored, key, tip, request.chain[tip] if key else "")

    def node_tokens(self, request: MeteredRequest, surface: Surface) -> list[int]:
        """The price of every surface node (for range selection; costs the whole surface)."""
        count = counter_for(request.model)
        prices: list[int] = []
        for node in surface.nodes:
            digest = None
            if node.kind == "head":
                digest = request.head_digests[len(prices)]
            elif node.kind == "body" and node.start is not None:
                digest = request.body_digests[node.start]
            prices.append(self.message(node.message, count, digest))
        return prices

    def measure_messages(self, model: str, messages: Sequence[Message], tools: Any = None) -> int:
        """Plain estimate of a message list (no anchoring), e.g. for a summary call."""
        count = counter_for(model)
        return (
            REPLY_PRIMING_TOKENS
            + self.tools_tokens(tools, count)
            + sum(self.message(m, count) for m in messages)
        )
