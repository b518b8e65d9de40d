"""Replacement records: what a committed compaction adds, and the messages they change.

Pure data. A record is chain-addressed (DESIGN.md §3): it applies to a request only when the
request shares the exact prefix it was made from, and only under the instructions
(``context``) it was made under. The store keeps records in their dict form
(``record_to_dict``); ``record_from_dict`` reads them back.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import cut, text_of
from compaction_proxy.frozen import frozen


@frozen
class Checkpoint:
    """Body positions ``start..end`` (inclusive) replaced by one framed summary message."""

    start: int
    end: int
    start_prev_hash: str
    end_hash: str
    message: Message
    tokens: int
    shadowed_tokens: int = 0
    end_fingerprint: str = ""  # branch_fingerprint at ``end`` of the request it was made from
    context: str = ""  # context_fingerprint it was made under ("" before contexts were kept)
    kind: Literal["checkpoint"] = "checkpoint"

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end:
            raise ValueError(f"checkpoint span {self.start}..{self.end} is empty or negative")


@frozen
class Prune:
    """Content-only replacement of the observation at body ``position``.

    ``head_end``/``tail_start`` are the joined-text offsets of the cut. The cut is applied to
    the message as the request sends it, so the client's own part fields (``cache_control``
    moved to another part, say) survive; ``content`` is the result at commit time, used for
    records made before offsets were kept.

    A ``masked`` record clears the observation (``compaction.masking``): ``content`` is its
    placeholder, with no offsets, so a version that does not know the flag still sends it.
    At one position a mask wins over a prune, and commits drop the prune it replaces.
    """

    position: int
    hash: str
    content: Any
    chars_before: int = 0
    chars_after: int = 0
    head_end: int | None = None
    tail_start: int | None = None
    context: str = ""  # context_fingerprint it was made under ("" before contexts were kept)
    masked: bool = False
    kind: Literal["prune"] = "prune"


def pruned_message(message: Message, prune: Prune) -> Message:
    """``message`` with ``prune`` applied; every field but ``content`` as sent."""
    content = message.get("content")
    if (
        prune.head_end is not None
        and prune.tail_start is not None
        and len(text_of(content) or "") == prune.chars_before
    ):
        return {**message, "content": cut(content, prune.head_end, prune.tail_start)}
    return {**message, "content": prune.content}


ReplacementRecord = Checkpoint | Prune


@frozen
class CheckpointEnd:
    """Where a committed checkpoint ended, named by content (``Checkpoint.end_fingerprint``)
    and instructions. A conversation keeps its last few whatever branch they lie on: a request
    that resends the messages one ended at, with something before them rewritten, is then seen
    missing it (``surface.missed_checkpoints``), though it reads none of that branch's
    records."""

    end: int
    fingerprint: str
    context: str = ""

    @classmethod
    def of(cls, checkpoint: Checkpoint) -> CheckpointEnd:
        return cls(checkpoint.end, checkpoint.end_fingerprint, checkpoint.context)

    def stored(self) -> list[Any]:
        return [self.end, self.fingerprint, self.context]

    @classmethod
    def read_all(cls, stored: Any) -> tuple[CheckpointEnd, ...]:
        """Ends as ``stored`` lists them; what is not one (another version's, damaged) is
        skipped: they only feed a guard."""
        if not isinstance(stored, list):
            return ()
        return tuple(
            cls(item[0], item[1], item[2])
            for item in stored
            if isinstance(item, list)
            and len(item) >= 3
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
            and isinstance(item[1], str)
            and isinstance(item[2], str)
        )


def checkpoint_ends(
    kept: Sequence[CheckpointEnd], records: Iterable[ReplacementRecord]
) -> list[CheckpointEnd]:
    """``kept`` with the ends of the checkpoints among ``records`` after them, the last
    ``RECENT_CHECKPOINT_ENDS`` of all."""
    ends = [*kept, *(CheckpointEnd.of(r) for r in records if isinstance(r, Checkpoint))]
    return ends[-RECENT_CHECKPOINT_ENDS:]


RECENT_CHECKPOINT_ENDS = 16  # how many a conversation keeps


def record_to_dict(record: ReplacementRecord) -> dict[str, Any]:
    """The stored form; a prune's ``masked`` only when set (a plain prune is stored as
    versions before masking stored it)."""
    stored = {name: getattr(record, name) for name in record.__dataclass_fields__}
    if stored.get("masked") is False:
        del stored["masked"]
    return stored


class UnreadableRecord(ValueError):
    """A stored record this version cannot read: damaged, of a kind it does not know, or
    missing a field it needs."""


_KINDS: dict[object, type[Checkpoint] | type[Prune]] = {"checkpoint": Checkpoint, "prune": Prune}
_INTS = frozenset({"start", "end", "tokens", "shadowed_tokens", "position"})
_INTS |= frozenset({"chars_before", "chars_after"})
_OPTIONAL_INTS = frozenset({"head_end", "tail_start"})
_STRINGS = frozenset({"start_prev_hash", "end_hash", "end_fingerprint", "context", "hash"})


def _well_typed(name: str, value: Any) -> bool:
    if name in _INTS or name in _OPTIONAL_INTS:
        if value is None:
            return name in _OPTIONAL_INTS
        return isinstance(value, int) and not isinstance(value, bool)
    if name in _STRINGS:
        return isinstance(value, str)
    if name == "message":
        return isinstance(value, dict)
    if name == "masked":
        return isinstance(value, bool)
    return True


def record_from_dict(data: Any) -> ReplacementRecord:
    """A record as stored by this version or another: fields this version does not know (a
    newer replica's) are ignored. Raises ``UnreadableRecord`` when it cannot be read as a
    record of a known kind with every field it needs, each of its type."""
    if not isinstance(data, Mapping):
        raise UnreadableRecord(f"a record is a JSON object, not {type(data).__name__}")
    kind = _KINDS.get(data.get("kind"))
    if kind is None:
        raise UnreadableRecord(f"unknown replacement record kind {data.get('kind')!r}")
    known = {k: v for k, v in data.items() if k in kind.__dataclass_fields__}
    wrong = sorted(k for k, v in known.items() if not _well_typed(k, v))
    if wrong:
        raise UnreadableRecord(f"{data.get('kind')} record with ill-typed {', '.join(wrong)}")
    try:
        return kind(**known)
    except (TypeError, ValueError) as exc:  # a required field missing, an empty span
        raise UnreadableRecord(f"{data.get('kind')} record: {exc}") from exc


def superseded_by(
    checkpoint: Checkpoint, records: Iterable[ReplacementRecord], chain: Sequence[str]
) -> list[ReplacementRecord]:
    """Records of ``chain``'s own branch that lie inside ``checkpoint``'s span: every request
    that applies the checkpoint applies it instead of them, so they are dropped when it
    commits. (A fork that shares their prefix but not the checkpoint's compacts again.)"""

    def on_branch(position: int, expected: str) -> bool:
        return 0 <= position < len(chain) and chain[position] == expected

    dropped: list[ReplacementRecord] = []
    for record in records:
        if record.context != checkpoint.context:
            continue  # still in force for requests under its own instructions
        if isinstance(record, Checkpoint):
            inside = checkpoint.start <= record.start and record.end <= checkpoint.end
            if inside and on_branch(record.end, record.end_hash):
                dropped.append(record)
        elif checkpoint.start <= record.position <= checkpoint.end and on_branch(
            record.position, record.hash
        ):
            dropped.append(record)
    return dropped
