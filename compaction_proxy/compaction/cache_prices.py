"""What a compaction step costs on a provider that caches prompt prefixes (pure).

Every step changes the forwarded prompt from some message on: the provider reads the prefix
before it from its cache and writes everything after it again. A step is worth that rewrite
(and, for a checkpoint, its summary call) only when the tokens it takes off every later
request, read at the cache's price over the turns ahead, add up to more. On Anthropic (reads
0.1x, writes 1.25x) clearing 3,000 tokens of observations 20,000 tokens deep costs 23,000
units once and saves 300 a turn: it pays after 77 turns, and the conversation is summarized
long before. On a provider that caches nothing the same step pays at once. This module holds
the price models (``CachePrices``, presets per provider) and the arithmetic; the shell
(``mask_step``, ``pressure``) measures the steps and asks.

**The turns ahead** are not known. ``turns_ahead`` takes as many as the conversation has had
(a conversation 40 turns old is as likely to go on for 40 more as to stop: the usual estimate
when nothing else is known), and never more than the step's saving lasts: until the next
checkpoint, which summarizes what a mask cleared, or (for a checkpoint taken early, under a
soft target) until the window's own watermark, where one would be taken anyway.

**A cold cache** (the conversation's last request older than the cache's lifetime) is written
whole whatever the proxy does: a step's rewrite costs nothing extra then.
"""

from __future__ import annotations

import math
import re

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.settings import PricePreset, PricingPolicy
from compaction_proxy.frozen import frozen


@frozen
class CachePrices:
    """A provider's prices, in multiples of an uncached input token: a cached prompt token
    read, one written to the cache, an output token; and how long an unread prefix stays
    cached (0: nothing is cached)."""

    read: float
    write: float
    output: float
    lifetime_seconds: float

    @property
    def caches(self) -> bool:
        return self.lifetime_seconds > 0


PRESETS: dict[str, CachePrices] = {
    # Explicit breakpoints: reads at a tenth, writes at a quarter more, five minutes.
    "anthropic": CachePrices(read=0.1, write=1.25, output=5.0, lifetime_seconds=300),
    # Automatic prefix caching: reads at a tenth (the GPT-5 family), writes at the plain
    # price, five to ten minutes idle.
    "openai": CachePrices(read=0.1, write=1.0, output=8.0, lifetime_seconds=300),
    # The GPT-5.6 family and later: writes at a quarter more, as Anthropic's, and every
    # entry kept at least thirty minutes.
    "openai-5.6": CachePrices(read=0.1, write=1.25, output=8.0, lifetime_seconds=1800),
    # Implicit caching kept for hours (DeepSeek's disk cache, Gemini's implicit cache): reads
    # at a quarter, writes at the plain price.
    "deepseek": CachePrices(read=0.25, write=1.0, output=4.0, lifetime_seconds=3600),
    # Every prompt token at the plain price.
    "none": CachePrices(read=1.0, write=1.0, output=4.0, lifetime_seconds=0),
}


# An OpenAI model name's version (``gpt-5.6``, ``gpt-5.6-mini``, ``openai/gpt-6``), not a
# fine-tune's base (``ft:gpt-...``) or an open-weight model (``gpt-oss-120b``).
_GPT_VERSION = re.compile(r"(?:^|/)gpt-(\d+)(?:\.(\d+))?(?![\d.])", re.IGNORECASE)
_WRITES_BILLED_FROM = (5, 6)


def bills_cache_writes(model: str) -> bool:
    """Whether ``model`` is of OpenAI's GPT-5.6 family or a later one, on which a cache write
    costs more than an uncached token (pure)."""
    found = _GPT_VERSION.search(model)
    if found is None:
        return False
    return (int(found[1]), int(found[2] or 0)) >= _WRITES_BILLED_FROM


def preset_for(preset: PricePreset, family: ApiFamily, model: str = "") -> CachePrices:
    """The preset's prices; ``auto`` is the request's family's: Anthropic's for the Messages
    API, otherwise OpenAI's for ``model`` (``openai-5.6`` from the GPT-5.6 family on)."""
    if preset == "auto":
        if family is ApiFamily.ANTHROPIC:
            preset = "anthropic"
        else:
            preset = "openai-5.6" if bills_cache_writes(model) else "openai"
    return PRESETS[preset]


def cache_prices(pricing: PricingPolicy, family: ApiFamily, model: str = "") -> CachePrices:
    """A route's prices for ``model``: its preset with the figures it sets in place of the
    preset's."""
    base = preset_for(pricing.preset, family, model)
    return CachePrices(
        read=base.read if pricing.cache_read is None else pricing.cache_read,
        write=base.write if pricing.cache_write is None else pricing.cache_write,
        output=base.output if pricing.output is None else pricing.output,
        lifetime_seconds=(
            base.lifetime_seconds
            if pricing.cache_lifetime_seconds is None
            else pricing.cache_lifetime_seconds
        ),
    )


@frozen
class StepPrice:
    """A step as the provider bills it. ``saved``: prompt tokens every later request no
    longer carries; ``rewritten``: tokens after the step's first change, read from the cache
    before and written again once; for a checkpoint, its summary call: prompt tokens read from
    the cache (the call starts as the conversation's next request would), written, and the
    summary's output."""

    saved: int
    rewritten: int
    call_read: int = 0
    call_written: int = 0
    call_output: int = 0


def once(prices: CachePrices, step: StepPrice, warm: bool = True) -> float:
    """What the step costs once, beyond what the request would have cost without it."""
    rewrite = step.rewritten * max(0.0, prices.write - prices.read) if warm else 0.0
    call = step.call_read * prices.read + step.call_written * prices.write
    return rewrite + call + step.call_output * prices.output


def per_turn(prices: CachePrices, step: StepPrice) -> float:
    """What the step saves on each later request within the cache's lifetime: its tokens,
    read from the cache (on a provider that caches nothing, billed whole)."""
    return step.saved * (prices.read if prices.caches else prices.write)


def net_value(prices: CachePrices, step: StepPrice, turns: int, warm: bool = True) -> float:
    """What the step saves over ``turns`` later requests, less what it costs once."""
    return per_turn(prices, step) * turns - once(prices, step, warm)


def pays(prices: CachePrices, step: StepPrice, turns: int, warm: bool = True) -> bool:
    """Whether the step saves more than it costs over ``turns`` later requests (never one
    that saves nothing: its cost is never negative)."""
    return net_value(prices, step, turns, warm) > 0


def turns_ahead(turns_so_far: int, room: int, growth_per_turn: float) -> int:
    """How many later requests a step's saving is counted over: as many as the conversation
    has had, at most those until it grows by ``room`` tokens (to where the saving ends) at
    ``growth_per_turn``; at least one."""
    if growth_per_turn <= 0:
        return max(1, turns_so_far)
    lasting = math.floor(max(0, room) / growth_per_turn)
    return max(1, min(turns_so_far, lasting))


def growth_per_turn(history_tokens: int, turns: int) -> float:
    """The tokens a turn adds, on average over the conversation's history as the client sent
    it (``history_tokens``: before any compaction)."""
    return history_tokens / max(1, turns)


def is_warm(prices: CachePrices, last_seen: float | None, now: float) -> bool:
    """Whether the provider still caches the conversation's prefix: its last request came
    within the cache's lifetime (unknown: assumed warm, the dearer case for a step)."""
    if not prices.caches:
        return False
    return last_seen is None or now - last_seen < prices.lifetime_seconds
