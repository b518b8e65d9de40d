"""Records loaded from Redis are parsed once per stored value, within a bound."""

from __future__ import annotations

from compaction_proxy.conversation.replacements import Checkpoint, Prune, record_to_dict
from compaction_proxy.parsing import jsonio
from compaction_proxy.store.parsed_records import ParsedRecords


def stored(record: Checkpoint | Prune) -> str:
    return jsonio.dumps(record_to_dict(record)).decode()


SUMMARY = Checkpoint(0, 4, "root", "hash-4", {"role": "user", "content": "s" * 1000}, tokens=9)


def test_a_record_loaded_again_is_the_object_parsed_the_first_time() -> None:
    parse = ParsedRecords()
    first = parse(stored(SUMMARY))
    assert first == SUMMARY
    assert parse(stored(SUMMARY)) is first
    assert parse(stored(Prune(8, "hash-8", "cut"))) == Prune(8, "hash-8", "cut")


def test_the_parsed_records_held_stay_within_their_bound() -> None:
    parse = ParsedRecords(max_chars=5_000)
    records = [
        Checkpoint(0, i, "root", f"hash-{i}", {"role": "user", "content": "s" * 1000}, tokens=9)
        for i in range(1, 20)
    ]
    for record in records:
        assert parse(stored(record)) == record
    assert parse._chars <= 5_000 < sum(len(stored(r)) for r in records)
    assert parse(stored(records[-1])) is parse(stored(records[-1]))  # the newest is kept
