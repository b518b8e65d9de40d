"""The Redis store's side of its scripts: the arguments they take and their answers read back.

Plain functions over plain data; ``redis.py`` sends them. See ``lua/`` for the other side.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from operator import is_not
from typing import Any, cast

from compaction_proxy.conversation.log_events import MessageEvent
from compaction_proxy.conversation.replacements import CheckpointEnd, ReplacementRecord
from compaction_proxy.lru import LRU
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metrics import UNREADABLE_STATE_FIELDS
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.attributes import ATTRIBUTE_NAMES, ConversationAttributes
from compaction_proxy.store.base import ConversationState
from compaction_proxy.store.branches import anchor_of, generation_of

log = logging.getLogger(__name__)

Arg = str | int | bytes
# State hash fields that are not conversation attributes
STATE_FIELDS = frozenset(
    {
        "generation",
        "anchor",
        "tip",
        "ends",
        "log_bytes",
        "tail_bytes",
        "packed_events",
        "logged",
        "oldest",
        "renewed",
        "epoch",
    }
)

# The state hash fields a load reads (named again in lua/load.lua): the branch's own, then
# the attributes (named apart from every state field)
LOAD_FIELDS = ("generation", "anchor", "tip", "ends", *ATTRIBUTE_NAMES)


def chain_args(chain: Sequence[str] | None) -> list[Arg]:
    """A whole chain, as begin and the lease wait take it: its hashes back to back, and their
    width (0: the whole conversation). Two arguments however long the chain."""
    if chain is None:
        return ["", 0]
    if not chain:
        return ["", 1]
    widths = set(map(len, chain))  # one C-level pass: a chain holds hundreds of hashes
    width = len(chain[0])
    if width == 0 or len(widths) != 1:
        raise ValueError("the chain's hashes differ in width")
    return ["".join(chain), width]


def picked_chain_args(chain: Sequence[str] | None, picks: Iterable[int]) -> list[bytes]:
    """A chain as the load takes it: its length ('' for the whole conversation) and its
    hashes at the positions ``picks`` names inside it, as "<position>:<hash>" space apart:
    two arguments whose size does not grow with the chain. A hash never holds white space
    (the chain's are hex digests). As bytes, which redis-py sends as they are (a string or
    a number it encodes in Python, on every request)."""
    if chain is None:
        return [b"", b""]
    count = len(chain)
    picked = " ".join([f"{p}:{chain[p]}" for p in picks if 0 <= p < count])
    return [b"%d" % count, picked.encode()]


def consulted_positions(raw: str) -> tuple[int, ...]:
    """The chain positions a load consulted, as it names them (see ``lua/load.lua``)."""
    return tuple(sorted({int(p) for p in raw.split()}))


def anchor_field(record: ReplacementRecord) -> str:
    position, chain_hash = anchor_of(record)
    return f"{position}:{chain_hash}"


def as_json(value: Any) -> str:
    return jsonio.dumps(value).decode()


SEEN_SETS = 8  # seen Sets of each kind (lua/log.lua)
_HEX = frozenset("0123456789abcdefABCDEF")


def seen_member(key: str) -> tuple[str, str]:
    """Where a message's key is kept seen: the Set (its kind, the prefix up to a colon, and
    a bucket) and the member. Redis keeps a Set of at most 512 integers as a sorted array of 8
    bytes each: a hash or digest's last 13 hex digits (52 bits, never alike by chance in one
    conversation) make such an integer. Another key is kept as its text."""
    kind, colon, rest = key.rpartition(":")
    kind += colon
    digits = rest[-13:]
    if len(digits) == 13 and _HEX.issuperset(digits):
        value = int(digits, 16)
        return f"{kind}{value % SEEN_SETS}", str(value)
    return f"{kind}{len(rest) % SEEN_SETS}", rest


def message_arguments(messages: Sequence[MessageEvent]) -> tuple[list[bytes], list[bytes]]:
    """The append script's arguments for ``messages``, eight a message (see ``append.lua``):
    its hash, the Set and member it is kept seen under, its content key with its own (empty
    when it has none), ``1`` when it is logged by its content, its event's JSON; and each
    event's JSON, for the log's packer."""
    arguments: list[bytes] = []
    lines: list[bytes] = []
    for message in messages:
        event = jsonio.dumps(message.event)
        lines.append(event)
        content = message.content_key
        content_set, content_member = seen_member(content) if content else ("", "")
        seen_set, member = seen_member(message.hash)
        keys = (message.hash, seen_set, member, content, content_set, content_member)
        arguments += map(str.encode, keys)
        arguments += (b"1" if message.by_content else b"0", event)
    return arguments, lines


def as_argument(value: str | int | bytes) -> bytes:
    """``value`` as the bytes redis-py's encoder sends for it (text as UTF-8, a byte that was
    read as a surrogate escape put back; a whole number in decimal): a command of such
    arguments is framed in one C call (``redis_packing``). A reply read as text comes back
    as the bytes stored the same way (replies decode as UTF-8 with ``surrogateescape``)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, int):
        return b"%d" % value
    return value.encode("utf-8", "surrogateescape")


