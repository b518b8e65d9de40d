"""A model's policy in force: its route, its resolved policy, its pruners and its token
budgets (pure, cached per model name by ``PolicyBook``).

Absolute budgets follow from the context window: ``threshold = floor(window *
threshold_ratio)``, ``retain = floor(window * retain_ratio)`` or ``retain_tokens``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import field

from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices, cache_prices
from compaction_proxy.compaction.masking import Masker
from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.policy import (
    configured_window,
    family_route_for,
    resolve_policy,
)
from compaction_proxy.config.settings import Policy, PrunerPolicy, Route, Settings
from compaction_proxy.frozen import frozen
from compaction_proxy.lru import LRU
from compaction_proxy.metering.windows import mapped_window


@frozen
class Budgets:
    """Absolute token budgets for one model with a known context window."""

    window: int
    threshold: int
    retain: int
    precompact: int = 0  # tokens from which a checkpoint is prepared in the background (0: off)
    # Tokens kept free for the answer of a request forwarded while its checkpoint is still
    # being written (None: nothing known of the answer; see answer_reserve).
    answer_reserve: int | None = None
    # Under a soft target (``target_tokens``), the window's own precompaction watermark: below
    # it a checkpoint is a choice, taken only where it pays (``cache_prices``); 0: none is.
    priced_below: int = 0
    window_threshold: int = 0  # under a soft target, the window's own threshold (0: threshold)

    def priced(self, tokens: int) -> bool:
        """Whether a checkpoint at ``tokens`` is a choice the prices make, not a need."""
        return tokens < self.priced_below

    @property
    def must_compact(self) -> int:
        """Tokens from which a request is not forwarded before it is compacted: the threshold;
        with precompaction on, the window less the answer's reserve (never below the
        threshold). Between the two a checkpoint is on its way in the background, and waiting
        for it would cost the client the summary call's time to save a few tokens. Knowing
        nothing of the answer, half the margin above the threshold is kept for it."""
        if not self.precompact:
            return self.threshold
        reserve = self.answer_reserve
        if reserve is None:
            reserve = (self.window - (self.window_threshold or self.threshold)) // 2
        return max(self.threshold, self.window - reserve)

    def with_answer_reserve(self, reserve: int | None) -> Budgets:
        # Every request with a known window asks: built directly, as ``dataclasses.replace``
        # would at several times the cost.
        if reserve == self.answer_reserve:
            return self
        return Budgets(
            self.window,
            self.threshold,
            self.retain,
            self.precompact,
            reserve,
            self.priced_below,
            self.window_threshold,
        )

    def without_precompaction(self) -> Budgets:
        """These budgets with nothing prepared in the background: compaction from the
        threshold, synchronously; under a soft target, up to the window's own threshold
        only where it pays."""
        priced_below = self.window_threshold if self.priced_below else 0
        return dataclasses.replace(self, precompact=0, priced_below=priced_below)

    def for_client_compaction(self) -> Budgets:
        """These budgets for a client's own compaction request (``conversation.
        client_compaction``): its history is about to be replaced, so it is compacted only as
        far as it must to fit with its answer (from ``must_compact``, not the threshold) and
        nothing is prepared in the background."""
        return dataclasses.replace(self, threshold=self.must_compact, precompact=0, priced_below=0)

    def under_declared_cap(self, cap: int | None) -> Budgets:
        """These budgets for a request that declares its answer's cap: the provider refuses a
        prompt that leaves less than the cap, so the threshold is at most the window less it
        (Claude Code asks for 32k of answer: in a 64k window, a 35k prompt is over, though far
        under 80 %). Never below an eighth of the window, where no compaction would make
        room anyway; the precompaction watermark and the retained tail move down with it."""
        if cap is None or self.window - cap >= self.threshold:
            return self
        threshold = max(self.window - cap, self.window // 8)
        lowered = self.threshold - threshold
        precompact = max(1, self.precompact - lowered) if self.precompact else 0
        return dataclasses.replace(
            self,
            threshold=threshold,
            retain=min(self.retain, threshold),
            precompact=min(precompact, threshold),
        )


def wants_precompaction(tokens: int, limits: Budgets) -> bool:
    """Pressure from the precompaction watermark up to where a request must be compacted
    before it goes (pure)."""
    return 0 < limits.precompact <= tokens < limits.must_compact


def precompaction_retain(tokens: int, limits: Budgets) -> int:
    """The retain budget for a span prepared at ``tokens``: the usual one, less the growth
    still expected before the threshold (pure; see the module docstring)."""
    return max(0, limits.retain - max(0, limits.threshold - tokens))


def answer_reserve(window: int, declared_cap: int | None, largest_answer: int | None) -> int | None:
    """Room to leave for a request's answer (pure): the cap the request declares (a provider
    refuses a prompt that leaves less), else a quarter more than the largest answer the
    conversation has had, at least a 32nd of the window (for the meter's error on the new
    messages); None when neither is known."""
    if declared_cap is not None:
        return declared_cap
    if largest_answer is None:
        return None
    return max(window // 32, largest_answer + largest_answer // 4)


def budgets(policy: Policy, window: int) -> Budgets:
    """The budgets in ``window``; under a soft target (``policy.target_tokens``, when below
    the window) the watermarks and the retained tail are worked out from the target, and
    between the target's precompaction watermark and the window's a checkpoint is taken only
    where it pays (``Budgets.priced_below``); without background compaction, up to the
    window's own threshold."""
    target = policy.target_tokens
    base = window if target is None else min(target, window)
    threshold = math.floor(base * policy.threshold_ratio)
    if policy.retain_tokens is not None:
        retain = policy.retain_tokens
    else:
        retain = math.floor(base * (policy.retain_ratio or 0.0))
    precompact = min(math.floor(base * policy.effective_precompact_ratio), threshold)
    priced_below = window_threshold = 0
    if base < window:
        window_threshold = math.floor(window * policy.threshold_ratio)
        # With nothing prepared in the background, the window's threshold forces one.
        priced_below = math.floor(window * policy.effective_precompact_ratio) or window_threshold
    return Budgets(
        window=window,
        threshold=threshold,
        retain=min(retain, threshold),
        precompact=precompact,
        priced_below=priced_below,
        window_threshold=window_threshold,
    )


