"""Failed admin tokens: counted, said once a minute, and throttled per client address.

An admin token guarded by nothing else can be guessed at the speed of the network. Past
``per_minute`` failures from one address in the last minute, that address's admin requests are
refused (429) before their token is checked, so a guess made meanwhile learns nothing; other
addresses, the operator's among them, are served as before.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from compaction_proxy.metrics import ADMIN_AUTH_FAILURES
from compaction_proxy.store.sliding_windows import SlidingWindows

log = logging.getLogger(__name__)

WINDOW_SECONDS = 60.0


@dataclass
class AdminGuesses:
    per_minute: int = 20
    clock: Callable[[], float] = time.monotonic
    _failures: SlidingWindows = field(init=False)
    _unsaid: int = 0  # failures since the last log line
    _said_at: float = -math.inf

    def __post_init__(self) -> None:
        self._failures = SlidingWindows(WINDOW_SECONDS, clock=self.clock)

    def throttled(self, address: str) -> int | None:
        """Seconds until ``address`` may try a token again; None when it may now."""
        return self._failures.wait(address, self.per_minute)

    def refused(self, address: str) -> None:
        """One admin request refused for its token (or while throttled)."""
        ADMIN_AUTH_FAILURES.inc()
        self._failures.take([(address, self.per_minute)])
        self._unsaid += 1
        now = self.clock()
        if now - self._said_at >= WINDOW_SECONDS:
            log.warning(
                "%d failed admin token(s) since the last such line, the latest from %r",
                self._unsaid,
                address,
            )
            self._said_at, self._unsaid = now, 0
