"""The admin API against a caller that guesses tokens, and answers that must not be cached or
sniffed; a summarizer that answers garbage to a manual compaction, or rate-limits it; positions
that are not numbers."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import orjson
import pytest

from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.conftest import ProxyFactory, RunningProxy
from tests.helpers import (
    ADMIN_AUTH,
    ADMIN_TOKEN,
    admin,
    admin_history,
    admin_routes,
    conversation_of,
    counter,
)

FAILURES = "compaction_proxy_admin_auth_failures_total"


async def get(
    proxy: RunningProxy, path: str, headers: dict[str, str], source: str = "127.0.0.1"
) -> aiohttp.ClientResponse:
    connector = aiohttp.TCPConnector(local_addr=(source, 0))
    async with aiohttp.ClientSession(connector=connector) as http:
        async with http.get(f"{proxy.root}/admin{path}", headers=headers) as response:
            await response.read()
            return response


async def test_failed_admin_tokens_are_counted_said_once_a_minute_then_throttled_per_address(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    before = counter(FAILURES)
    statuses = []
    for n in range(40):
        response = await get(proxy, "/conversations", {"Authorization": f"Bearer guess-{n}"})
        statuses.append(response.status)
    assert counter(FAILURES) == before + 40
    lines = [r for r in caplog.records if "admin token" in r.getMessage()]
    assert len(lines) == 1
    assert statuses[:20] == [401] * 20
    assert set(statuses[20:]) == {429}
    throttled = await get(proxy, "/conversations", {"Authorization": "Bearer guess-41"})
    assert throttled.status == 429 and 1 <= int(throttled.headers["Retry-After"]) <= 60
    # Another address is served as before.
    assert (await get(proxy, "/conversations", ADMIN_AUTH, source="127.0.0.2")).status == 200


async def test_the_right_admin_token_works_from_an_address_others_throttled(
    proxy: RunningProxy,
) -> None:
    """Behind a NAT or a load balancer, anyone can spend an address's failures: the operator's
    token still works there, and wrong tokens stay refused and counted."""
    for n in range(25):
        await get(proxy, "/conversations", {"Authorization": f"Bearer guess-{n}"})
    before = counter(FAILURES)
    assert (await get(proxy, "/conversations", ADMIN_AUTH)).status == 200
    assert (await get(proxy, "/conversations", {"Authorization": "Bearer no"})).status == 429
    assert counter(FAILURES) == before + 1


@pytest.mark.parametrize("path", ["/conversations", "/conversations/nosuchconversation"])
async def test_admin_json_is_never_cached_or_sniffed(proxy: RunningProxy, path: str) -> None:
    for headers in (ADMIN_AUTH, {"Authorization": "Bearer wrong"}):
        response = await get(proxy, path, headers)
        assert response.headers["Cache-Control"] == "no-store"
        assert response.headers["X-Content-Type-Options"] == "nosniff"


@pytest.mark.parametrize(
    "answer",
    [b'{"choices": "not a list"}', b"[1, 2]", b'{"choices": [{"message": 3}]}', b"not json"],
)
async def test_a_malformed_summary_answer_to_a_manual_compaction_is_a_502_naming_it(
    proxy: RunningProxy, fake: FakeUpstream, answer: bytes
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    fake.fail_next(200, answer)
    status, result = await admin(proxy, "POST", f"/conversations/{conversation}/compact")
    assert status == 502, result
    assert result["outcome"] == "summary_failed"
    assert "answer" in result["reason"]


@pytest.mark.parametrize(
    ("headers", "retry_after"), [({"Retry-After": "30"}, "30"), ({}, None)], ids=["30 s", "none"]
)
async def test_a_rate_limited_summary_call_to_a_manual_compaction_is_a_429_with_its_wait(
    proxy: RunningProxy, fake: FakeUpstream, headers: dict[str, str], retry_after: str | None
) -> None:
    """The upstream's 429 to the summary call is a rate limit, not a broken summarizer:
    429 with the wait it stated (none when it stated none), the outcome and reason as ever."""
    conversation = await conversation_of(proxy, admin_history())
    error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit_exceeded"}
    fake.fail_next(429, orjson.dumps({"error": error}), headers=headers)
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{proxy.root}/admin/conversations/{conversation}/compact", headers=ADMIN_AUTH
        ) as response:
            result = await response.json()
            assert response.status == 429, result
            assert response.headers.get("Retry-After") == retry_after
    assert result["outcome"] == "summary_failed"
    assert "Rate limit reached" in result["reason"]


async def test_a_manual_compaction_at_the_summary_ceiling_says_when_to_try_again(
    make_proxy: ProxyFactory, upstream_url: str
) -> None:
    """One summary call a minute for the route: the second conversation's compaction is
    refused at the ceiling, with the minute the ceilings count as its wait."""
    proxy = await make_proxy(
        admin_token=ADMIN_TOKEN,
        routes=admin_routes(upstream_url),
        summaries_per_minute_per_route=1,
    )
    first, second = [await conversation_of(proxy, admin_history()) for _ in range(2)]
    assert (await admin(proxy, "POST", f"/conversations/{first}/compact"))[0] == 200
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{proxy.root}/admin/conversations/{second}/compact", headers=ADMIN_AUTH
        ) as response:
            assert response.status == 429
            assert response.headers["Retry-After"] == "60"
            assert (await response.json())["outcome"] == "ceiling"


@pytest.mark.parametrize("region", [{"start": True, "end": 3}, {"start": 0, "end": False}])
async def test_region_positions_must_be_numbers_not_booleans(
    proxy: RunningProxy, region: dict[str, Any]
) -> None:
    conversation = await conversation_of(proxy, admin_history())
    status, result = await admin(
        proxy, "POST", f"/conversations/{conversation}/compact-region", json=region
    )
    assert status == 400
    assert "must be" in result["reason"]
