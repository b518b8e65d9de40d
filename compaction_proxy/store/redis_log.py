"""The Redis log's packing and reading: the shell around ``store.log_segments``.

``RedisStore`` hands every batch its scripts logged to ``LogPacker.logged``. The packer keeps
what this process logged, per conversation, in a memory bounded in bytes (the least recently
used conversation is forgotten first). Once a run of it starting at the stream's oldest entry
is due, it is compressed here and landed in a background task after the append that made it
due: the frame by a plain ``SET`` and the pack by ``pack.lua``, in one round trip, and nothing
is read back. A stream whose unpacked bytes pass ``READ_PACK_AT_BYTES`` with no run here
(another replica logged part of it, or this process restarted) is claimed by the append
script for one caller, which reads it back and packs it.

A pack that fails (the store went away, or another replica packed first) changes nothing: the
events stay in the stream, readable, and a later pack takes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, cast

from redis.commands.core import AsyncScript

from compaction_proxy.metrics import LOG_PACKS
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.base import LogPage, StoreUnavailable
from compaction_proxy.store.log_segments import (
    DamagedSegment,
    Entry,
    LoggedBatch,
    PackPlan,
    Segment,
    SegmentLimits,
    batches_from,
    decompress,
    due,
    entries_of,
    lines_size,
    linked_run,
    pack_chunk,
    pack_due,
    page_after,
    plan_pack,
)
from compaction_proxy.store.packed_events import event_json
from compaction_proxy.store.redis_direct import DirectCommands
from compaction_proxy.store.redis_forms import as_argument, unreadable_field
from compaction_proxy.store.redis_keys import keys_of, segment_key_prefix

log = logging.getLogger(__name__)

HELD_BYTES = 64 * 1024 * 1024  # bytes of logged events and newest frames kept to pack them
READ_PACK_PAGE = 512  # stream entries read back at a time
OFF_LOOP_LINES = 64 * 1024  # a pack into a segment of more lines runs in a worker thread
_FIRST = attrgetter("first")  # a batch's first ordinal (the batches held, in C on every append)


@dataclass
class _Held:
    """What this process logged to one conversation's stream, and the newest segment it
    wrote there (with its frames, to merge the next run into it)."""

    batches: list[LoggedBatch] = field(default_factory=list)
    size: int = 0  # bytes of the entries held
    count: int = 0  # entries held
    newest: tuple[Segment, bytes] | None = None
    packing: bool = False
    epoch: str = ""  # what the ordinals count in (``lua/log.lua``)
    packed_to: int = 0  # the ordinal this process's packs landed up to (those before it gone)
    remembered: bool = True  # counted in the packer's bound (false once forgotten)

    def add(self, batch: LoggedBatch) -> int:
        """Hold ``batch`` too; the bytes it adds."""
        self.batches.append(batch)
        size = lines_size(batch.entries)
        self.size += size
        self.count += len(batch.entries)
        return size

    @property
    def frame_bytes(self) -> int:
        """Bytes of the newest segment's frames held to merge into."""
        return len(self.newest[1]) if self.newest is not None else 0

    def keep(self, batches: list[LoggedBatch]) -> int:
        """Hold ``batches`` instead; the change in bytes held."""
        before = self.size
        self.batches = batches
        self.size = sum(len(line) for batch in batches for _, line in batch.entries)
        self.count = sum(len(batch.entries) for batch in batches)
        return self.size - before


Bounded = Callable[[str], Any]  # RedisStore._bounded: an operation's time bound


