"""The admin API: auth, inspection, manual and region compaction."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from compaction_proxy.http.app_keys import SERVICES
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import assistant, system, user
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import (
    ADMIN_AUTH,
    ADMIN_MODEL,
    ADMIN_TOKEN,
    admin,
    admin_history,
    admin_routes,
    conversation_of,
)


@pytest.mark.parametrize("configured", [None, "", "   "])
async def test_admin_is_off_without_a_token(
    make_proxy: ProxyFactory, configured: str | None
) -> None:
    """An empty token (a compose file's ``${VAR:-}``) is no token: ``Bearer`` with nothing
    after it gets nothing."""
    proxy = await make_proxy(**({} if configured is None else {"admin_token": configured}))
    for headers in ({}, {"Authorization": "Bearer"}, {"Authorization": "Bearer "}):
        status, _ = await admin(proxy, "GET", "/conversations", headers=headers)
        assert status == 404


@pytest.mark.parametrize(
    "headers", [{}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {ADMIN_TOKEN}"}]
)
async def test_admin_needs_the_bearer_token(proxy: RunningProxy, headers: dict[str, str]) -> None:
    status, body = await admin(proxy, "GET", "/conversations", headers=headers)
    assert status == 401
    assert body == {"reason": "admin token required"}


async def test_inspection_lists_shows_logs_and_derives_the_surface(
    make_proxy: ProxyFactory, upstream_url: str, store_url: str
) -> None:
    proxy = await make_proxy(
        admin_token=ADMIN_TOKEN, store_url=store_url, routes=admin_routes(upstream_url)
    )
    messages = admin_history()
    conversation = await conversation_of(proxy, messages)
    await conversation_of(proxy, [*messages, user("and then?")])

    status, listing = await admin(proxy, "GET", "/conversations?limit=500")
    assert status == 200
    entry = next(c for c in listing["conversations"] if c["conversation"] == conversation)
    assert entry["tenant"] and entry["model"] == ADMIN_MODEL and entry["generation"] == 0
    assert entry["last_pressure"] is not None and 0 < entry["last_pressure"] < 1

    status, shown = await admin(proxy, "GET", f"/conversations/{conversation}")
    assert status == 200
    assert shown["generation"] == 0 and shown["records"] == [] and shown["lease_owner"] is None
    assert shown["anchor"]["prompt_tokens"] > 0

    events: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = f"?limit=7&after={cursor}" if cursor else "?limit=7"
        status, page = await admin(proxy, "GET", f"/conversations/{conversation}/log{query}")
        assert status == 200
        events += page["events"]
        cursor = page["next"]
        if cursor is None:
            break
    kinds = [e["type"] for e in events]
    assert kinds.count("message") == len(messages)  # the body, then one more user message
    assert kinds.count("request") == 2 and kinds.count("usage") == 2 and "context" in kinds

    status, surface = await admin(proxy, "GET", f"/conversations/{conversation}/surface")
    assert status == 200
    assert surface["messages"] == [*messages, user("and then?")]
    assert [(n["kind"], n["start"], n["end"]) for n in surface["nodes"][:2]] == [
        ("head", None, None),
        ("body", 0, 0),
    ]
    assert all(n["tokens"] > 0 for n in surface["nodes"])


async def test_unknown_conversation_is_404(proxy: RunningProxy) -> None:
    assert (await admin(proxy, "GET", "/conversations/cdeadbeef"))[0] == 404
    assert (await admin(proxy, "GET", "/conversations/cdeadbeef/surface"))[0] == 404
    assert (await admin(proxy, "GET", "/conversations/NOT{valid}"))[0] == 404


async def test_manual_compaction_commits_and_later_requests_use_it(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    messages = admin_history()
    conversation = await conversation_of(proxy, messages)
    status, result = await admin(proxy, "POST", f"/conversations/{conversation}/compact")
    assert status == 200
    assert result["outcome"] == "committed"
    assert result["tokens_shadowed"] > 0 and result["generation"] > 0
    # Everything but the live turn (the last tool result and the user's message) and the
    # assistant call it answers.
    assert result["span"] == {"start": 0, "end": len(messages) - 5}
    await conversation_of(proxy, [*messages, user("continue")])
    forwarded = fake.chat_requests[-1].body
    assert forwarded is not None
    assert forwarded["messages"][0] == system()
    assert "<compacted-summary>" in forwarded["messages"][1]["content"]
    assert "FACT-3" in forwarded["messages"][1]["content"]
    status, surface = await admin(proxy, "GET", f"/conversations/{conversation}/surface")
    checkpoint = surface["nodes"][1]
    assert (checkpoint["kind"], checkpoint["start"]) == ("checkpoint", 0)
    assert checkpoint["end"] == len(messages) - 5


async def test_a_manual_compaction_sends_the_operators_query_with_its_summary_call(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    """An upstream that needs ``api-version`` (Azure) gets it from ``X-Upstream-Query``: the
    admin request has no client query to pass on."""
    conversation = await conversation_of(proxy, admin_history())
    headers = {**ADMIN_AUTH, "X-Upstream-Query": "?api-version=2024-10-21"}
    status, result = await admin(
        proxy, "POST", f"/conversations/{conversation}/compact", headers=headers
    )
    assert status == 200 and result["outcome"] == "committed"
    assert fake.summary_requests[-1].query == "api-version=2024-10-21"


async def test_a_manual_compaction_with_an_invalid_query_is_refused_before_any_summary(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    headers = {**ADMIN_AUTH, "X-Upstream-Query": "api-version=2024 10 21"}
    status, result = await admin(
        proxy, "POST", f"/conversations/{conversation}/compact", headers=headers
    )
    assert status == 400 and "X-Upstream-Query" in result["reason"]
    assert fake.summary_requests == []


async def test_manual_compaction_is_refused_while_a_request_is_in_flight(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    messages = admin_history()
    conversation = await conversation_of(proxy, messages)
    fake.response_delay = 1.0
    in_flight = asyncio.ensure_future(conversation_of(proxy, [*messages, user("slow one")]))
    while len(fake.chat_requests) < 2:
        await asyncio.sleep(0.02)
    status, result = await admin(proxy, "POST", f"/conversations/{conversation}/compact")
    assert (status, result["outcome"]) == (409, "busy")
    await in_flight


async def test_manual_compaction_needs_logged_content(make_proxy: ProxyFactory) -> None:
    proxy = await make_proxy(admin_token=ADMIN_TOKEN, log_content=False)
    conversation = await conversation_of(proxy, admin_history())
    status, result = await admin(proxy, "POST", f"/conversations/{conversation}/compact")
    assert status == 409
    assert "log_content" in result["reason"]


@pytest.mark.parametrize(
    ("region", "cause"),
    [
        ({"start": 2, "end": 5}, "would separate a tool result"),  # 2 is a tool result
        ({"start": 1, "end": 3}, "would separate a tool call from its result"),
        ({"start": 0, "end": 99}, "out of range"),
        ({"start": 4, "end": 2}, "out of range"),
        ({"start": 0, "end": 17}, "live turn"),
        ({"start": 0, "end": 16}, "live turn"),  # the last tool result: the live turn too
        ({"start": "a", "end": 2}, "must be"),
    ],
)
async def test_region_is_validated_naming_the_cause(
    proxy: RunningProxy, region: dict[str, Any], cause: str
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    status, result = await admin(
        proxy, "POST", f"/conversations/{conversation}/compact-region", json=region
    )
    assert status == 400
    assert cause in result["reason"]


async def test_region_compaction_merges_a_prior_checkpoint_inside_it(
    proxy: RunningProxy, fake: FakeUpstream
) -> None:
    messages = admin_history()  # body: user, 8 x (call, result), user  -> positions 0..17
    conversation = await conversation_of(proxy, messages)
    path = f"/conversations/{conversation}/compact-region"
    status, inner = await admin(proxy, "POST", path, json={"start": 3, "end": 6})
    assert (status, inner["outcome"]) == (200, "committed")
    status, outer = await admin(proxy, "POST", path, json={"start": 1, "end": 10})
    assert (status, outer["outcome"]) == (200, "committed")
    assert outer["generation"] > inner["generation"] > 0
    summary_call = fake.summary_requests[-1].body
    assert summary_call is not None
    assert any("<compacted-summary>" in str(m.get("content")) for m in summary_call["messages"])
    status, surface = await admin(proxy, "GET", f"/conversations/{conversation}/surface")
    kinds = [(n["kind"], n["start"], n["end"]) for n in surface["nodes"]]
    assert kinds[:4] == [
        ("head", None, None),
        ("body", 0, 0),
        ("checkpoint", 1, 10),
        ("body", 11, 11),
    ]
    # Splitting the merged checkpoint is refused.
    status, result = await admin(proxy, "POST", path, json={"start": 5, "end": 12})
    assert status == 400 and "inside an existing checkpoint" in result["reason"]


async def test_the_timeline_shows_what_the_providers_cache_read_of_each_prompt(
    proxy: RunningProxy,
) -> None:
    """The fake caches prompts as OpenAI does: the second request of a conversation reads
    the first one's prompt from the cache, and its point says how much."""
    messages = admin_history()
    conversation = await conversation_of(proxy, messages)
    await conversation_of(proxy, [*messages, assistant("Looking."), user("continue")])
    await proxy.app[SERVICES].pending_log_writes.settled_all()
    status, timeline = await admin(proxy, "GET", f"/conversations/{conversation}/timeline")
    assert status == 200
    first, second = timeline["requests"]
    assert first["cache_read_tokens"] == 0
    assert 0 < second["cache_read_tokens"] <= first["prompt_tokens"] < second["prompt_tokens"]
    assert second["cache_written_tokens"] == 0  # OpenAI reports no writes before GPT-5.6


async def test_the_timeline_has_a_point_per_request_and_the_compaction_between(
    proxy: RunningProxy,
) -> None:
    messages = admin_history()
    conversation = await conversation_of(proxy, messages)
    status, result = await admin(proxy, "POST", f"/conversations/{conversation}/compact")
    assert (status, result["outcome"]) == (200, "committed")
    await conversation_of(proxy, [*messages, user("continue")])
    status, timeline = await admin(proxy, "GET", f"/conversations/{conversation}/timeline")
    assert status == 200
    assert timeline["window"] == 64_000 and timeline["threshold"] == 51_200
    first, second = timeline["requests"]
    # Nothing was replaced yet: sent as forwarded, and the upstream's count came back.
    assert first["sent_tokens"] == first["forwarded_tokens"] and first["prompt_tokens"] > 0
    # The second request resent everything and was forwarded with the checkpoint.
    assert second["sent_tokens"] > second["forwarded_tokens"]
    assert second["generation"] == result["generation"] > first["generation"] == 0
    (compaction,) = timeline["compactions"]
    assert (compaction["trigger"], compaction["outcome"], compaction["before_request"]) == (
        "manual",
        "committed",
        1,
    )
    status, surface = await admin(proxy, "GET", f"/conversations/{conversation}/surface")
    checkpoint = surface["nodes"][1]
    assert (
        checkpoint["kind"] == "checkpoint" and checkpoint["shadowed_tokens"] > checkpoint["tokens"]
    )
    # Tool calls and results are paired by node index, as compaction pairs them.
    roles = [m["role"] for m in surface["messages"]]
    assert surface["tool_pairs"] and all(
        (roles[call], roles[result]) == ("assistant", "tool")
        for call, result in surface["tool_pairs"]
    )


async def test_conversations_are_searched_by_session_name_and_paged(proxy: RunningProxy) -> None:
    marker = uuid.uuid4().hex[:8]
    for index in range(3):
        await conversation_of(proxy, [user(f"hello {index}")], session=f"search-{marker}-{index}")
    await conversation_of(proxy, [user("unrelated")], session=f"other-{marker}")
    status, found = await admin(proxy, "GET", f"/conversations?q=SEARCH-{marker}&limit=2")
    assert status == 200
    assert [c["session"] for c in found["conversations"]] == [
        f"search-{marker}-2",
        f"search-{marker}-1",
    ]
    assert found["next_offset"] == 2
    status, rest = await admin(proxy, "GET", f"/conversations?q=search-{marker}&limit=2&offset=2")
    assert [c["session"] for c in rest["conversations"]] == [f"search-{marker}-0"]
    assert rest["next_offset"] is None
    status, by_id = await admin(
        proxy, "GET", f"/conversations?q={found['conversations'][0]['conversation']}"
    )
    assert [c["session"] for c in by_id["conversations"]] == [f"search-{marker}-2"]
    for bad in ("offset=-1", "offset=x", "offset=²"):
        status, _ = await admin(proxy, "GET", f"/conversations?{bad}")
        assert status == 400
