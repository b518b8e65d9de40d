"""A per-tenant ceiling on summary calls (pure, with an injectable clock).

Whatever loop a client's behaviour might drive, one tenant cannot make this process pay for more
than ``per_minute`` summary calls in any sixty seconds.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

WINDOW_SECONDS = 60.0


@dataclass
class SummaryCeiling:
    per_minute: int  # 0: no ceiling
    clock: Callable[[], float] = time.monotonic
    max_tenants: int = 10_000
    _calls: dict[str, deque[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.per_minute < 0:
            raise ValueError("per_minute must be 0 (no ceiling) or positive")

    def allow(self, tenant: str) -> bool:
        """Record one summary call for ``tenant`` if it is under the ceiling."""
        if self.per_minute == 0:
            return True
        now = self.clock()
        calls = self._calls.get(tenant)
        if calls is None:
            if len(self._calls) >= self.max_tenants:
                self._drop_idle(now)
            calls = self._calls.setdefault(tenant, deque())
        while calls and now - calls[0] >= WINDOW_SECONDS:
            calls.popleft()
        if len(calls) >= self.per_minute:
            return False
        calls.append(now)
        return True

    def _drop_idle(self, now: float) -> None:
        for tenant in [t for t, c in self._calls.items() if not c or now - c[-1] >= WINDOW_SECONDS]:
            del self._calls[tenant]
