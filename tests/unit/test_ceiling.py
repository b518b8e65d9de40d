"""The summary ceilings: per tenant and per route, in the store, with a local fallback."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.compaction.guards.ceilings import (
    ROUTE_CEILING,
    TENANT_CEILING,
    SummaryCeilings,
)
from compaction_proxy.store.base import StoreUnavailable
from compaction_proxy.store.sliding_windows import SlidingWindows
from tests.builders import Clock


def test_calls_are_counted_per_name_until_the_window_moves() -> None:
    clock = Clock()
    windows = SlidingWindows(60, clock=clock)
    assert [windows.take([("a", 3)]) for _ in range(4)] == [None, None, None, "a"]
    assert windows.take([("b", 3)]) is None  # names are counted apart
    clock.now += 59.9
    assert windows.take([("a", 3)]) == "a"
    clock.now += 0.2
    assert windows.take([("a", 3)]) is None


def test_a_refused_call_takes_from_no_quota() -> None:
    windows = SlidingWindows(60, clock=Clock())
    assert windows.take([("tenant", 1), ("route", 5)]) is None
    assert windows.take([("tenant", 1), ("route", 5)]) == "tenant"
    assert [windows.take([("route", 2)]) for _ in range(2)] == [None, "route"]


def test_idle_names_are_forgotten_when_the_table_is_full() -> None:
    clock = Clock()
    windows = SlidingWindows(60, clock=clock, max_names=2)
    assert windows.take([("a", 1)]) is None and windows.take([("b", 1)]) is None
    clock.now += 61
    assert windows.take([("c", 1)]) is None
    assert set(windows._calls) == {"c"}


def test_a_negative_ceiling_is_rejected() -> None:
    with pytest.raises(ValueError):
        SummaryCeilings(per_tenant=-1, per_route=600)


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
