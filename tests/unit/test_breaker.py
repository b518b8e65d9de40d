"""The summarizer breaker: a failure is charged to whom it concerns. One tenant's refused key
or rate limit is that tenant's alone; an outage seen by several tenants opens the summarizer,
then one probe goes through, seconds later at first, then twice as long each outage in a row,
up to the cooldown."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.guards.breaker import (
    FailureScope,
    SummaryBreaker,
    Wait,
    concerns_the_caller_alone,
    failure_scope,
)
from compaction_proxy.metering.overflow import ErrorKind
from tests.builders import Clock


def outage(breaker: SummaryBreaker, *tenants: str) -> None:
    for tenant in tenants:
        breaker.failed("r", tenant, "http_503")


def test_an_outage_seen_by_two_tenants_opens_the_summarizer_then_one_probe_goes_through() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    assert breaker.allow("r", "a")
    outage(breaker, "a", "b")  # a's backs a off 2 s; b's opens the summarizer for 4 s
    assert not breaker.allow("r", "c")
    clock.now += 3.9
    assert not breaker.allow("r", "c")
    clock.now += 0.2
    assert breaker.allow("r", "c")  # the probe
    assert not breaker.allow("r", "d")  # everyone else waits for its result
    breaker.succeeded("r", "c")
    assert breaker.allow("r", "d") and breaker.allow("r", "e")


def test_an_outage_seen_by_one_tenant_backs_that_tenant_off_only() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a", "a", "a")  # backs off 2, 4, then 8 s
    assert not breaker.allow("r", "a")
    assert breaker.allow("r", "b")
    clock.now += 7.9
    assert not breaker.allow("r", "a")
    clock.now += 0.2
    assert breaker.allow("r", "a")


def test_outages_further_apart_than_a_cooldown_never_add_up() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a")
    clock.now += 61
    outage(breaker, "b")
    assert breaker.allow("r", "c")


def test_a_failed_probe_opens_it_again() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a", "b")
    clock.now += 61
    assert breaker.allow("r", "c")
    outage(breaker, "c")  # the third outage in a row: 8 s
    assert not breaker.allow("r", "d")
    clock.now += 7.9
    assert not breaker.allow("r", "d")
    clock.now += 0.2
    assert breaker.allow("r", "d")


def test_a_rate_limited_tenant_waits_its_retry_after_and_nobody_else_does() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    for _ in range(50):
        breaker.failed("r", "attacker", "http_429", retry_after=20)
    assert not breaker.allow("r", "attacker")
    assert breaker.allow("r", "victim")
    clock.now += 21
    assert breaker.allow("r", "attacker")


def test_a_refused_credential_makes_no_summary_call_for_a_while_and_concerns_nobody_else() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, refused_seconds=300, clock=clock)
    for n in range(100):
        breaker.failed("r", f"random-key-{n}", "http_401")
    assert not breaker.allow("r", "random-key-7")
    assert breaker.allow("r", "valid")
    clock.now += 299
    assert not breaker.allow("r", "random-key-7")
    clock.now += 2
    assert breaker.allow("r", "random-key-7")


def test_summarizers_are_independent_and_an_abandoned_probe_frees_its_slot() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a", "b")
    assert breaker.allow("other", "a")
    clock.now += 61
    assert breaker.allow("r", "c")
    breaker.abandoned("r")
    assert breaker.allow("r", "c")


@pytest.mark.parametrize(
    ("reason", "scope"),
    [
        ("timeout", FailureScope.OUTAGE),
        ("unreachable", FailureScope.OUTAGE),
        ("http_500", FailureScope.OUTAGE),
        ("http_503", FailureScope.OUTAGE),
        ("malformed", FailureScope.OUTAGE),
        ("http_429", FailureScope.RATE_LIMITED),
        ("http_401", FailureScope.REFUSED),
        ("http_403", FailureScope.REFUSED),
        ("overflow", FailureScope.ALIVE),
        ("length", FailureScope.ALIVE),
        ("empty", FailureScope.ALIVE),
        ("http_400", FailureScope.ALIVE),
    ],
)
def test_each_failure_is_charged_to_whom_it_concerns(reason: str, scope: FailureScope) -> None:
    assert failure_scope(reason) is scope


@pytest.mark.parametrize(
    ("reason", "caller_credential", "alone"),
    [
        ("http_401", False, True),
        ("http_403", True, True),
        ("http_429", True, True),  # the caller's own quota or rate
        ("http_429", False, False),  # a held key's limit is everyone's
        ("http_500", True, False),
        ("timeout", True, False),
        ("length", True, False),
    ],
)
def test_only_failures_of_the_callers_own_key_spare_the_routes_ceiling(
    reason: str, caller_credential: bool, alone: bool
) -> None:
    assert concerns_the_caller_alone(reason, caller_credential) is alone


def test_the_waits_double_with_each_failed_probe_up_to_the_cooldown_and_a_success_resets_them() -> (
    None
):
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a", "b")
    waits = []
    for _ in range(8):  # the summarizer stays down: each probe fails
        opened_at = clock.now
        while not breaker.allow("r", "probe"):
            clock.now += 0.5
        waits.append(clock.now - opened_at)
        outage(breaker, "probe")
    assert waits == [4.0, 8.0, 16.0, 32.0, 60.0, 60.0, 60.0, 60.0]
    breaker.succeeded("r", "probe")
    outage(breaker, "a", "b")
    assert not breaker.allow("r", "c")
    clock.now += 4.1
    assert breaker.allow("r", "c")  # back to seconds


def test_calls_that_fail_after_the_summarizer_opened_do_not_lengthen_its_wait() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, clock=clock)
    outage(breaker, "a", "b")  # open for 4 s
    outage(breaker, *(f"in-flight-{n}" for n in range(20)))  # made before it opened
    assert not breaker.allow("r", "in-flight-3")
    clock.now += 4.1
    assert breaker.allow("r", "c")


SPENT = ErrorKind("insufficient_quota", "insufficient_quota")


def test_a_caller_is_told_its_own_back_off_and_how_long_it_lasts_and_nothing_else() -> None:
    clock = Clock()
    breaker = SummaryBreaker(60, refused_seconds=300, clock=clock)
    breaker.failed("r", "limited", "http_429", retry_after=20)
    breaker.failed("r", "unfunded", "http_429", kind=SPENT)  # no wait stated: the cooldown
    breaker.failed("r", "refused", "http_401", kind=SPENT)  # a kind kept for a rate limit only
    breaker.failed("r", "dull", "empty")  # the summarizer answered: nothing to wait for
    clock.now += 5
    assert breaker.waiting("r", "limited") == Wait(FailureScope.RATE_LIMITED, 15, stated=True)
    unfunded = Wait(FailureScope.RATE_LIMITED, 55, stated=False, kind=SPENT)
    assert breaker.waiting("r", "unfunded") == unfunded
    assert breaker.waiting("r", "refused") == Wait(FailureScope.REFUSED, 295)
    assert breaker.waiting("r", "dull") is None and breaker.waiting("r", "other") is None
    outage(breaker, "a", "b")  # backs a off 2 s; b's opens the summarizer for 4 s
    clock.now += 1
    assert not breaker.allow("r", "other")
    assert breaker.waiting("r", "other") is None  # everyone's outage, not its own back-off
    assert breaker.waiting("r", "a") == Wait(FailureScope.OUTAGE, 1)
    assert breaker.waiting("r", "limited") == Wait(FailureScope.RATE_LIMITED, 14, stated=True)
    clock.now += 14
    assert breaker.waiting("r", "limited") is None and breaker.waiting("r", "a") is None
