"""Planning a compaction (pure given the meter): what one summary call can carry, which span to
summarize, what no compaction can remove.

Nothing here touches the store or the network; the engine runs these steps inside its
transactions, off the event loop for huge requests.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from typing import Any

from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices
from compaction_proxy.compaction.fit import (
    SummaryBudget,
    clipped_span,
    summary_budget,
    summary_cap,
)
from compaction_proxy.compaction.masking import Masker
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.range_selection import (
    PricedNode,
    Span,
    first_node_at,
    priced_nodes,
    region_span,
    retained_node,
    select_span,
)
from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.compaction.summarize import INSTRUCTION, KEPT_NOTE, Summary, summary_body
from compaction_proxy.config.settings import Policy
from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.surface import Surface, SurfaceNode
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import REPLY_PRIMING_TOKENS, TokenMeter, counter_for


@frozen
class SummaryRequest:
    """One summary call: ``body`` in chat form (head, span, instruction), and ``prefix``, the
    surface from the head to the span's end, when the call carries it exactly as it was
    forwarded (None when a message was cut to fit the call). With it, a call in the client's
    own format can start as the conversation's next request would, and read its cached prefix
    (``formats.anthropic_summary``)."""

    body: dict[str, Any]
    prefix: Surface | None = None
    # The same call carried on to where an earlier prompt ended, for a provider that reads its
    # cache only there (``ReadThrough``), made in the client's format in place of this one.
    read_through: SummaryRequest | None = None
    # What this call must wait for before it can read so (``CompactionJob.prompt_answered``).
    not_before: asyncio.Future[bool] | None = None


SummaryCall = Callable[[SummaryRequest], Awaitable[Summary]]


@frozen
class CompactionJob:
    """One request's compaction inputs: its view, policy, window and summary route."""

    view: RequestView
    policy: Policy
    pruner: Pruner
    window: int | None
    summary_model: str
    summarize: SummaryCall
    route: str = ""
    summary_window: int | None = None  # the summary model's window when it differs
    summary_route: str = ""  # names the summarizer for its breaker
    bridge: Pruner | None = None  # the harder cut of a request that must not wait (bridge.py)
    masker: Masker | None = None  # old observations cleared before a summary (masking.py)
    prices: CachePrices = PRESETS["openai"]  # how the provider bills a step (cache_prices.py)
    # The client's own words for its summaries (Anthropic's compact ``instructions``).
    summary_instructions: str | None = None
    # The provider of the client's format reads its cache only where a prompt set a breakpoint
    # (``WireFormat.caches_at_breakpoints``): summary calls read through (``ReadThrough``).
    reads_through: bool = False
    # For a round prepared while this very request goes upstream: resolves, once the answer
    # begins, to whether its prompt was answered (so a provider caching at breakpoints holds
    # it whole); pending until then. None: the request is not sent as the round sees it.
    prompt_answered: asyncio.Future[bool] | None = None

    @property
    def summarizer(self) -> str:
        """Names the summarizer for its breaker: the summary route, else the summary model."""
        return self.summary_route or self.summary_model

    @property
    def call_window(self) -> int | None:
        """The window the summary call must fit."""
        return self.summary_window if self.summary_window is not None else self.window


@frozen
class ReadThrough:
    """The summary call's prefix carried on past the span to the end of an earlier prompt:
    ``prefix`` the surface through it, ``kept`` the messages past the span it adds (which
    the checkpoint leaves in place). See ``read_through_end``."""

    prefix: Surface
    kept: list[Message]
    # Set when it ends where the job's own request does: readable once the answer to that
    # prompt has begun (``CompactionJob.prompt_answered``).
    not_before: asyncio.Future[bool] | None = None


@frozen
class Plan:
    """A span to summarize, the summary's cap, and the span as the summary call carries it
    (oversized messages cut there)."""

    span: Span
    cap: int
    messages: list[Message]
    prefix: Surface | None = None  # head to span end as forwarded, when nothing was cut
    read_through: ReadThrough | None = None


def _ends_a_prompt(nodes: Sequence[PricedNode], index: int) -> bool:
    """Whether node ``index`` closed a request the conversation sent: the model's answer
    follows it."""
    following = index + 1
    return (
        following < len(nodes)
        and nodes[index].message.get("role") != "assistant"
        and nodes[following].message.get("role") == "assistant"
    )


