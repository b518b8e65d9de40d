"""The Redis log's packing and reading: the shell around ``store.log_segments``.

``RedisStore`` hands every batch its scripts logged to ``LogPacker.logged``. The packer keeps
what this process logged, per conversation, in a memory bounded in bytes (the least recently
used conversation is forgotten first). Once a run of it starting at the stream's oldest entry
is due, it is compressed here and landed by ``pack.lua``, in a background task after the
append that made it due: nothing is read back. A stream whose unpacked bytes pass
``READ_PACK_AT_BYTES`` with no run here (another replica logged part of it, or this process
restarted) is claimed by the append script for one caller, which reads it back and packs it.

A pack that fails (the store went away, or another replica packed first) changes nothing: the
events stay in the stream, readable, and a later pack takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from redis.commands.core import AsyncScript

from compaction_proxy.metrics import LOG_PACKS
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.base import LogPage, StoreUnavailable
from compaction_proxy.store.log_segments import (
    Entry,
    LoggedBatch,
    PackPlan,
    Segment,
    SegmentLimits,
    batches_from,
    decompress,
    entries_of,
    linked_run,
    pack_chunk,
    pack_due,
    page_after,
    plan_pack,
)
from compaction_proxy.store.packed_events import event_json

log = logging.getLogger(__name__)

HELD_BYTES = 64 * 1024 * 1024  # bytes of logged events this process keeps to pack them
READ_PACK_PAGE = 512  # stream entries read back at a time
PACK_TIMEOUT_SECONDS = 10.0  # a read-back pack's claim lasts as long (append.lua)


def as_bytes(value: str | bytes) -> bytes:
    """A reply as the bytes stored (replies decode as UTF-8 with ``surrogateescape``)."""
    return value if isinstance(value, bytes) else value.encode("utf-8", "surrogateescape")


@dataclass
class _Held:
    """What this process logged to one conversation's stream, and the newest segment it
    wrote there (with its frame, to merge the next run into it)."""

    batches: list[LoggedBatch] = field(default_factory=list)
    size: int = 0
    newest: tuple[Segment, bytes] | None = None
    packing: bool = False

    def keep(self, batches: list[LoggedBatch]) -> None:
        self.batches = batches
        self.size = sum(len(line) for batch in batches for _, line in batch.entries)


Bounded = Callable[[str], Any]  # RedisStore._bounded: an operation's time bound


class LogPacker:
    def __init__(
        self,
        client: Any,
        pack: AsyncScript,
        read: AsyncScript,
        keys: Callable[..., list[str]],
        bounded: Bounded,
        limits: SegmentLimits,
        ttl_ms: int,
    ) -> None:
        self._client = client
        self._pack_script = pack
        self._read_script = read
        self._keys = keys
        self._bounded = bounded
        self._limits = limits
        self._ttl_ms = ttl_ms
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._held_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()

    def logged(
        self,
        conversation: str,
        batch: LoggedBatch | None,
        oldest: str | None = None,
        claimed: bool = False,
    ) -> None:
        """Note ``batch`` (what one script logged); with ``oldest`` (the stream's oldest entry
        after an append), start the pack it made due, if any."""
        held = self._held.pop(conversation, None) or _Held()
        self._held[conversation] = held  # the most recently used, last
        batches = [*held.batches, batch] if batch is not None else held.batches
        if oldest is not None:
            batches = batches_from(batches, oldest)
        self._held_bytes -= held.size
        held.keep(batches)
        self._held_bytes += held.size
        self._forget_beyond_bound()
        if oldest is None or held.packing:
            return
        run = linked_run(held.batches, oldest)
        if run and pack_due(run, self._limits):
            self._start(conversation, self._pack_held(conversation, held, run, claimed))
        elif claimed:
            self._start(conversation, self._read_back_and_pack(conversation, held))

    def _forget_beyond_bound(self) -> None:
        while self._held_bytes > HELD_BYTES and len(self._held) > 1:
            _, oldest = self._held.popitem(last=False)
            self._held_bytes -= oldest.size

    def _start(self, conversation: str, work: Any) -> None:
        held = self._held.get(conversation)
        if held is not None:
            held.packing = True
        task = asyncio.get_running_loop().create_task(self._guarded(conversation, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _guarded(self, conversation: str, work: Any) -> None:
        try:
            await work
        except StoreUnavailable as exc:  # the events stay in the stream; a later pack takes them
            log.warning("packing conversation %s's log: %s", conversation, exc)
        finally:
            held = self._held.get(conversation)
            if held is not None:
                held.packing = False

    async def _pack_held(
        self, conversation: str, held: _Held, run: Sequence[Entry], claimed: bool
    ) -> None:
        while run and pack_due(run, self._limits):
            chunk = pack_chunk(run, self._limits)
            landed = await self._land(conversation, held, chunk, claimed, "held")
            if not landed:  # another replica's entries come first: read back at the bound
                held.newest = None
                return
            claimed = False
            run = run[len(chunk) :]

    async def _land(
        self, conversation: str, held: _Held, chunk: Sequence[Entry], claimed: bool, source: str
    ) -> bool:
        """Pack ``chunk``, merged into this process's newest segment when it fits; whether
        it landed."""
        newest, frame = held.newest if held.newest is not None else (None, b"")
        lines = decompress(frame) if newest is not None else b""
        plan = plan_pack(chunk, self._limits, newest, lines)
        try:
            reply = await self._send(conversation, plan, claimed)
            if reply == -1:  # the newest segment is another's now: land the chunk alone
                plan = plan_pack(chunk, self._limits)
                reply = await self._send(conversation, plan, claimed)
        except StoreUnavailable:
            LOG_PACKS.labels(source=source, outcome="failed").inc()
            raise
        LOG_PACKS.labels(source=source, outcome="landed" if reply == 1 else "refused").inc()
        if reply != 1:
            return False
        held.newest = (plan.segment, plan.frame)
        last = chunk[-1][0]
        self._held_bytes -= held.size
        held.keep(batches_from(held.batches, _after(last)))
        self._held_bytes += held.size
        return True

    async def _send(self, conversation: str, plan: PackPlan, claimed: bool) -> int:
        keys = self._keys(conversation, "log", "state", "packed", "segments", "packing")
        args: list[str | int | bytes] = [
            self._ttl_ms,
            plan.chunk[0][0],
            plan.chunk[-1][0],
            len(plan.chunk),
            plan.frame,
            plan.segment.index_line(),
            plan.merged.index_line() if plan.merged is not None else "",
            int(claimed),
        ]
        async with self._bounded("pack_log"):
            reply = await self._pack_script(keys=keys, args=args)
        return int(reply[0])

    async def _read_back_and_pack(self, conversation: str, held: _Held) -> None:
        """Pack the stream's unpacked entries, read back a page at a time (this caller holds
        the claim ``append.lua`` gave it)."""
        claimed = True
        try:
            while True:
                (log_key,) = self._keys(conversation, "log")
                async with self._bounded("pack_log"):
                    raw = await self._client.xrange(log_key, count=READ_PACK_PAGE)
                entries = cast(list[tuple[str, dict[str, str]]], raw)
                run = [(entry_id, event_json(fields)) for entry_id, fields in entries]
                whole_page = len(run) == READ_PACK_PAGE
                if not run or not (whole_page or pack_due(run, self._limits)):
                    return
                while run and (whole_page or pack_due(run, self._limits)):
                    chunk = pack_chunk(run, self._limits)
                    if not await self._land(conversation, held, chunk, claimed, "read_back"):
                        return
                    claimed = False
                    run = run[len(chunk) :]
        finally:
            if claimed:
                (claim,) = self._keys(conversation, "packing")
                with contextlib.suppress(StoreUnavailable):
                    async with self._bounded("pack_log"):
                        await self._client.delete(claim)

    async def read(self, conversation: str, after: str | None, limit: int) -> LogPage:
        keys = self._keys(conversation, "log", "packed", "segments")
        async with self._bounded("read_log"):
            frames, stream = await self._read_script(keys=keys, args=[after or "", limit + 1])
        packed: list[Entry] = []
        for frame in frames:
            packed += entries_of(decompress(as_bytes(frame)))
        unpacked = [(entry_id, event_json(fields)) for entry_id, fields in _fields(stream)]
        page, more = page_after(packed, unpacked, after, limit)
        events = [(entry_id, jsonio.loads(line)) for entry_id, line in page]
        return LogPage(events, events[-1][0] if events and more else None)

    async def settled(self) -> None:
        """Wait for every pack under way, and those they start."""
        while self._tasks:
            await asyncio.wait(list(self._tasks))

    async def drain(self, seconds: float) -> None:
        """Wait (at most ``seconds``) for the packs under way; cancel those still running."""
        tasks = list(self._tasks)
        if not tasks:
            return
        _, pending = await asyncio.wait(tasks, timeout=seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)


def _after(entry_id: str) -> str:
    """The smallest stream id after ``entry_id``."""
    ms, _, seq = entry_id.partition("-")
    return f"{ms}-{int(seq or 0) + 1}"


def _fields(stream: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries as a script returns them (field/value lists) as XRANGE gives them."""
    entries = []
    for entry_id, flat in stream:
        entries.append((entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return entries
