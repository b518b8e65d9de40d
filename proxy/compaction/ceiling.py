"""Ceilings on summary calls: per tenant and per route, shared by every replica.

Whatever loop a client's behaviour might drive, one tenant cannot make the deployment pay for
more than ``per_tenant`` summary calls a minute, and all tenants of one route together (a
client rotating API keys makes a new tenant per key) no more than ``per_route``. The counts
live in the store (a sliding minute, one script for both), so N replicas do not multiply
them. While the store is unreachable each process falls back to its own count of the
same ceilings: bounded per process, never unbounded.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from proxy.store.base import Store, StoreUnavailable

WINDOW_SECONDS = 60


@dataclass
class LocalCeiling:
    """A sliding-window count in this process (the fallback), with an injectable clock."""

    per_minute: int  # 0: no ceiling
    clock: Callable[[], float] = time.monotonic
    max_scopes: int = 10_000
    _calls: dict[str, deque[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.per_minute < 0:
            raise ValueError("per_minute must be 0 (no ceiling) or positive")

    def allow(self, scope: str) -> bool:
        """Record one summary call for ``scope`` if it is under the ceiling."""
        if self.per_minute == 0:
            return True
        now = self.clock()
        calls = self._calls.get(scope)
        if calls is None:
            if len(self._calls) >= self.max_scopes:
                self._drop_idle(now)
            calls = self._calls.setdefault(scope, deque())
        while calls and now - calls[0] >= WINDOW_SECONDS:
            calls.popleft()
        if len(calls) >= self.per_minute:
            return False
        calls.append(now)
        return True

    def _drop_idle(self, now: float) -> None:
        for scope in [s for s, c in self._calls.items() if not c or now - c[-1] >= WINDOW_SECONDS]:
            del self._calls[scope]


TENANT_CEILING = "tenant_ceiling"
ROUTE_CEILING = "route_ceiling"


@dataclass
class SummaryCeilings:
    per_tenant: int  # 0: no ceiling
    per_route: int  # 0: no ceiling
    local_tenants: LocalCeiling = field(init=False)
    local_routes: LocalCeiling = field(init=False)

    def __post_init__(self) -> None:
        self.local_tenants = LocalCeiling(self.per_tenant)
        self.local_routes = LocalCeiling(self.per_route)

    def quotas(self, tenant: str, route: str) -> list[tuple[str, int]]:
        """The store quotas one summary call takes (pure)."""
        quotas = []
        if self.per_tenant:
            quotas.append((f"summaries:tenant:{tenant}", self.per_tenant))
        if self.per_route:
            quotas.append((f"summaries:route:{route}", self.per_route))
        return quotas

    async def take(self, store: Store, tenant: str, route: str) -> str | None:
        """Take one summary call; None when allowed, else the ceiling that refused it."""
        quotas = self.quotas(tenant, route)
        if not quotas:
            return None
        try:
            refused = await store.take_quota(quotas, WINDOW_SECONDS)
        except StoreUnavailable:
            return self._take_locally(tenant, route)
        if refused is None:
            return None
        return TENANT_CEILING if refused.startswith("summaries:tenant:") else ROUTE_CEILING

    def _take_locally(self, tenant: str, route: str) -> str | None:
        if not self.local_tenants.allow(tenant):
            return TENANT_CEILING
        if not self.local_routes.allow(route):
            return ROUTE_CEILING
        return None
