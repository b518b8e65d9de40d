"""A store that stopped answering costs one request its timeout, not every request.

When an operation times out or cannot reach the store, the circuit opens: every operation
after it raises ``StoreUnavailable`` at once (the request is served without the store, as
for any store failure), while a background probe pings the store, first after
``first_probe_seconds``, then twice as long each time up to ``max_probe_seconds`` (2 s: a
store back is used again within about that). The first ping answered closes the circuit.
Failures that show the store answering (a script's error, a refused command) leave it
closed: only an outage opens it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from compaction_proxy.metrics import STORE_CIRCUIT_OPEN
from compaction_proxy.store.base import StoreUnavailable

log = logging.getLogger(__name__)

# The failure classes that say the store is out of reach (``StoreUnavailable.detail``).
_OUTAGES = frozenset(
    {
        "TimeoutError",
        "ConnectionError",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "OSError",
        "BusyLoadingError",
    }
)


def is_outage(error: StoreUnavailable) -> bool:
    return error.detail in _OUTAGES


class StoreCircuit:
    def __init__(
        self,
        ping: Callable[[], Awaitable[None]],
        first_probe_seconds: float = 0.25,
        max_probe_seconds: float = 2.0,
    ) -> None:
        self._ping = ping
        self.first_probe_seconds = first_probe_seconds
        self.max_probe_seconds = max_probe_seconds
        self._probe: asyncio.Task[None] | None = None

    @property
    def is_open(self) -> bool:
        return self._probe is not None

    def check(self, operation: str) -> None:
        """Raise ``StoreUnavailable`` at once while the circuit is open."""
        if self._probe is not None:
            raise StoreUnavailable(operation, "short-circuited")

    def failed(self, error: StoreUnavailable) -> None:
        """An operation failed: an outage opens the circuit and starts the probe."""
        if self._probe is not None or not is_outage(error):
            return
        log.warning(
            "store unavailable (%s, %s): served without it until a ping answers",
            error.operation,
            error.detail,
        )
        self._probe = asyncio.get_running_loop().create_task(self._probing())
        STORE_CIRCUIT_OPEN.set(1)

    async def _probing(self) -> None:
        wait = self.first_probe_seconds
        while True:
            await asyncio.sleep(wait)
            try:
                await self._ping()
            except StoreUnavailable:
                wait = min(wait * 2, self.max_probe_seconds)
                continue
            log.warning("store answering again")
            self._probe = None
            STORE_CIRCUIT_OPEN.set(0)
            return

    async def close(self) -> None:
        probe, self._probe = self._probe, None
        if probe is not None:
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
