"""The summarizer breaker: one wait per cooldown, one probe, closed by a live answer."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.guards.breaker import SummaryBreaker, means_unavailable
from tests.builders import Clock


def test_a_failure_opens_the_breaker_for_the_cooldown_then_one_probe_goes_through() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock)
    assert breaker.allow("r")
    breaker.failed("r")
    assert not breaker.allow("r")
    clock.now += 59
    assert not breaker.allow("r")
    clock.now += 2
    assert breaker.allow("r")  # the probe
    assert not breaker.allow("r")  # everyone else waits for its result
    breaker.succeeded("r")
    assert breaker.allow("r") and breaker.allow("r")


def test_a_failed_probe_opens_it_again() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock)
    breaker.failed("r")
    clock.now += 61
    assert breaker.allow("r")
    breaker.failed("r")
    assert not breaker.allow("r")
    clock.now += 61
    assert breaker.allow("r")


def test_routes_are_independent_and_an_abandoned_probe_frees_its_slot() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock)
    breaker.failed("a")
    assert breaker.allow("b")
    clock.now += 61
    assert breaker.allow("a")
    breaker.abandoned("a")
    assert breaker.allow("a")


@pytest.mark.parametrize(
    ("reason", "unavailable"),
    [
        ("timeout", True),
        ("unreachable", True),
        ("http_500", True),
        ("http_503", True),
        ("http_429", True),
        ("malformed", True),
        ("overflow", False),
        ("length", False),
        ("empty", False),
        ("http_400", False),
    ],
)
def test_only_failures_of_the_service_trip_it(reason: str, unavailable: bool) -> None:
    assert means_unavailable(reason) is unavailable
