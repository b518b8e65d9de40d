"""Calls counted by name over a sliding time window (pure, with an injectable clock).

What the in-process store keeps for quotas, and what each process falls back to for its
summary ceilings while the store is away: the same all-or-nothing rule as the store's script.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field


@dataclass
class SlidingWindows:
    window_seconds: float
    clock: Callable[[], float] = time.monotonic
    max_names: int = 10_000  # past this, names with no call in the window are forgotten
    _calls: dict[str, deque[float]] = field(default_factory=dict)

    def take(self, quotas: Sequence[tuple[str, int]]) -> str | None:
        """One call for every ``(name, limit)`` if none already holds ``limit`` calls in the
        window; else the first name at its limit, and nothing is taken."""
        now = self.clock()
        for name, limit in quotas:
            if self._recent(name, now) >= limit:
                return name
        if len(self._calls) + len(quotas) > self.max_names:
            self._forget_idle(now)
        for name, _ in quotas:
            self._calls.setdefault(name, deque()).append(now)
        return None

    def give_back(self, names: Sequence[str]) -> None:
        """Forget the newest call of each of ``names``."""
        for name in names:
            calls = self._calls.get(name)
            if calls:
                calls.pop()

    def wait(self, name: str, limit: int) -> int | None:
        """Whole seconds until ``name`` holds fewer than ``limit`` calls in the window; None
        when it does now."""
        now = self.clock()
        if self._recent(name, now) < limit:
            return None
        calls = self._calls[name]
        return max(1, math.ceil(calls[len(calls) - limit] + self.window_seconds - now))

    def _recent(self, name: str, now: float) -> int:
        calls = self._calls.get(name)
        if calls is None:
            return 0
        while calls and now - calls[0] >= self.window_seconds:
            calls.popleft()
        return len(calls)

    def _forget_idle(self, now: float) -> None:
        for name in [n for n, c in self._calls.items() if self._recent(n, now) == 0]:
            del self._calls[name]
