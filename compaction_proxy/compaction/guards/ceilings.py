"""Ceilings on summary calls: per tenant and per route, shared by every replica.

Whatever loop a client's behaviour might drive, one tenant cannot make the deployment pay for
more than ``per_tenant`` summary calls a minute, and all tenants of one route together (a
client rotating API keys makes a new tenant per key) no more than ``per_route``. The counts
live in the store (a sliding minute, one script for both), so N replicas do not multiply
them. While the store is unreachable each process falls back to its own count of the
same ceilings: bounded per process, never unbounded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from compaction_proxy.store.base import Store, StoreUnavailable
from compaction_proxy.store.sliding_windows import SlidingWindows

WINDOW_SECONDS = 60
TENANT_CEILING = "tenant_ceiling"
ROUTE_CEILING = "route_ceiling"
_TENANT_QUOTA = "summaries:tenant:"
_ROUTE_QUOTA = "summaries:route:"


@dataclass
class SummaryCeilings:
    per_tenant: int  # 0: no ceiling
    per_route: int  # 0: no ceiling
    local: SlidingWindows = field(init=False)  # this process's count, while the store is away

    def __post_init__(self) -> None:
        if self.per_tenant < 0 or self.per_route < 0:
            raise ValueError("a summary ceiling is 0 (none) or positive")
        self.local = SlidingWindows(WINDOW_SECONDS)

    def quotas(self, tenant: str, route: str) -> list[tuple[str, int]]:
        """The quotas one summary call takes (pure)."""
        quotas = []
        if self.per_tenant:
            quotas.append((_TENANT_QUOTA + tenant, self.per_tenant))
        if self.per_route:
            quotas.append((_ROUTE_QUOTA + route, self.per_route))
        return quotas

    async def give_back_route(self, store: Store, route: str) -> None:
        """Give the route's unit of a call back: the call concerned one tenant's credential
        only (``breaker.concerns_the_caller_alone``), and counts against that tenant alone."""
        if not self.per_route:
            return
        name = _ROUTE_QUOTA + route
        try:
            await store.give_back_quota([name], WINDOW_SECONDS)
        except StoreUnavailable:
            self.local.give_back([name])

    async def take(self, store: Store, tenant: str, route: str) -> str | None:
        """Take one summary call; None when allowed, else the ceiling that refused it."""
        quotas = self.quotas(tenant, route)
        if not quotas:
            return None
        try:
            refused = await store.take_quota(quotas, WINDOW_SECONDS)
        except StoreUnavailable:
            refused = self.local.take(quotas)
        if refused is None:
            return None
        return TENANT_CEILING if refused.startswith(_TENANT_QUOTA) else ROUTE_CEILING
