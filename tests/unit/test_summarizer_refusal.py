"""A compaction the client asked for and the proxy could not make because no summary could be
had: what the client is told, from the round's outcome and the breaker's wait (pure)."""

from __future__ import annotations

import pytest

from compaction_proxy.compaction.guards.breaker import FailureScope, Wait
from compaction_proxy.compaction.outcomes import Outcome, Round
from compaction_proxy.compaction.summarize import SummaryFailed
from compaction_proxy.service.native_compaction import (
    CompactionRateLimited,
    CompactionUnavailable,
    summarizer_refusal,
)


def failed(reason: str) -> Round:
    return Round(Outcome.SUMMARY_FAILED, failure=SummaryFailed(reason))


@pytest.mark.parametrize(
    ("made", "wait", "rate_limited", "retry_after", "said"),
    [
        (failed("http_429"), Wait(FailureScope.RATE_LIMITED, 30), True, 30, "http_429"),
        (Round(Outcome.BREAKER), Wait(FailureScope.RATE_LIMITED, 0.2), True, 1, "breaker"),
        (failed("http_503"), Wait(FailureScope.OUTAGE, 2), False, 2, "http_503"),
        (Round(Outcome.BREAKER), Wait(FailureScope.OUTAGE, 41.5), False, 42, "breaker"),
        (failed("http_401"), Wait(FailureScope.REFUSED, 300), False, 300, "http_401"),
        (failed("empty"), None, False, None, "empty"),
    ],
)
def test_a_rate_limit_is_the_callers_and_anything_else_the_services_each_with_its_wait(
    made: Round, wait: Wait | None, rate_limited: bool, retry_after: int | None, said: str
) -> None:
    refusal = summarizer_refusal(made, wait)
    assert isinstance(refusal, CompactionRateLimited) is rate_limited
    assert isinstance(refusal, CompactionUnavailable)
    assert refusal.retry_after == retry_after and said in str(refusal)