def bridge_pruner(settings: PrunerPolicy) -> Pruner | None:
    """The bridge's cut (``compaction/bridge.py``), or None when it is off. Only observations
    at least twice the size it leaves are cut: a smaller one would give up its text for
    little room."""
    if not settings.bridge:
        return None
    kept = settings.bridge_head_chars + settings.bridge_tail_chars
    return Pruner(
        threshold_chars=max(1, 2 * kept),
        head_chars=settings.bridge_head_chars,
        tail_chars=settings.bridge_tail_chars,
        user_messages=settings.user_messages,
    )


def masker_for(policy: Policy) -> Masker | None:
    """The masking step's settings (``compaction/masking.py``), or None when it is off."""
    masking = policy.masking
    if not masking.enabled:
        return None
    return Masker(
        keep=masking.keep,
        exclude_tools=frozenset(masking.exclude_tools),
        clear_at_least=masking.clear_at_least,
        user_messages=policy.pruner.user_messages,
    )


@frozen
class ModelPolicy:
    """Everything static the proxy needs to know about one model name."""

    route: Route
    policy: Policy
    pruner: Pruner
    configured_window: int | None
    mapped_window: int | None
    bridge: Pruner | None = None  # the harder cut of a request that must not wait (None: off)
    masker: Masker | None = None  # old observations cleared before a summary (None: off)
    prices: CachePrices = PRESETS["openai"]  # how the provider bills a step (cache_prices)
    _budgets: dict[int, Budgets] = field(default_factory=dict, compare=False, repr=False)

    def budgets(self, window: int) -> Budgets:
        """``budgets(self.policy, window)``, worked out once per window (a policy's budgets
        are fixed; the windows a model is seen with are few)."""
        found = self._budgets.get(window)
        if found is None:
            found = self._budgets[window] = budgets(self.policy, window)
        return found


class PolicyBook:
    """Resolves and caches ``ModelPolicy`` per model name: the ``max_models`` most recently
    used (names are the client's, at most ``formats.request.MAX_MODEL_CHARS`` long, so the
    bytes kept are bounded too)."""

    def __init__(self, settings: Settings, max_models: int = 4096) -> None:
        self._settings = settings
        self._cache: LRU[str, ModelPolicy] = LRU(max_models)

    @property
    def size(self) -> int:
        return len(self._cache)

    def for_model(self, model: str, family: ApiFamily = ApiFamily.OPENAI) -> ModelPolicy:
        """``model``'s policy for a request of ``family``: an Anthropic-family request whose
        model no route matches goes to ``anthropic_base_url`` (``family_route_for``)."""
        key = model if family is ApiFamily.OPENAI else f"{family}\x00{model}"
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        route = family_route_for(self._settings, model, family)
        policy = resolve_policy(self._settings, route, model)
        pruner = Pruner(
            threshold_chars=policy.pruner.threshold_chars,
            head_chars=policy.pruner.head_chars,
            tail_chars=policy.pruner.tail_chars,
            user_messages=policy.pruner.user_messages,
        )
        resolved = ModelPolicy(
            route,
            policy,
            pruner,
            configured_window(route, model),
            mapped_window(model),
            bridge_pruner(policy.pruner),
            masker_for(policy),
            cache_prices(policy.pricing, family, model),
        )
        self._cache.put(key, resolved)
        return resolved
