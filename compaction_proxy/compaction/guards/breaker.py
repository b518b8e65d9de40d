"""Who waits for a summarizer after a failed summary call: the tenant whose call failed, or,
when the service itself is down, everyone on its route (pure, with an injectable clock).

A failure is read for what it says and charged to whom it concerns:

* the credential was refused (401, 403): that tenant's credential makes no summary call for
  ``refused_seconds``; nobody else is concerned;
* the tenant is being rate-limited (429): that tenant backs off for the ``Retry-After`` the
  upstream stated, else ``cooldown_seconds``; a back-off, not an outage;
* the service looks down (a timeout, no connection, a 5xx, a garbled answer): that tenant backs
  off, and once ``tenants_for_outage`` different tenants have seen it within
  ``cooldown_seconds``, the whole summarizer is open: no request waits for it until its wait has
  passed, then one request probes it (half-open), and its result closes it or opens it again.
  The wait (a tenant's back-off and the opening alike) starts at ``first_probe_seconds`` and
  doubles with each outage in a row, up to ``cooldown_seconds``: a summarizer back after a
  blip is probed within seconds, a dead one costs one wait a minute. A failure of a call made
  before it opened changes nothing; a success (or any answer that shows it alive) starts the
  waits over.

Answers that show the summarizer alive (an overflow, a truncated or empty summary, another 4xx)
clear that tenant's back-off. So one tenant can never switch compaction off for another: its
own keys, limits and refusals are its own. Per process, like the local summary ceilings.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from compaction_proxy.frozen import frozen
from compaction_proxy.metering.overflow import NAMELESS_ERROR, ErrorKind

_OUTAGE_REASONS = frozenset({"timeout", "unreachable", "malformed"})
_REFUSED_REASONS = frozenset({"http_401", "http_403"})


class FailureScope(Enum):
    OUTAGE = "outage"  # the service: counts toward the route-wide breaker
    RATE_LIMITED = "rate_limited"  # this tenant, for its Retry-After
    REFUSED = "refused"  # this tenant's credential
    ALIVE = "alive"  # the summarizer answered: nothing to wait for


@frozen
class Wait:
    """A tenant's own back-off from a summarizer: the scope of the failure that started it,
    the seconds left, whether those are the upstream's stated wait (a rate limit's
    ``Retry-After``) rather than the breaker's own, and the kind of error the upstream gave
    the caller's own key (a spent quota or a rate limit). A compaction the client asked for
    answers a rate limit as one (429), passing on only a stated wait and that kind."""

    scope: FailureScope
    seconds: float
    stated: bool = False
    kind: ErrorKind = NAMELESS_ERROR


@frozen
class _BackOff:
    until: float
    scope: FailureScope
    stated: bool = False
    kind: ErrorKind = NAMELESS_ERROR


def failure_scope(reason: str) -> FailureScope:
    """What a failed summary call says, by its reason (pure)."""
    if reason in _OUTAGE_REASONS or reason.startswith("http_5"):
        return FailureScope.OUTAGE
    if reason == "http_429":
        return FailureScope.RATE_LIMITED
    if reason in _REFUSED_REASONS:
        return FailureScope.REFUSED
    return FailureScope.ALIVE


def concerns_the_caller_alone(reason: str, caller_credential: bool) -> bool:
    """Whether a failed summary call concerns its caller's key alone, so it spends no unit of
    the route's ceiling (pure): the credential was refused, or, sent on the caller's own key,
    rate-limited (its quota or its rate; a 429 on a key the proxy holds is everyone's)."""
    scope = failure_scope(reason)
    return scope is FailureScope.REFUSED or (
        scope is FailureScope.RATE_LIMITED and caller_credential
    )


@dataclass
class SummaryBreaker:
    cooldown_seconds: float = 60.0
    refused_seconds: float = 300.0
    tenants_for_outage: int = 2
    first_probe_seconds: float = 2.0
    clock: Callable[[], float] = time.monotonic
    max_tenants: int = 100_000  # back-offs kept; past it, the expired ones are forgotten
    _open_until: dict[str, float] = field(default_factory=dict)  # by summarizer
    _probing: set[str] = field(default_factory=set)
    _outages: dict[str, dict[str, float]] = field(default_factory=dict)  # summarizer: tenant: when
    _backoff: dict[tuple[str, str], _BackOff] = field(default_factory=dict)  # (summarizer, tenant)
    _outages_in_a_row: dict[str, int] = field(default_factory=dict)  # by summarizer

    def __post_init__(self) -> None:
        if min(self.cooldown_seconds, self.refused_seconds, self.first_probe_seconds) < 0:
            raise ValueError("the breaker's waits must not be negative")
        if self.tenants_for_outage < 1:
            raise ValueError("tenants_for_outage must be at least 1")

    def allow(self, summarizer: str, tenant: str) -> bool:
        """May ``tenant`` call ``summarizer`` now? Not while its own back-off lasts; and while
        the summarizer is open, only the first caller after the cooldown (the probe)."""
        now = self.clock()
        backoff = self._backoff.get((summarizer, tenant))
        if backoff is not None and backoff.until > now:
            return False
        until = self._open_until.get(summarizer)
        if until is None:
            return True
        if now < until or summarizer in self._probing:
            return False
        self._probing.add(summarizer)
        return True

    def waiting(self, summarizer: str, tenant: str) -> Wait | None:
        """``tenant``'s own back-off from ``summarizer``, while it lasts; None otherwise (an
        open summarizer is everyone's outage, not the tenant's)."""
        backoff = self._backoff.get((summarizer, tenant))
        now = self.clock()
        if backoff is None or backoff.until <= now:
            return None
        return Wait(backoff.scope, backoff.until - now, backoff.stated, backoff.kind)

    def is_open(self, summarizer: str) -> bool:
        """Whether ``summarizer`` is open or half-open: only a probe may call it."""
        return summarizer in self._open_until

    def succeeded(self, summarizer: str, tenant: str) -> None:
        self._open_until.pop(summarizer, None)
        self._probing.discard(summarizer)
        self._outages.pop(summarizer, None)
        self._outages_in_a_row.pop(summarizer, None)
        self._backoff.pop((summarizer, tenant), None)

    def outage_wait(self, summarizer: str) -> float:
        """How long the next outage backs off (a tenant, or the summarizer when it opens):
        ``first_probe_seconds`` doubled per outage in a row, at most ``cooldown_seconds``."""
        in_a_row = min(self._outages_in_a_row.get(summarizer, 0), 32)
        return min(self.cooldown_seconds, self.first_probe_seconds * float(2**in_a_row))

    def failed(
        self,
        summarizer: str,
        tenant: str,
        reason: str,
        retry_after: float | None = None,
        kind: ErrorKind = NAMELESS_ERROR,
    ) -> None:
        """Charge a failed call to whom it concerns (see the module's docstring). ``kind``:
        the error's type and code, kept with a rate limit's back-off when the call went out
        on the tenant's own key (on a key the proxy holds, they are not the tenant's)."""
        scope = failure_scope(reason)
        now = self.clock()
        if scope is FailureScope.ALIVE:
            self.succeeded(summarizer, tenant)
            return
        until = self._open_until.get(summarizer)
        if until is not None and now < until and scope is FailureScope.OUTAGE:
            # A call made before the summarizer opened: the opening stands as it is.
            self._back_off(summarizer, tenant, _BackOff(until, scope))
            return
        self._probing.discard(summarizer)  # half-open, this is the probe's answer
        wait = self.cooldown_seconds
        if scope is FailureScope.REFUSED:
            wait = self.refused_seconds
        elif scope is FailureScope.RATE_LIMITED and retry_after is not None:
            wait = retry_after
        elif scope is FailureScope.OUTAGE:
            wait = self.outage_wait(summarizer)
        limited = scope is FailureScope.RATE_LIMITED
        stated = limited and retry_after is not None
        backoff = _BackOff(now + wait, scope, stated, kind if limited else NAMELESS_ERROR)
        self._back_off(summarizer, tenant, backoff)
        if scope is not FailureScope.OUTAGE:
            return
        seen = self._outages.setdefault(summarizer, {})
        seen[tenant] = now
        for other, when in list(seen.items()):
            if now - when >= self.cooldown_seconds:
                del seen[other]
        self._outages_in_a_row[summarizer] = self._outages_in_a_row.get(summarizer, 0) + 1
        if len(seen) >= self.tenants_for_outage or until is not None:
            self._open_until[summarizer] = now + wait

    def abandoned(self, summarizer: str) -> None:
        """An allowed call never happened (the conversation was busy): free the probe slot."""
        self._probing.discard(summarizer)

    def _back_off(self, summarizer: str, tenant: str, backoff: _BackOff) -> None:
        if len(self._backoff) >= self.max_tenants:
            now = self.clock()
            for key in [k for k, v in self._backoff.items() if v.until <= now]:
                del self._backoff[key]
        self._backoff[(summarizer, tenant)] = backoff