class LogPacker:
    def __init__(
        self,
        client: Any,
        direct: DirectCommands | None,
        scripts: tuple[AsyncScript, AsyncScript],
        bounded: Bounded,
        limits: SegmentLimits,
        ttl_ms: int,
    ) -> None:
        """``direct``: how one Redis's commands are sent (None on a Cluster); ``scripts``:
        ``pack.lua`` and ``read.lua``, registered."""
        self._client = client
        self._direct = direct
        self._pack_script, self._read_script = scripts
        self._bounded = bounded
        self._limits = limits
        self._ttl_ms = ttl_ms
        self._held: OrderedDict[str, _Held] = OrderedDict()
        self._held_bytes = 0
        self._tasks: set[asyncio.Task[None]] = set()

    @staticmethod
    def segment_ttl_ms(ttl_ms: int) -> int:
        """A segment's key outlives its log's by a quarter, as ``lua/log.lua`` renews it."""
        return ttl_ms + ttl_ms // 4

    def logged(
        self,
        conversation: str,
        epoch: str,
        batch: LoggedBatch | None,
        oldest: int | None = None,
        claimed: bool = False,
    ) -> None:
        """Note ``batch`` (what one script logged, its ordinals counted in ``epoch``); with
        ``oldest`` (the ordinal of the stream's oldest entry after an append), start the pack
        it made due, if any. What is held of another epoch (the store lost the log's state)
        is forgotten."""
        held = self._held.pop(conversation, None) or _Held()
        self._held[conversation] = held  # the most recently used, last
        if epoch != held.epoch:
            self._keep(held, [])
            self._hold_newest(held, None)
            held.epoch, held.packed_to = epoch, 0
        if oldest is not None and oldest < held.packed_to:
            # The script ran before a pack of this process's landed, its reply read after:
            # the entries that pack took are gone, whatever the reply says.
            oldest = held.packed_to
        if batch is not None:
            self._held_bytes += held.add(batch)
        if oldest is not None and held.batches and min(map(_FIRST, held.batches)) < oldest:
            self._keep(held, batches_from(held.batches, oldest))
        while self._held_bytes > HELD_BYTES and len(self._held) > 1:
            _, forgotten = self._held.popitem(last=False)
            self._held_bytes -= forgotten.size + forgotten.frame_bytes
            forgotten.remembered = False
        if oldest is None or held.packing:
            return
        if not (claimed or due(held.size, held.count, self._limits)):
            return  # no run of what is held can be due: spared the sort
        run = linked_run(held.batches, oldest)
        if run and pack_due(run, self._limits):
            self._start(held, self._pack_held(conversation, held, oldest, run, claimed))
        elif claimed and batch is not None and oldest + len(run) == batch.end:
            # What the stream holds unpacked is all held here, short of a pack: the claim
            # counted entries a pack of this process's has taken since. Nothing to read back.
            self._start(held, self._release_claim(conversation))
        elif claimed:
            self._start(held, self._read_back_and_pack(conversation, held))

    def _keep(self, held: _Held, batches: list[LoggedBatch]) -> None:
        """``held`` keeps ``batches`` instead; counted in the bound while it is remembered (a
        pack under way may outlive its conversation's place here)."""
        change = held.keep(batches)
        if held.remembered:
            self._held_bytes += change

    def _hold_newest(self, held: _Held, newest: tuple[Segment, bytes] | None) -> None:
        """``held`` merges into ``newest`` next; its frames count in the bound like the events
        held (every conversation that packed once keeps one)."""
        before = held.frame_bytes
        held.newest = newest
        if held.remembered:
            self._held_bytes += held.frame_bytes - before

    def _start(self, held: _Held, work: Coroutine[Any, Any, None]) -> None:
        held.packing = True
        task = asyncio.get_running_loop().create_task(self._guarded(held, work))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @staticmethod
    async def _guarded(held: _Held, work: Coroutine[Any, Any, None]) -> None:
        try:
            await work
        except StoreUnavailable as exc:  # the events stay in the stream; a later pack takes them
            log.warning("a log pack failed: %s", exc)
        except Exception:  # a pack is the log's housekeeping: it never fails a request
            log.exception("a log pack failed")
        finally:
            held.packing = False

    async def _pack_held(
        self, conversation: str, held: _Held, oldest: int, run: Sequence[Entry], claimed: bool
    ) -> None:
        while run and pack_due(run, self._limits):
            chunk = pack_chunk(run, self._limits)
            start = ("held", oldest)
            if not await self._land(conversation, held, start, chunk, claimed):
                # another's entries come first: forgotten, and read back at the bound
                self._keep(held, [])
                self._hold_newest(held, None)
                return
            claimed = False
            oldest += len(chunk)
            held.packed_to = oldest
            self._keep(held, batches_from(held.batches, oldest))
            run = run[len(chunk) :]

    async def _land(
        self,
        conversation: str,
        held: _Held,
        start: tuple[str, int | str],
        chunk: Sequence[Entry],
        claimed: bool,
        freed: int | None = None,
    ) -> bool:
        """Pack ``chunk`` (from ``start``: its first entry's ordinal, or its id when it was
        read back), merged into this process's newest segment when it fits; whether it
        landed. ``freed``: the bytes the chunk takes in the stream, when not its JSON's."""
        source = "held" if start[0] == "held" else "read_back"
        merging = held.newest[0].lines if held.newest is not None else 0
        lines = lines_size(chunk)
        if merging + lines > OFF_LOOP_LINES:
            plan = await asyncio.to_thread(self._plan, chunk, held.newest)
        else:
            plan = self._plan(chunk, held.newest)
        if freed is None:
            freed = lines
        try:
            reply = await self._send(conversation, plan, (*start, held.epoch), freed, claimed)
            if reply == -1:  # the newest segment is another's now: land the chunk alone
                plan = self._plan(chunk, None)
                reply = await self._send(conversation, plan, (*start, held.epoch), freed, claimed)
        except StoreUnavailable:
            LOG_PACKS.labels(source=source, outcome="failed").inc()
            raise
        LOG_PACKS.labels(source=source, outcome="landed" if reply == 1 else "refused").inc()
        if reply == 1:
            self._hold_newest(held, (plan.segment, plan.frame))
        return reply == 1

    def _plan(self, chunk: Sequence[Entry], newest: tuple[Segment, bytes] | None) -> PackPlan:
        """Compress ``chunk``, merged into ``newest`` (a segment and its frames) where it fits.
        Past ``OFF_LOOP_LINES`` (the newest segment's lines are read back and loaded as the new
        frame's prefix) it runs in a worker thread: zstd lets go of the interpreter, so the
        event loop serves the next request meanwhile."""
        token = uuid.uuid4().hex[:16]
        if newest is None:
            return plan_pack(chunk, self._limits, token)
        return plan_pack(chunk, self._limits, token, *newest)

    async def _send(
        self,
        conversation: str,
        plan: PackPlan,
        start: tuple[str, int | str, str],
        freed: int,
        claimed: bool,
    ) -> int:
        """The frame's ``SET`` and ``pack.lua``, in one round trip on one Redis. ``start``:
        how the run is checked (``held`` or ``read``), its first ordinal or id, the epoch."""
        prefix = segment_key_prefix(conversation)
        segment_key = prefix + plan.segment.token
        merged_key = prefix + plan.merged.token if plan.merged is not None else segment_key
        keys = keys_of(conversation, "log", "state", "segments", "packing")
        keys += [segment_key, merged_key]
        args: list[str | int | bytes] = [self._ttl_ms, start[0], start[1], len(plan.chunk)]
        args += [plan.chunk[-1][0], freed, plan.segment.index_line()]
        args += [plan.merged.index_line() if plan.merged is not None else "", int(claimed)]
        args.append(start[2])
        frame_ttl = self.segment_ttl_ms(self._ttl_ms)
        script = self._pack_script
        direct = self._direct
        async with self._bounded("pack_log"):
            if direct is None:  # a Cluster: no scripts in its pipelines
                await self._client.set(segment_key, plan.frame, px=frame_ttl)
                reply = await script(keys=keys, args=args)
            else:  # every argument bytes: framed in one C call (``redis_packing``)
                named = [as_argument(segment_key), plan.frame, b"PX", b"%d" % frame_ttl]
                words = [b"%d" % len(keys), *map(as_argument, keys), *map(as_argument, args)]

                def commands() -> tuple[tuple[Any, ...], ...]:
                    return ("SET", *named), ("EVALSHA", script.sha.encode(), *words)

                # After a NOSCRIPT the frame is set again: the same value.
                _, reply = await direct.run_with_script(script, commands)
        return int(reply[0])

    async def _read_back_and_pack(self, conversation: str, held: _Held) -> None:
        """Pack the stream's unpacked entries, read back a page at a time (this caller holds
        the claim ``append.lua`` gave it)."""
        claimed = True
        (log_key,) = keys_of(conversation, "log")
        try:
            while True:
                async with self._bounded("pack_log"):
                    raw = await self._client.xrange(log_key, count=READ_PACK_PAGE)
                entries = cast(list[tuple[str, dict[str, str]]], raw)
                run = [(entry_id, event_json(fields)) for entry_id, fields in entries]
                stored = [sum(map(len, map(as_argument, f.values()))) for _, f in entries]
                whole_page = len(run) == READ_PACK_PAGE
                while run and (whole_page or pack_due(run, self._limits)):
                    chunk = pack_chunk(run, self._limits)
                    freed = sum(stored[: len(chunk)])
                    start = ("read", chunk[0][0])
                    if not await self._land(conversation, held, start, chunk, claimed, freed):
                        return
                    claimed = False
                    run, stored = run[len(chunk) :], stored[len(chunk) :]
                if not whole_page:
                    return
        finally:
            if claimed:
                await self._release_claim(conversation)

    async def _release_claim(self, conversation: str) -> None:
        """Give back the ``packing`` claim ``append.lua`` gave this caller, unused (another
        caller would otherwise wait out its 10 s to read the stream back)."""
        (claim,) = keys_of(conversation, "packing")
        with contextlib.suppress(StoreUnavailable):
            async with self._bounded("pack_log"):
                await self._client.delete(claim)

    async def read(self, conversation: str, after: str | None, limit: int) -> LogPage:
        keys = keys_of(conversation, "log", "segments")
        args: list[str | int] = [after or "", limit + 1, segment_key_prefix(conversation)]
        async with self._bounded("read_log"):
            frames, stream = await self._read_script(keys=keys, args=args)
        packed: list[Entry] = []
        for number, frame in enumerate(frames):
            if not frame:  # a segment whose key expired reads as nothing
                continue
            try:
                packed += entries_of(decompress(as_argument(frame)))
            except DamagedSegment:  # its events read as absent, like an unreadable record
                unreadable_field("log_segment", f"{conversation} segment {number}")
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


def _fields(stream: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries as a script returns them (field/value lists) as XRANGE gives them."""
    entries = []
    for entry_id, flat in stream:
        entries.append((entry_id, dict(zip(flat[::2], flat[1::2], strict=True))))
    return entries
