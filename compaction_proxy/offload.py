"""What runs off the event loop, and from what size.

One event loop serves every client. Work that grows with a request's size (parsing, hashing,
tokenizing, pricing and logging tens of thousands of messages) runs in a worker thread once the
request passes either bound below, so one client's huge request does not stall the others.
In a thread, Python code yields the interpreter every few milliseconds and tokenizers release
it; what still holds it is each single C call (orjson's parse of a whole body, for one).
Below the bounds the work is cheaper than a thread hop and runs inline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

OFFLOAD_BYTES = 1024 * 1024
OFFLOAD_MESSAGES = 2_000


def is_big(size: int = 0, messages: int = 0) -> bool:
    return size > OFFLOAD_BYTES or messages > OFFLOAD_MESSAGES


async def off_loop_if(big: bool, work: Callable[[], T]) -> T:
    """``work()`` in a worker thread when ``big``, inline otherwise."""
    if big:
        return await asyncio.to_thread(work)
    return work()
