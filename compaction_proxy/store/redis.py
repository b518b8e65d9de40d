"""Redis store (production; also Valkey and managed Redis) over redis-py asyncio.

Every multi-key step is one Lua script (registered with ``register_script``; redis-py reloads it
on NOSCRIPT) over keys that share the conversation's hash tag. Every write refreshes the TTL of
the conversation's keys. No lock is held across an LLM call: the lease is a key with an expiry.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from importlib.resources import files
from itertools import chain, compress, repeat
from types import TracebackType
from typing import Any, cast

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, RedisError

from compaction_proxy.conversation.log_events import Event, MessageEvent, body_tip
from compaction_proxy.conversation.replacements import (
    RECENT_CHECKPOINT_ENDS,
    ReplacementRecord,
    checkpoint_ends,
    record_to_dict,
)
from compaction_proxy.lru import LRU
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.offload import is_big, off_loop_if
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.attributes import ConversationAttributes
from compaction_proxy.store.base import (
    BeginResult,
    ConversationState,
    ConversationSummary,
    LogPage,
    StoreUnavailable,
)
from compaction_proxy.store.branches import lease_anchor
from compaction_proxy.store.log_bound import log_bytes_dropped
from compaction_proxy.store.log_segments import READ_PACK_AT_BYTES, LoggedBatch, SegmentLimits
from compaction_proxy.store.parsed_records import ParsedRecords
from compaction_proxy.store.redis_direct import DirectCommands
from compaction_proxy.store.redis_forms import (
    STATE_FIELDS,
    Arg,
    anchor_field,
    as_json,
    chain_args,
    consulted_positions,
    generation_field,
    message_arguments,
    packed_bounds,
    picked_chain_args,
    state_of,
)
from compaction_proxy.store.redis_keys import (
    KeyKind,
    conversation_keys,
    conversations_key,
    keys_of,
    owner_key,
    quota_key,
    secret_key,
    seen_key_prefix,
    segment_key_prefix,
)
from compaction_proxy.store.redis_log import LogPacker
from compaction_proxy.store.redis_packing import bytes_packing

# The keys each script takes, in its KEYS order (see its header).
_LOG_KEYS: tuple[KeyKind, ...] = ("log", "seen", "state", "records", "anchored", "positions")
_APPEND_KEYS: tuple[KeyKind, ...] = (*_LOG_KEYS, "used", "segments", "packing")
_LOAD_KEYS: tuple[KeyKind, ...] = ("state", "records", "anchored", "positions", "leases")
_COMPACTION_KEYS: tuple[KeyKind, ...] = ("leases", *_LOG_KEYS, "used", "segments")
# ``str.encode``'s arguments for ``map`` (infinite, so one pair serves every call): an
# attribute read from a header or a body is written back byte for byte.
_UTF8, _AS_READ = repeat("utf-8"), repeat("surrogateescape")
_LEASE_POLL_SECONDS = 0.05
# A load asks once with the positions it consulted last time, again with those its answer
# names (another replica anchored or leased there), and at last with the whole chain.
_LOAD_ASKS = 3
INDEX_INTERVAL_SECONDS = 60.0
INDEX_MEMORY = 100_000  # conversations whose last index write this process remembers


def _script(name: str) -> str:
    """A script, with the branch helpers every script may call before it, and the log's
    helpers before a script that writes or reads the log (each helper a script defines costs
    it time on every call)."""
    folder = files("compaction_proxy.store") / "lua"
    helpers = ("branches", "log") if name in _LOG_SCRIPTS else ("branches",)
    shared = [(folder / f"{helper}.lua").read_text(encoding="utf-8") for helper in helpers]
    return "".join(shared) + (folder / f"{name}.lua").read_text(encoding="utf-8")


_LOG_SCRIPTS = frozenset({"append", "begin", "commit", "end", "pack", "read"})


class _Bounded:
    """One store operation: it takes at most ``seconds`` in all, and a Redis error, an OS
    error or running out of time is raised as StoreUnavailable.

    The bound is the proxy's, not redis-py's ``socket_timeout``. With one, redis-py runs every
    command's send in ``asyncio.wait_for``, which on Python 3.11 makes a task per command (a
    ``load`` cost about a quarter more CPU), and its one retry after a read timed out doubled
    the wait on a Redis that stopped answering. A command cut off here is cancelled, and its
    connection dropped (by redis-py, or ``DirectCommands``): it is never used again half-read
    (tests/store/test_redis_timeouts.py). A plain class: it runs twice a request."""

    __slots__ = ("_operation", "_timeout")

    def __init__(self, operation: str, seconds: float) -> None:
        self._operation = operation
        self._timeout = asyncio.timeout(seconds)

    async def __aenter__(self) -> None:
        await self._timeout.__aenter__()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self._timeout.__aexit__(kind, error, traceback)
        except TimeoutError as exc:  # the bound ran out: the operation was cancelled
            raise StoreUnavailable(self._operation, "TimeoutError") from exc
        if isinstance(error, TimeoutError | RedisError | OSError):
            raise StoreUnavailable(self._operation, type(error).__name__) from error


class RedisStore:
    def __init__(
        self,
        url: str,
        *,
        ttl_seconds: float = 7 * 86400,
        max_log_events: int = 10_000,
        max_log_bytes: int = 16 * 1024 * 1024,
        compress_log: bool = True,
        pool_size: int = 50,
        operation_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        record_ttl_seconds: float | None = None,
    ) -> None:
        options: dict[str, Any] = {
            "decode_responses": True,
            # A log segment (and an event earlier versions compressed) is not UTF-8: it reads
            # back as a string that encodes to the bytes stored; other replies are UTF-8.
            "encoding_errors": "surrogateescape",
            # Bounded per operation instead (``_Bounded``); connecting stays redis-py's.
            "socket_timeout": None,
            "socket_connect_timeout": connect_timeout,
            # One quick retry: with Redis down a request must bypass fast, not back off.
            "retry": Retry(NoBackoff(), 1),
        }
        self._client: aioredis.Redis | RedisCluster
        self._direct: DirectCommands | None = None  # a Cluster routes each command by its keys
        if url.startswith("redis+cluster://"):
            self._client = RedisCluster.from_url(
                "redis://" + url.removeprefix("redis+cluster://"),
                max_connections=pool_size,
                **options,
            )
            # The nodes commands go to are made from these once it has read the cluster's
            # slots (at its first command): their connections frame a command of bytes in C.
            made_with = self._client.connection_kwargs
            made_with["connection_class"] = bytes_packing(made_with["connection_class"])
        else:
            self._client = aioredis.Redis.from_url(url, max_connections=pool_size, **options)
            pool = self._client.connection_pool
            pool.connection_class = bytes_packing(pool.connection_class)
            self._direct = DirectCommands(pool)
        self._operation_timeout = operation_timeout
        self._ttl_ms = int(ttl_seconds * 1000)
        # The records key (checkpoint summaries, kept in clear) may expire sooner than the rest;
        # every script takes it as its last argument (the append, last of its bounds).
        self._record_ttl_ms = min(self._ttl_ms, int((record_ttl_seconds or ttl_seconds) * 1000))
        self._pack_log = compress_log
        # The append script's fixed bounds, one argument: redis-py packs each argument alone.
        read_pack_at = READ_PACK_AT_BYTES if compress_log else 0  # 0: never read back
        segment_ttl = LogPacker.segment_ttl_ms(self._ttl_ms)
        bounds = (self._ttl_ms, max_log_events, read_pack_at, segment_ttl, max_log_bytes)
        self._append_bounds = packed_bounds(*bounds, self._record_ttl_ms)
        self._trimmed: LRU[str, bool] = LRU(4096)  # conversations whose log drop was said
        # The chain positions each conversation's last load consulted: the next picks them.
        self._consulted: LRU[str, tuple[int, ...]] = LRU(INDEX_MEMORY)
        # When each conversation was last written to the activity index, by this process.
        self._indexed: OrderedDict[str, float] = OrderedDict()
        self._parsed_records = ParsedRecords()
        register = self._client.register_script
        self._load = register(_script("load"))
        self._append_script = register(_script("append"))
        self._begin = register(_script("begin"))
        self._commit = register(_script("commit"))
        self._end = register(_script("end"))
        self._renew = register(_script("renew"))
        self._held = register(_script("held"))
        self._quota = register(_script("quota"))
        limits = SegmentLimits.for_bounds(max_log_bytes, max_log_events)
        pack, read = register(_script("pack")), register(_script("read"))
        self._packer = LogPacker(
            self._client, self._direct, (pack, read), self._bounded, limits, self._ttl_ms
        )

    async def _evalsha(self, script: AsyncScript, keys: list[bytes], args: Sequence[Arg]) -> Any:
        """``script`` run as calling it does (by EVALSHA, loaded again if the server lost it),
        with its digest and key count handed over as bytes: the request path's scripts, whose
        every string or number argument redis-py would encode in Python. Sent straight on a
        connection (``DirectCommands``) but on a Cluster."""
        count = b"%d" % len(keys)
        # What evalsha calls, its arguments typed as given.
        run = self._client.execute_command if self._direct is None else self._direct.run
        try:
            return await run("EVALSHA", script.sha.encode(), count, *keys, *args)
        except NoScriptError:
            # Loaded by the same way: the connection the refusal came back on is free again,
            # where the pool may have none left.
            script.sha = cast(str, await run("SCRIPT LOAD", script.script))
            return await run("EVALSHA", script.sha.encode(), count, *keys, *args)

    def _bounded(self, operation: str) -> _Bounded:
        return _Bounded(operation, self._operation_timeout)

    async def ping(self) -> None:
        async with self._bounded("ping"):
            await self._client.ping()

    async def load(
        self, conversation: str, chain: Sequence[str] | None = None
    ) -> ConversationState:
        keys = [*map(str.encode, keys_of(conversation, *_LOAD_KEYS))]  # bytes: sent as they are
        picks: Iterable[int] = (self._consulted.get(conversation) or ()) if chain else ()
        async with self._bounded("load"):
            for ask in range(_LOAD_ASKS):
                if ask == _LOAD_ASKS - 1 and chain is not None:
                    picks = range(len(chain))  # every position: the chain lacks none
                args = picked_chain_args(chain, picks)
                loaded = await self._evalsha(self._load, keys, args)
                consulted = consulted_positions(loaded[1])
                if loaded[0] == 1:
                    break
                picks = sorted({*picks, *consulted})
            else:  # asked again though every position was sent: never from this script
                raise StoreUnavailable("load", "IncompleteChainAnswer")
        if chain is not None:
            self._consulted.put(conversation, consulted)
        fields, raw_records, values, lease, lease_position = loaded[2:]
        parse = self._parsed_records
        return state_of(fields, raw_records, values, lease, lease_position, parse, chain is None)

    async def _append(
        self,
        operation: str,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event],
        attributes: ConversationAttributes | None,
        anchor: Anchor | None = None,
        reached: Sequence[ReplacementRecord] = (),
    ) -> int:
        """Log, set, and write the activity index when due, in one round trip; how many
        messages were new."""
        fields = attributes.to_stored() if attributes is not None else {}
        tip = body_tip(messages)
        if tip is not None:
            fields["tip"] = f"{tip[0]}:{tip[1]}"
        message_args, lines = await off_loop_if(
            is_big(messages=len(messages)), lambda: message_arguments(messages)
        )
        plain = [jsonio.dumps(event) for event in events]
        pairs = [*map(str.encode, chain.from_iterable(fields.items()), _UTF8, _AS_READ)]
        # Bytes, every one: redis-py sends them as they are, where it encodes a string or a
        # number in Python (a few dozen bytecodes an argument, on every request).
        args: list[Arg] = [self._append_bounds, b"%d" % len(lines), b"%d" % len(plain)]
        args.append(b"%d" % len(pairs))
        args.append(jsonio.dumps(anchor.__dict__) if anchor is not None else b"")
        args.append("\n".join(sorted({anchor_field(record) for record in reached})).encode())
        args += [b"%d" % int(time.time() * 1000), seen_key_prefix(conversation).encode()]
        args.append(segment_key_prefix(conversation).encode())
        args += message_args
        args += plain
        args += pairs
        keys = [*map(str.encode, keys_of(conversation, *_APPEND_KEYS))]
        now = time.time()
        index = self._index_due(conversation, now)
        async with self._bounded(operation):
            # The index spans every conversation, so it cannot join the per-conversation script
            # (one Cluster slot). On one Redis it rides in the same pipeline, one round trip;
            # Redis Cluster refuses scripts in pipelines, so there it is a second command.
            if not index or self._direct is None:
                appended = await self._evalsha(self._append_script, keys, args)
                if index:
                    await self._client.zadd(conversations_key(), {conversation: now})
                    await self._client.zremrangebyscore(
                        conversations_key(), "-inf", now - self._ttl_ms / 1000
                    )
            else:
                appended = await self._append_and_index(keys, args, conversation, now)
        added, dropped, oldest, claimed = (int(appended[n]) for n in (0, 1, 2, 4))
        if self._pack_log:
            marks = appended[5]  # one character a message: "1" when it was logged
            if len(marks) != len(lines):
                raise ValueError(f"{len(marks)} marks for {len(lines)} messages")
            logged = [*compress(lines, map("1".__eq__, marks)), *plain]
            batch = LoggedBatch(int(appended[7]), tuple(zip(appended[8:], logged, strict=True)))
            epoch = appended[6]
            self._packer.logged(
                conversation, epoch, batch if logged else None, oldest, claimed == 1
            )
        if dropped:
            first = conversation not in self._trimmed
            self._trimmed.put(conversation, True)
            log_bytes_dropped(conversation, dropped, first)
        return added

    async def _append_and_index(
        self, keys: list[bytes], args: list[Arg], conversation: str, now: float
    ) -> Any:
        """The append script and the index write in one round trip (one Redis: a Cluster
        refuses scripts in pipelines).

        Sent again after a NOSCRIPT (``DirectCommands.run_with_script``): the index writes
        are idempotent."""
        direct, script, index = self._direct, self._append_script, conversations_key()
        assert direct is not None

        def commands() -> tuple[tuple[Any, ...], ...]:
            return (
                ("EVALSHA", script.sha.encode(), b"%d" % len(keys), *keys, *args),
                ("ZADD", index, now, conversation),
                ("ZREMRANGEBYSCORE", index, "-inf", now - self._ttl_ms / 1000),
            )

        appended, _, _ = await direct.run_with_script(script, commands)
        return appended

    def _index_due(self, conversation: str, now: float) -> bool:
        """Whether this request writes the activity index: at most once a minute per
        conversation and process, so the one index key is never written on every request (and
        it is trimmed of expired conversations when it is)."""
        last = self._indexed.get(conversation)
        if last is not None and now - last < INDEX_INTERVAL_SECONDS:
            return False
        self._indexed[conversation] = now
        self._indexed.move_to_end(conversation)
        while len(self._indexed) > INDEX_MEMORY:
            self._indexed.popitem(last=False)
        return True

    async def append(
        self,
        conversation: str,
        messages: Sequence[MessageEvent],
        events: Sequence[Event] = (),
        attributes: ConversationAttributes | None = None,
    ) -> int:
        return await self._append("append", conversation, messages, events, attributes)

    async def record_request(
        self,
        conversation: str,
        events: Sequence[Event],
        anchor: Anchor | None = None,
        attributes: ConversationAttributes | None = None,
        messages: Sequence[MessageEvent] = (),
        reached: Sequence[ReplacementRecord] = (),
    ) -> None:
        await self._append(
            "record_request", conversation, messages, events, attributes, anchor, reached
        )

    def _compaction_keys(self, conversation: str) -> list[str]:
        return keys_of(conversation, *_COMPACTION_KEYS)

    def _logged(self, conversation: str, reply: list[Any], events: Sequence[str]) -> int:
        """A compaction script's result; what it logged is handed to the packer."""
        if self._pack_log and len(reply) > 3:
            entries = tuple(zip(reply[3:], (e.encode() for e in events), strict=True))
            self._packer.logged(conversation, reply[1], LoggedBatch(int(reply[2]), entries))
        return int(reply[0])

    async def begin_compaction(
        self,
        conversation: str,
        owner: str,
        ttl_seconds: float,
        start_event: Event,
        expected_generation: int | None = None,
        chain: Sequence[str] | None = None,
        at: int = -1,
    ) -> BeginResult:
        args: list[Arg] = [owner, max(1, int(ttl_seconds * 1000)), self._ttl_ms]
        start = as_json(start_event)
        args += [start, -1 if expected_generation is None else expected_generation]
        args.append(self._record_ttl_ms)
        position, chain_hash = lease_anchor(chain, at)
        args += [*chain_args(chain), f"{position}:{chain_hash}"]
        async with self._bounded("begin_compaction"):
            reply = await self._begin(keys=self._compaction_keys(conversation), args=args)
        result = self._logged(conversation, reply, [start])
        return {1: BeginResult.BEGUN, 0: BeginResult.BUSY}.get(result, BeginResult.STALE)

    async def commit_compaction(
        self,
        conversation: str,
        owner: str,
        events: Sequence[Event],
        records: Sequence[ReplacementRecord],
        superseded: Sequence[ReplacementRecord] = (),
    ) -> int | None:
        logged = [as_json(e) for e in events]
        args: list[Arg] = [owner, self._ttl_ms, len(events), *logged]
        args.append(len(records))
        for record in records:
            args += [anchor_field(record), as_json(record_to_dict(record))]
        stored = self._parsed_records.stored_form
        args.append(len(superseded))
        for record in superseded:
            args += [anchor_field(record), stored(record)]
        ends = checkpoint_ends((), records)
        args += [as_json([end.stored() for end in ends]), RECENT_CHECKPOINT_ENDS]
        args.append(self._record_ttl_ms)
        async with self._bounded("commit_compaction"):
            reply = await self._commit(keys=self._compaction_keys(conversation), args=args)
        generation = self._logged(conversation, reply, logged)
        return None if generation < 0 else generation

    async def end_compaction(self, conversation: str, owner: str, end_event: Event) -> None:
        logged = as_json(end_event)
        args: list[Arg] = [owner, self._ttl_ms, logged, self._record_ttl_ms]
        async with self._bounded("end_compaction"):
            reply = await self._end(keys=self._compaction_keys(conversation), args=args)
        self._logged(conversation, reply, [logged])

    async def renew_lease(self, conversation: str, owner: str, ttl_seconds: float) -> bool:
        lease = keys_of(conversation, "leases")
        async with self._bounded("renew_lease"):
            renewed = await self._renew(keys=lease, args=[owner, int(ttl_seconds * 1000)])
        return int(renewed) == 1

    async def read_log(
        self, conversation: str, after: str | None = None, limit: int = 100
    ) -> LogPage:
        return await self._packer.read(conversation, after, limit)

    async def list_conversations(
        self, limit: int = 50, offset: int = 0
    ) -> list[ConversationSummary]:
        index = conversations_key()
        async with self._bounded("list_conversations"):
            await self._client.zremrangebyscore(index, "-inf", time.time() - self._ttl_ms / 1000)
            raw = await self._client.zrevrange(index, offset, offset + limit - 1, withscores=True)
            entries = cast(list[tuple[str, float]], raw)
            pipe = self._client.pipeline(transaction=False)
            for name, _ in entries:
                pipe.hgetall(conversation_keys(name)["state"])
            states = cast(list[dict[str, str]], await pipe.execute())
        summaries: list[ConversationSummary] = []
        for (name, score), state in zip(entries, states, strict=True):
            attributes = ConversationAttributes.read(
                {k: v for k, v in state.items() if k not in STATE_FIELDS}
            )
            generation = generation_field(state.get("generation"))
            summaries.append(ConversationSummary(name, float(score), generation, attributes))
        return summaries

    async def wait_for_lease(
        self, conversation: str, max_wait: float, chain: Sequence[str] | None = None
    ) -> bool:
        leases = keys_of(conversation, "leases")
        args = chain_args(chain)
        deadline = time.monotonic() + max_wait
        while True:
            async with self._bounded("wait_for_lease"):
                held = int(await self._held(keys=leases, args=args))
            if not held:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(_LEASE_POLL_SECONDS)

    async def take_quota(
        self, quotas: Sequence[tuple[str, int]], window_seconds: int
    ) -> str | None:
        keys = [quota_key(name) for name, _ in quotas]
        member = uuid.uuid4().hex
        args: list[Arg] = [window_seconds * 1000, member, *(limit for _, limit in quotas)]
        async with self._bounded("take_quota"):
            refused = int(await self._quota(keys=keys, args=args))
        return quotas[refused - 1][0] if refused else None

    async def give_back_quota(self, names: Sequence[str], window_seconds: int) -> None:
        async with self._bounded("give_back_quota"):
            for name in names:
                await self._client.zpopmax(quota_key(name))

    async def claim_objects(self, tenant: str, ids: Sequence[str], ttl_seconds: float) -> None:
        if not ids:
            return
        ttl_ms = max(1, int(ttl_seconds * 1000))
        async with self._bounded("claim_objects"):
            pipe = self._client.pipeline(transaction=False)
            for object_id in ids:
                pipe.set(owner_key(object_id), tenant, nx=True, px=ttl_ms)
            await pipe.execute()

    async def object_owners(self, ids: Sequence[str]) -> list[str | None]:
        if not ids:
            return []
        async with self._bounded("object_owners"):
            pipe = self._client.pipeline(transaction=False)
            for object_id in ids:
                pipe.get(owner_key(object_id))
            return cast(list[str | None], await pipe.execute())

    async def shared_secret(self, name: str, candidate: bytes) -> bytes:
        key = secret_key(name)
        async with self._bounded("shared_secret"):
            await self._client.set(key, candidate.hex(), nx=True)
            stored = cast(str | None, await self._client.get(key))
        if stored is None:
            raise StoreUnavailable("shared_secret", "secret vanished right after it was set")
        return bytes.fromhex(stored)

    async def ttl_of(self, conversation: str) -> dict[str, int]:
        """Remaining TTL (ms) of each of the conversation's keys; for tests and operators."""
        keys = conversation_keys(conversation)
        async with self._bounded("ttl_of"):
            return {name: await self._client.pttl(key) for name, key in keys.items()}

    async def log_packs_settled(self) -> None:
        """Wait for the log packs under way (they run after the appends that make them due)."""
        await self._packer.settled()

    async def close(self) -> None:
        await self._packer.drain(self._operation_timeout)
        if self._direct is not None:
            await self._direct.close()
        await self._client.aclose()
