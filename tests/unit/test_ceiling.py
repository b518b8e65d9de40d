"""The summary ceilings: per tenant and per route, in the store, with a local fallback."""

from __future__ import annotations

from typing import Any

import pytest

from proxy.compaction.ceiling import ROUTE_CEILING, TENANT_CEILING, LocalCeiling, SummaryCeilings
from proxy.store.base import StoreUnavailable
from tests.builders import Clock


def test_ceiling_allows_per_minute_then_refuses_until_the_window_moves() -> None:
    clock = Clock()
    ceiling = LocalCeiling(per_minute=3, clock=clock)
    assert [ceiling.allow("a") for _ in range(4)] == [True, True, True, False]
    assert ceiling.allow("b")  # tenants are counted apart
    clock.now += 59.9
    assert not ceiling.allow("a")
    clock.now += 0.2
    assert ceiling.allow("a")


def test_zero_means_no_ceiling() -> None:
    ceiling = LocalCeiling(per_minute=0)
    assert all(ceiling.allow("a") for _ in range(1000))


def test_idle_tenants_are_forgotten_when_the_table_is_full() -> None:
    clock = Clock()
    ceiling = LocalCeiling(per_minute=1, clock=clock, max_scopes=2)
    assert ceiling.allow("a") and ceiling.allow("b")
    clock.now += 61
    assert ceiling.allow("c")
    assert set(ceiling._calls) == {"c"}


def test_negative_ceiling_is_rejected() -> None:
    with pytest.raises(ValueError):
        LocalCeiling(per_minute=-1)


class _StoreDown:
    async def take_quota(self, quotas: object, window_seconds: int) -> str | None:
        raise StoreUnavailable("take_quota", "down")


@pytest.mark.parametrize(
    ("per_tenant", "per_route", "names"),
    [
        (60, 600, ["summaries:tenant:t", "summaries:route:r"]),
        (0, 600, ["summaries:route:r"]),
        (60, 0, ["summaries:tenant:t"]),
        (0, 0, []),
    ],
)
def test_a_summary_takes_one_unit_of_each_configured_ceiling(
    per_tenant: int, per_route: int, names: list[str]
) -> None:
    quotas = SummaryCeilings(per_tenant, per_route).quotas("t", "r")
    assert [name for name, _ in quotas] == names


async def test_with_the_store_down_each_process_keeps_its_own_count() -> None:
    ceilings = SummaryCeilings(per_tenant=2, per_route=3)
    store: Any = _StoreDown()
    taken = [await ceilings.take(store, tenant, "r") for tenant in ("a", "a", "a", "b", "c")]
    assert taken == [None, None, TENANT_CEILING, None, ROUTE_CEILING]