def packed_bounds(*bounds: int) -> bytes:
    """Whole numbers as one script argument, 8 bytes each, big-endian (``append.lua`` reads
    them with one ``struct.unpack``)."""
    return struct.pack(f">{len(bounds)}q", *bounds)


def checkpoint_ends_of(raw: str | None) -> tuple[CheckpointEnd, ...]:
    if not raw:
        return ()
    try:
        return CheckpointEnd.read_all(jsonio.loads(raw))
    except ValueError:
        return ()


def lease_end_of(position: str | None) -> int | None:
    """Where the live lease's compaction ends, as the load script returns it (false, read as
    None, when no lease lies on the branch; negative when the lease is the whole
    conversation's)."""
    if not position or not position.lstrip("-").isdigit():
        return None
    end = int(position)
    return end if end >= 0 else None


def logged_tip_of(raw: str | None) -> tuple[int, str] | None:
    if not raw:
        return None
    position, _, tip_hash = raw.partition(":")
    if not (position.isascii() and position.isdigit()):
        unreadable_field("tip", raw)
        return None
    return int(position), tip_hash


def generation_field(raw: str | None) -> int:
    """The conversation's generation counter as stored; 0 when it cannot be read (the commit
    script then sets it past every commit on record, so no order repeats)."""
    if raw is None:
        return 0
    if raw.isascii() and raw.isdigit():
        return int(raw)
    unreadable_field("generation", raw)
    return 0


# Unreadable values already said: each is logged once while remembered, and counted once.
_SAID: LRU[tuple[str, str], bool] = LRU(1024)


def unreadable_field(field: str, raw: str) -> None:
    """A state field that cannot be read (another version's, or damaged) is read as absent,
    like an unreadable record: counted, logged once, and the conversation goes on."""
    said = (field, raw[:200])
    if _SAID.get(said):
        return
    _SAID.put(said, True)
    UNREADABLE_STATE_FIELDS.labels(field=field).inc()
    log.warning("a conversation's stored %s cannot be read, and is ignored: %r", field, said[1])


def state_of(
    loaded: list[str | None],
    raw_records: list[str],
    values: list[str],
    lease: str | None,
    lease_position: str | None,
    parse_record: Callable[[str], ReplacementRecord | None],
    whole: bool,
) -> ConversationState:
    """The loaded snapshot: the records written before anchoring first, then the anchored
    ones in commit order; the branch's generation is the newest of theirs. ``loaded``: the
    values of ``LOAD_FIELDS`` (None where unset); ``lease`` and ``lease_position``: the live
    lease's owner and where its compaction ends, as the load script returns them."""
    # The fields set, picked in C (a comprehension was a loop in Python on every load).
    set_fields = map(is_not, loaded, repeat(None))
    picked = compress(zip(LOAD_FIELDS, loaded, strict=True), set_fields)
    state = cast(dict[str, str], dict(picked))  # the unset (None) ones left out
    anchor = Anchor.read(state["anchor"]) if "anchor" in state else None
    if anchor is None and "anchor" in state:
        unreadable_field("anchor", state["anchor"])
    lines = sorted(
        (int(order), raw)
        for value in values
        for order, _, raw in (line.partition(" ") for line in value.split("\n"))
        if order.isdigit()  # a damaged line is skipped like an unreadable record
    )
    records = [parse_record(raw) for raw in raw_records]
    records += [parse_record(raw) for _, raw in lines if raw]  # not a dropping commit's mark
    generation = generation_field(state.get("generation"))
    if not whole and not raw_records:
        generation = max((generation_of(order) for order, _ in lines), default=0)
    return ConversationState(
        records=tuple(r for r in records if r is not None),
        generation=generation,
        anchor=anchor,
        lease_owner=lease or None,
        lease_end=lease_end_of(lease_position),
        logged_tip=logged_tip_of(state.get("tip")),
        recent_ends=checkpoint_ends_of(state.get("ends")),
        attributes=ConversationAttributes.read(state),
    )