def read_through_end(
    nodes: Sequence[PricedNode],
    span: Span,
    live_from: int,
    call_tokens: Sequence[int],
    room: int | None,
    prices: CachePrices,
    *,
    live_turn_sent: bool = False,
) -> int | None:
    """Where a summary call on a provider that caches only at breakpoints should end its
    prefix, when not at the span's end (None).

    Such a provider (Anthropic) reads a cached prefix only where an earlier prompt put a
    breakpoint, which a client that caches puts on its prompt's last block. A span ending on
    the model's answer (the observation it asked for left in the tail) ends inside a prompt,
    so the call writes the span's last turns again at the write price, though the prompt
    that sent them was cached whole. Carried on to that prompt's end (the messages after the
    answer, up to the next answer), the call reads all of it: taken when those messages fit
    the call's ``room`` (None: unbounded) and reading them costs less than writing the gap
    again. Never into the live turn (``live_from``), which no earlier prompt sent, unless
    ``live_turn_sent``: the request itself goes upstream while its round is prepared, and its
    end is a prompt's end too (readable once its answer begins). A span ending elsewhere needs
    none (it ends where a prompt did, or on a message the model never answered)."""
    if not prices.caches or nodes[span.last].message.get("role") != "assistant":
        return None
    start = span.last
    while start >= span.first and not _ends_a_prompt(nodes, start):
        start -= 1
    gap = sum(call_tokens[start + 1 : span.last + 1])
    last = len(nodes) - 1
    stop = last + 1 if live_turn_sent else min(live_from, last + 1)
    ends = (
        i
        for i in range(span.last + 1, stop)
        if _ends_a_prompt(nodes, i) or (live_turn_sent and i == last)
    )
    end = next(ends, None)
    if end is None:
        return None
    extra = sum(call_tokens[span.last + 1 : end + 1])
    if room is not None and extra > room:
        return None
    return end if extra * prices.read < gap * (prices.write - prices.read) else None


@frozen
class Planner:
    """Prices a request's surface with the meter (cached per message) and decides from the
    prices alone; never mutates what it is given."""

    meter: TokenMeter

    def irreducible_tokens(self, job: CompactionJob, surface: Surface) -> int:
        """What no compaction can remove from the request: head, tools and the live turn."""
        view = job.view
        prices = self.meter.node_tokens(view, surface)
        nodes = priced_nodes(surface.nodes, prices)
        live = first_node_at(nodes, view.live_start)
        head = sum(n.tokens for n in nodes if n.kind == "head")
        tools = self.meter.tools_tokens(view.tools, counter_for(view.model), view.tools_digest)
        return REPLY_PRIMING_TOKENS + tools + head + sum(n.tokens for n in nodes[live:])

    def retained_from(self, job: CompactionJob, surface: Surface, retain: int) -> int:
        """The body position from which the retain budget keeps messages as they are."""
        prices = self.meter.node_tokens(job.view, surface)
        nodes = priced_nodes(surface.nodes, prices)
        kept = retained_node(nodes, retain, first_node_at(nodes, job.view.live_start))
        start = nodes[kept].start if kept < len(nodes) else None
        return len(job.view.body) if start is None else start

    def budget(self, job: CompactionJob, surface: Surface, prices: Sequence[int]) -> SummaryBudget:
        """The summary's cap, the span one summary call can carry, and per message."""
        count = counter_for(job.summary_model)
        fixed = (
            sum(p for n, p in zip(surface.nodes, prices, strict=True) if n.kind == "head")
            + self.meter.tools_tokens(job.view.tools, count, job.view.tools_digest)
            + self.meter.message({"role": "user", "content": INSTRUCTION}, count)
            + 3
        )
        return summary_budget(job.policy.max_tokens, fixed, job.call_window, job.window)

    def call_view(
        self, job: CompactionJob, surface: Surface, prices: Sequence[int], budget: SummaryBudget
    ) -> tuple[list[Message], list[int]]:
        """Every node as the summary call would carry it, and its price there: observations
        and other messages too big for the call are cut to head and tail (checkpoints never)."""
        count = counter_for(job.view.model)
        return clipped_span(
            [n.message for n in surface.nodes],
            prices,
            [n.kind in ("body", "pruned") for n in surface.nodes],
            budget.per_message,
            lambda message: self.meter.message(message, count),
        )

    def plan(
        self, job: CompactionJob, surface: Surface, retain: int, *, to_call: bool = False
    ) -> Plan | None:
        """The head span to summarize (keeping ``retain`` tokens and the live turn).
        ``to_call``: the summary call is made now, so its read-through is worked out too (a
        plan taken for its price alone needs none)."""
        prices = self.meter.node_tokens(job.view, surface)
        budget = self.budget(job, surface, prices)
        if budget.span is not None and budget.span <= 0:
            return None
        nodes = priced_nodes(surface.nodes, prices)
        carried, carried_prices = self.call_view(job, surface, prices, budget)
        live_from = first_node_at(nodes, job.view.live_start)
        span = select_span(
            nodes, retain, budget.span, live_from=live_from, call_tokens=carried_prices
        )
        if span is None:
            return None
        cap = summary_cap(budget.cap, span.tokens)
        if cap is None:
            return None  # no_range: a summary of it could not pay for its call
        plan = _plan(surface, span, cap, carried)
        if not (to_call and job.reads_through and plan.prefix is not None):
            return plan
        room = None
        if budget.span is not None:
            note = self.meter.message(
                {"role": "user", "content": KEPT_NOTE}, counter_for(job.summary_model)
            )
            room = budget.span - sum(carried_prices[span.first : span.last + 1]) - note
        answered = job.prompt_answered
        end = read_through_end(
            nodes,
            span,
            live_from,
            carried_prices,
            room,
            job.prices,
            live_turn_sent=answered is not None,
        )
        if end is None:
            return plan
        kept = carried[span.last + 1 : end + 1]
        if not _as_sent(kept, surface.nodes[span.last + 1 :]):
            return plan  # a message past the span was cut for the call: not as the prompt sent it
        wait = answered if end >= live_from else None  # the live turn: this request's own end
        through = ReadThrough(Surface(tuple(surface.nodes[: end + 1])), list(kept), wait)
        return replace(plan, read_through=through)

    def plan_region(self, job: CompactionJob, surface: Surface, start: int, end: int) -> Plan | str:
        """The plan for body positions ``start..end``, or the reason there cannot be one."""
        prices = self.meter.node_tokens(job.view, surface)
        budget = self.budget(job, surface, prices)
        nodes = priced_nodes(surface.nodes, prices)
        span = region_span(nodes, len(job.view.body), start, end, job.view.live_start)
        if isinstance(span, str):
            return span
        carried, carried_prices = self.call_view(job, surface, prices, budget)
        in_call = sum(carried_prices[span.first : span.last + 1])
        if budget.span is not None and in_call > budget.span:
            return (
                f"the region holds {in_call} tokens, more than one summary call can "
                f"carry ({budget.span})"
            )
        cap = max(1, min(budget.cap, span.tokens))
        return _plan(surface, span, cap, carried)


