"""A compaction the client asked for and the proxy could not make because no summary could be
had: what the client is told, from the round's outcome and the breaker's wait (pure)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.guards.breaker import FailureScope, Wait
from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.compaction.summarize import SummaryFailed
from compaction_proxy.metering.overflow import NAMELESS_ERROR, ErrorKind
from compaction_proxy.service.native_compaction import (
    CompactionRateLimited,
    CompactionUnavailable,
    summarizer_refusal,
)


def failed(reason: str) -> Round:
    return Round(Outcome.SUMMARY_FAILED, failure=SummaryFailed(reason))


BREAKER = Round(Outcome.BREAKER)
LIMITED = FailureScope.RATE_LIMITED


@pytest.mark.parametrize(
    ("made", "wait", "rate_limited", "retry_after"),
    [
        (failed("http_429"), Wait(LIMITED, 30, stated=True), True, 30),
        (BREAKER, Wait(LIMITED, 0.2, stated=True), True, 1),
        (failed("http_429"), Wait(LIMITED, 60), True, None),  # the breaker's own cooldown
        (BREAKER, Wait(LIMITED, 41.5), True, None),
        (failed("http_503"), Wait(FailureScope.OUTAGE, 2), False, None),
        (BREAKER, Wait(FailureScope.OUTAGE, 41.5), False, None),
        (failed("http_401"), Wait(FailureScope.REFUSED, 300), False, None),
        (failed("empty"), None, False, None),
    ],
)
def test_a_rate_limit_is_the_callers_with_only_a_stated_wait_and_anything_else_the_services(
    made: Round, wait: Wait | None, rate_limited: bool, retry_after: int | None
) -> None:
    refusal = summarizer_refusal(made, wait)
    assert isinstance(refusal, CompactionRateLimited) is rate_limited
    assert isinstance(refusal, CompactionUnavailable)
    assert getattr(refusal, "retry_after", None) == retry_after
    reason = made.failure.reason if made.failure is not None else "breaker"
    assert ("rate-limiting" if rate_limited else reason) in str(refusal)


SPENT = ErrorKind("insufficient_quota", "insufficient_quota")


@pytest.mark.parametrize(
    ("wait", "kind"),
    [
        (Wait(LIMITED, 60, kind=SPENT), SPENT),
        (Wait(LIMITED, 30, stated=True, kind=ErrorKind("requests", "rate_limit_exceeded")), None),
        (Wait(LIMITED, 30, stated=True), NAMELESS_ERROR),
    ],
)
def test_a_rate_limit_carries_the_kind_the_upstream_gave_the_callers_key(
    wait: Wait, kind: ErrorKind | None
) -> None:
    refusal = summarizer_refusal(failed("http_429"), wait)
    assert isinstance(refusal, CompactionRateLimited)
    assert refusal.kind == (wait.kind if kind is None else kind)
    if wait.kind.code:
        assert f"({wait.kind.code})" in str(refusal)
