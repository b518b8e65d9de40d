"""The per-tenant ceiling on summary calls."""

from __future__ import annotations

import pytest

from proxy.compaction.ceiling import SummaryCeiling
from tests.builders import Clock


def test_ceiling_allows_per_minute_then_refuses_until_the_window_moves() -> None:
    clock = Clock()
    ceiling = SummaryCeiling(per_minute=3, clock=clock)
    assert [ceiling.allow("a") for _ in range(4)] == [True, True, True, False]
    assert ceiling.allow("b")  # tenants are counted apart
    clock.now += 59.9
    assert not ceiling.allow("a")
    clock.now += 0.2
    assert ceiling.allow("a")


def test_zero_means_no_ceiling() -> None:
    ceiling = SummaryCeiling(per_minute=0)
    assert all(ceiling.allow("a") for _ in range(1000))


def test_idle_tenants_are_forgotten_when_the_table_is_full() -> None:
    clock = Clock()
    ceiling = SummaryCeiling(per_minute=1, clock=clock, max_tenants=2)
    assert ceiling.allow("a") and ceiling.allow("b")
    clock.now += 61
    assert ceiling.allow("c")
    assert set(ceiling._calls) == {"c"}


def test_negative_ceiling_is_rejected() -> None:
    with pytest.raises(ValueError):
        SummaryCeiling(per_minute=-1)
