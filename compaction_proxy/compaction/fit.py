"""Sizing the summary call (pure): the summary's own cap, the span it can carry, and oversized
messages cut down inside it.

The summary call runs on the summary model, whose window may be smaller than the request
model's. Its cap is at most a quarter of either window, so an 8k or 16k window still leaves
room for a span. A message too large for the call is cut to head and tail there (and only
there: the conversation's own record of it is untouched), so one huge observation can never
make its span impossible to summarize.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import cut, safe_cut, text_of
from compaction_proxy.frozen import frozen

# The summary's cap is at most this share of the summary model's (and the request model's)
# window.
SUMMARY_SHARE = 0.25
# Our count and the provider's differ a little; the call is sized to this share of the window.
ESTIMATE_MARGIN = 0.97
# One message takes at most this share of the span budget inside the summary call.
MESSAGE_SHARE = 0.5
HEAD_SHARE_OF_CUT = 0.75
# A span smaller than this is not worth a summary call: a summary of it saves next to nothing,
# and its call costs a round trip and the call's whole prompt.
MIN_SUMMARIZED_TOKENS = 1000


@frozen
class SummaryBudget:
    """``cap``: the summary's max tokens. ``span``: the most span tokens one call can carry
    (None without a known window). ``per_message``: the most one message may take in it."""

    cap: int
    span: int | None
    per_message: int | None


def summary_budget(
    max_tokens: int, fixed: int, summary_window: int | None, request_window: int | None
) -> SummaryBudget:
    """``fixed``: what the call carries besides the span (head, tools, instruction)."""
    windows = [w for w in (summary_window, request_window) if w is not None]
    cap = min([max_tokens, *(int(w * SUMMARY_SHARE) for w in windows)])
    if summary_window is None:
        return SummaryBudget(max(1, cap), None, None)
    available = int(summary_window * ESTIMATE_MARGIN) - fixed
    cap = max(1, min(cap, available // 2))
    span = available - cap
    return SummaryBudget(cap, span, max(1, int(span * MESSAGE_SHARE)) if span > 0 else None)


def summary_cap(budget_cap: int, span_tokens: int) -> int | None:
    """The max tokens a summary of a span of ``span_tokens`` is given: at most half the span,
    so it saves at least as much as it costs; None when the span cannot pay for a summary
    call (below ``MIN_SUMMARIZED_TOKENS``, such as one short user message, or an agent's head
    on its first request)."""
    if span_tokens < MIN_SUMMARIZED_TOKENS:
        return None
    return max(1, min(budget_cap, span_tokens // 2))


def clip_for_call(
    message: Message, tokens: int, limit: int, price: Callable[[Message], int]
) -> tuple[Message, int]:
    """``message`` cut to about ``limit`` tokens (head and tail around a marker), and its price;
    unchanged when it fits or holds no text."""
    content = message.get("content")
    text = text_of(content)
    if tokens <= limit or not text:
        return message, tokens
    clipped, clipped_tokens = message, tokens
    ratio = limit / tokens
    for _ in range(4):
        keep = max(0, int(len(text) * ratio * 0.9))
        head_end = safe_cut(text, int(keep * HEAD_SHARE_OF_CUT))
        tail_start = max(head_end, safe_cut(text, len(text) - (keep - head_end)))
        clipped = {**message, "content": cut(content, head_end, tail_start)}
        clipped_tokens = price(clipped)
        if clipped_tokens <= limit or keep == 0:
            break
        ratio *= limit / clipped_tokens
    return clipped, clipped_tokens


def clipped_span(
    messages: Sequence[Message],
    prices: Sequence[int],
    clippable: Sequence[bool],
    per_message: int | None,
    price: Callable[[Message], int],
) -> tuple[list[Message], list[int]]:
    """Every message as the summary call would carry it, and its price there."""
    if per_message is None:
        return list(messages), list(prices)
    carried: list[Message] = []
    carried_prices: list[int] = []
    for message, tokens, may_clip in zip(messages, prices, clippable, strict=True):
        if may_clip and tokens > per_message:
            message, tokens = clip_for_call(message, tokens, per_message, price)
        carried.append(message)
        carried_prices.append(tokens)
    return carried, carried_prices
