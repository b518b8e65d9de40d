"""A client's share of the upstream pool: its requests past it wait for its own, not others'."""

from __future__ import annotations

import asyncio

from compaction_proxy.security.upstream_shares import UpstreamShares, client_named

A, B = client_named("sk-a", None), client_named("", "10.0.0.2")


async def test_past_its_share_a_client_waits_for_its_own_request_and_no_other_does() -> None:
    shares = UpstreamShares(2)
    assert shares.took(A) and shares.took(A) and not shares.took(A)
    third = asyncio.create_task(shares.turn(A))
    assert shares.took(B)  # another client goes at once
    shares.give_back(B)
    await asyncio.sleep(0)
    assert not third.done()
    shares.give_back(A)  # one of A's ends: its place goes to the third
    await asyncio.wait_for(third, 1)
    shares.give_back(A)
    shares.give_back(A)
    assert shares.clients == 0  # nothing is kept for a client with nothing upstream


async def test_requests_waiting_past_the_share_go_in_turn() -> None:
    shares = UpstreamShares(1)
    shares.took(A)
    order: list[int] = []

    async def wait(n: int) -> None:
        await shares.turn(A)
        order.append(n)

    waiting = [asyncio.create_task(wait(n)) for n in range(3)]
    await asyncio.sleep(0)
    for _ in range(3):
        shares.give_back(A)
        await asyncio.sleep(0)
    await asyncio.gather(*waiting)
    assert order == [0, 1, 2]
    shares.give_back(A)
    assert shares.clients == 0


async def test_a_request_that_stops_waiting_takes_no_place_and_passes_on_one_handed_to_it() -> None:
    shares = UpstreamShares(1)
    shares.took(A)
    left = asyncio.create_task(shares.turn(A))
    await asyncio.sleep(0)
    left.cancel()
    await asyncio.gather(left, return_exceptions=True)
    shares.give_back(A)
    assert shares.clients == 0
    # Handed the place in the same step as it was cancelled: the place goes back.
    shares.took(A)
    handed = asyncio.create_task(shares.turn(A))
    await asyncio.sleep(0)
    shares.give_back(A)
    handed.cancel()
    await asyncio.gather(handed, return_exceptions=True)
    assert shares.clients == 0
