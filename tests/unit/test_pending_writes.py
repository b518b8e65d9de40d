"""Writes made after an answer: in order per conversation, and waited for by whoever reads."""

from __future__ import annotations

import asyncio

from compaction_proxy.service.pending_writes import PendingLogWrites


async def write(log: list[str], name: str, delay: float, gate: asyncio.Event | None = None) -> None:
    if gate is not None:
        await gate.wait()
    await asyncio.sleep(delay)
    log.append(name)


async def test_one_conversations_writes_run_in_the_order_they_were_spawned() -> None:
    pending, log = PendingLogWrites(), []
    pending.spawn("a", write(log, "a1", 0.05))
    pending.spawn("a", write(log, "a2", 0.0))
    pending.spawn("b", write(log, "b1", 0.0))
    await pending.drain()
    assert log.index("a1") < log.index("a2")
    assert log[0] == "b1"  # other conversations do not wait
    assert len(pending) == 0


async def test_settled_waits_for_every_write_of_the_conversation_so_far() -> None:
    pending, log, gate = PendingLogWrites(), [], asyncio.Event()
    pending.spawn("a", write(log, "a1", 0.0, gate))
    pending.spawn("b", write(log, "b1", 0.0, gate))
    waiting = asyncio.create_task(pending.settled("a"))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    gate.set()
    await waiting
    assert "a1" in log
    await pending.settled("nobody")  # nothing pending: returns at once
    await pending.settled_all()
    assert sorted(log) == ["a1", "b1"]


async def test_a_failed_write_does_not_block_the_next_one() -> None:
    pending, log = PendingLogWrites(), []

    async def failing() -> None:
        raise RuntimeError("store gone")

    pending.spawn("a", failing())
    pending.spawn("a", write(log, "a2", 0.0))
    await pending.drain()
    assert log == ["a2"]


async def test_draining_at_shutdown_gives_up_on_a_write_that_never_ends() -> None:
    """A process told to stop must stop: a stuck write is left after the timeout."""
    pending, log, never = PendingLogWrites(), [], asyncio.Event()
    pending.spawn("a", write(log, "quick", 0.0))
    pending.spawn("b", write(log, "stuck", 0.0, never))
    started = asyncio.get_running_loop().time()
    await asyncio.wait_for(pending.drain(within=0.2), 5)
    assert 0.2 <= asyncio.get_running_loop().time() - started < 2
    assert log == ["quick"] and len(pending) == 1
    never.set()
    await pending.drain()
    assert log == ["quick", "stuck"]
