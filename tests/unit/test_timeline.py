"""The timeline read from a conversation's log: one point per request, compactions paired by
owner, overflows placed on the request they answered."""

from __future__ import annotations

from typing import Any

from compaction_proxy.conversation.log_events import usage_event
from compaction_proxy.conversation.timeline import compactions, overflows, request_points, timeline


def request(ts: float, forwarded: int, sent: int | None = None, status: str = "none") -> Any:
    event = {"type": "request", "ts": ts, "estimated_tokens": forwarded, "status": status}
    if sent is not None:
        event["client_tokens"] = sent
    return {**event, "generation": 0, "body_messages": 3}


def usage(prompt: int, status: int = 200) -> Any:
    return {"type": "usage", "ts": 0, "prompt_tokens": prompt, "status": status}


def start(owner: str, trigger: str = "pressure") -> Any:
    return {
        "type": "compaction/start",
        "ts": 1,
        "owner": owner,
        "trigger": trigger,
        "kind": "summary",
    }


def end(owner: str, outcome: str = "committed") -> Any:
    return {"type": "compaction/end", "ts": 2, "owner": owner, "outcome": outcome}


def test_one_point_per_request_with_its_usage_when_reported() -> None:
    events = [
        {"type": "message", "ts": 0},
        request(1, 100),
        usage(104),
        request(2, 180, sent=900, status="compacted"),
        request(3, 200),
        usage(210, 200),
    ]
    points = request_points(events)
    assert [p["index"] for p in points] == [0, 1, 2]
    assert [p["sent_tokens"] for p in points] == [100, 900, 200]  # old events: sent = forwarded
    assert [p["prompt_tokens"] for p in points] == [104, None, 210]
    assert points[1]["status"] == "compacted"


def test_a_point_shows_what_the_providers_cache_read_and_wrote_when_it_said() -> None:
    answered = {"prompt_tokens": 3_000, "completion_tokens": 5, "total_tokens": 3_005}
    events = [
        request(1, 3_000),
        usage_event(now=1, usage=answered, status=200, cache_read=2_048, cache_written=900),
        request(2, 3_100),
        usage_event(now=2, usage=answered, status=200),  # the cache did nothing (or says not)
        request(3, 3_200),  # never answered
    ]
    assert "cache_read_tokens" not in events[3]  # nothing stored for nothing done
    points = request_points(events)
    assert [(p["cache_read_tokens"], p["cache_written_tokens"]) for p in points] == [
        (2_048, 900),
        (0, 0),
        (None, None),
    ]


def test_compactions_pair_by_owner_and_an_unended_one_is_unfinished() -> None:
    events = [
        request(1, 10),
        start("a"),
        start("b", trigger="precompact"),
        end("b", outcome="no_range"),
        request(2, 10),
        end("a"),
        start("c"),
    ]
    found = compactions(events)
    assert [(c["trigger"], c["outcome"], c["before_request"]) for c in found] == [
        ("pressure", "committed", 1),
        ("precompact", "no_range", 1),
        ("pressure", "unfinished", 2),
    ]


def test_an_overflow_is_placed_on_the_request_it_answered() -> None:
    events = [
        request(1, 10),
        request(2, 20),
        {"type": "overflow", "ts": 3, "limit": 16000, "retried": True},
        request(3, 12, status="recovered"),
        usage(12),
    ]
    assert overflows(events) == [{"ts": 3, "limit": 16000, "retried": True, "request": 1}]
    whole = timeline(events)
    assert [p["status"] for p in whole["requests"]] == ["none", "none", "recovered"]


def test_junk_in_the_log_is_read_as_missing_values() -> None:
    events = [{"type": "request", "estimated_tokens": "many", "generation": True}, {"type": 7}]
    (point,) = request_points(events)
    assert point["forwarded_tokens"] is None and point["generation"] is None
