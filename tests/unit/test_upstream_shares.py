"""A client's share of the upstream pool: its requests past it wait for its own, not others'."""

from __future__ import annotations

import asyncio

from compaction_proxy.security.upstream_shares import UpstreamShares


async def test_past_its_share_a_client_waits_for_its_own_request_and_no_other_does() -> None:
    shares = UpstreamShares(2)
    first, second = shares.held("a"), shares.held("a")
    await first.__aenter__()
    await second.__aenter__()
    assert shares.would_wait("a") and not shares.would_wait("b")
    third = asyncio.create_task(_hold_once(shares, "a"))
    async with shares.held("b"):  # another client goes at once
        pass
    await asyncio.sleep(0)
    assert not third.done()
    await first.__aexit__(None, None, None)
    await asyncio.wait_for(third, 1)
    await second.__aexit__(None, None, None)
    assert shares.clients == 0  # nothing is kept for a client with nothing upstream


async def test_a_waiting_request_whose_client_left_gives_up_its_turn() -> None:
    shares = UpstreamShares(1)
    async with shares.held("a"):
        waiting = asyncio.create_task(_hold_once(shares, "a"))
        await asyncio.sleep(0)
        waiting.cancel()
        await asyncio.gather(waiting, return_exceptions=True)
    assert shares.clients == 0


async def _hold_once(shares: UpstreamShares, client: str) -> None:
    async with shares.held(client):
        pass
