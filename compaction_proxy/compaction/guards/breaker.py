"""A circuit breaker per summary route: a dead summarizer costs one wait per cooldown.

After a summary call fails the way a dead or overloaded service fails (timeout, unreachable,
5xx, 429, a garbled answer), no request waits for that route's summarizer until
``cooldown_seconds`` have passed; then one request probes it, and its result closes the breaker
or opens it for another cooldown. Answers that show the summarizer alive (an overflow, a
truncated or empty summary, another 4xx) close it. Per process, like the summary ceiling.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

_DEAD_REASONS = frozenset({"timeout", "unreachable", "malformed", "http_429"})


def means_unavailable(reason: str) -> bool:
    """Whether a failed summary call says the summarizer is down rather than the input bad."""
    return reason in _DEAD_REASONS or reason.startswith("http_5")


@dataclass
class SummaryBreaker:
    cooldown_seconds: float = 60.0
    clock: Callable[[], float] = time.monotonic
    _open_until: dict[str, float] = field(default_factory=dict)
    _probing: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        if self.cooldown_seconds < 0:
            raise ValueError("cooldown_seconds must not be negative")

    def allow(self, route: str) -> bool:
        """May a summary call go to ``route`` now? After a cooldown, the first caller is the
        probe and the others are refused until it reports."""
        until = self._open_until.get(route)
        if until is None:
            return True
        if self.clock() < until or route in self._probing:
            return False
        self._probing.add(route)
        return True

    def succeeded(self, route: str) -> None:
        self._open_until.pop(route, None)
        self._probing.discard(route)

    def failed(self, route: str) -> None:
        self._open_until[route] = self.clock() + self.cooldown_seconds
        self._probing.discard(route)

    def abandoned(self, route: str) -> None:
        """An allowed call never happened (the conversation was busy): free the probe slot."""
        self._probing.discard(route)