def _plan(surface: Surface, span: Span, cap: int, carried: Sequence[Message]) -> Plan:
    """The plan of ``span``: the call carries ``carried`` (the surface's messages, some maybe
    cut for the call); its prefix is the surface up to the span's end when none was cut and the
    span follows the head (a span always does: ``select_span``)."""
    messages = list(carried[span.first : span.last + 1])
    nodes = surface.nodes
    whole = _as_sent(messages, nodes[span.first :])
    follows_head = all(n.kind == "head" for n in nodes[: span.first])
    prefix = Surface(tuple(nodes[: span.last + 1])) if whole and follows_head else None
    return Plan(span, cap, messages, prefix)


def _as_sent(carried: Sequence[Message], nodes: Sequence[SurfaceNode]) -> bool:
    """Whether the call carries each of ``nodes``' messages as the surface holds it (none cut
    to fit the call)."""
    return all(m is n.message for m, n in zip(carried, nodes, strict=False))


def summary_request(job: CompactionJob, plan: Plan) -> SummaryRequest:
    """The summary call for ``plan``, in chat form, and read through when the plan says."""
    view = job.view

    def body(kept: Sequence[Message] = ()) -> dict[str, Any]:
        return summary_body(
            job.summary_model,
            view.head,
            plan.messages,
            view.tools,
            plan.cap,
            job.summary_instructions,
            kept,
        )

    through = plan.read_through
    read_through = None
    if through is not None:
        read_through = SummaryRequest(
            body(through.kept), through.prefix, not_before=through.not_before
        )
    return SummaryRequest(body(), plan.prefix, read_through)


# How long a round prepared beside its own request waits for that request's answer before its
# summary call, to read the prompt through its end (``ReadThrough.not_before``): Anthropic
# reads a prefix only once the answer to the prompt that wrote it has begun. The round is ahead
# of need; past this, the call is made without reading through.
ANSWER_WAIT_SECONDS = 30.0


async def with_readable_prefix(request: SummaryRequest) -> SummaryRequest:
    """``request`` once what it reads through is cached whole: at once, unless it ends where a
    prompt not yet answered ends (``SummaryRequest.not_before``), then once its answer began,
    within ``ANSWER_WAIT_SECONDS``; without its read-through if it was not."""
    through = request.read_through
    if through is None or through.not_before is None:
        return request
    try:
        if await asyncio.wait_for(asyncio.shield(through.not_before), ANSWER_WAIT_SECONDS):
            return request
    except TimeoutError:
        pass
    return replace(request, read_through=None)
