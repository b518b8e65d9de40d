"""What a conversation keeps as attributes: read tolerantly from what any replica stored,
written back in the stored form, and the largest answer the background rounds size from."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from compaction_proxy.compaction.pressure import answer_attributes
from compaction_proxy.store.attributes import ConversationAttributes, ShortfallReason
from compaction_proxy.store.base import ConversationState

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

LARGEST = "largest_answer_tokens"


def state(**stored: str) -> ConversationState:
    return ConversationState(attributes=ConversationAttributes.read(stored))


@pytest.mark.parametrize(
    ("stored", "largest"),
    [(None, None), ("300", 300), ("", None), ("-3", None), ("1e3", None), ("٣", None)],
)
def test_the_largest_answer_is_read_only_from_ascii_digits(
    stored: str | None, largest: int | None
) -> None:
    stored_fields = {} if stored is None else {LARGEST: stored}
    assert state(**stored_fields).attributes.largest_answer_tokens == largest


@pytest.mark.parametrize(
    ("previous", "usage", "written"),
    [
        (None, {"completion_tokens": 120}, {LARGEST: "120"}),
        ("300", {"completion_tokens": 120}, {}),  # smaller: the largest stays
        ("300", {"completion_tokens": 301}, {LARGEST: "301"}),
        (None, {"completion_tokens": 0}, {}),
        (None, {"completion_tokens": True}, {}),
        (None, {"completion_tokens": "120"}, {}),
        (None, {}, {}),
    ],
)
def test_an_answer_raises_the_largest_only_when_larger(
    previous: str | None, usage: dict[str, Any], written: dict[str, str]
) -> None:
    stored = {} if previous is None else {LARGEST: previous}
    assert answer_attributes(state(**stored), usage).to_stored() == written
    assert answer_attributes(None, usage).to_stored() == {}


def test_every_attribute_has_a_reader_and_the_stored_names_never_change() -> None:
    """The stored names are a contract with every replica sharing the store."""
    names = [f.name for f in dataclasses.fields(ConversationAttributes)]
    assert names == [
        "tenant",
        "session",
        "model",
        "context",
        "last_seen",
        "last_pressure",
        "checkpoint_misses",
        "over_threshold",
        "largest_answer_tokens",
        "compaction_failed_at",
        "compaction_failed_tokens",
        "overflow_recovery_at",
        "client_compactions",
    ]
    everything = {name: "1" for name in names} | {"over_threshold": "ahead"}
    stored = ConversationAttributes.read(everything).to_stored()
    assert set(stored) == set(names)
    assert all(type(value) is str for value in stored.values())


def test_values_as_an_older_proxy_stored_them_read_back_unchanged() -> None:
    stored = {
        "checkpoint_misses": "0",
        "context": "ec38d9e9beb187ff4e0a508663a63d53",
        "largest_answer_tokens": "1",
        "last_pressure": "0.2189",
        "last_seen": "1796319892.062",
        "model": "small-model",
        "over_threshold": "",
        "session": "recorded-1",
        "tenant": "2d439c04616167339c1943515d5576c3",
        "compaction_failed_at": "1796319000.500",
        "compaction_failed_tokens": "14000",
        "overflow_recovery_at": "1796319001.250",
    }
    attributes = ConversationAttributes.read(stored)
    assert attributes.over_threshold is ShortfallReason.BELOW_THRESHOLD
    assert attributes.misses == 0 and attributes.last_pressure == 0.2189
    assert attributes.to_stored() == stored


def test_unknown_fields_and_unreadable_values_are_left_out() -> None:
    attributes = ConversationAttributes.read(
        {
            "from_a_newer_replica": "x",
            "last_seen": "soon",
            "last_pressure": "nan",
            "checkpoint_misses": "-1",
            "over_threshold": "a reason of the future",
            "model": "m",
        }
    )
    assert attributes == ConversationAttributes(model="m")


def test_a_write_sets_only_what_it_names() -> None:
    kept = ConversationAttributes(model="m", checkpoint_misses=2, tenant="t")
    assert kept.updated(ConversationAttributes(checkpoint_misses=0)) == ConversationAttributes(
        model="m", checkpoint_misses=0, tenant="t"
    )


_SOME_ATTRIBUTES = st.builds(
    ConversationAttributes,
    **{
        name: st.none() | st.integers(0, 9) | st.just("v")
        for name in ("tenant", "model", "checkpoint_misses", "largest_answer_tokens")
    },
)


@given(_SOME_ATTRIBUTES, _SOME_ATTRIBUTES)
def test_a_write_changes_every_field_it_sets_and_no_other(
    kept: ConversationAttributes, write: ConversationAttributes
) -> None:
    merged = kept.updated(write)
    for field in dataclasses.fields(ConversationAttributes):
        written = getattr(write, field.name)
        expected = getattr(kept, field.name) if written is None else written
        assert getattr(merged, field.name) == expected
    assert kept.updated(ConversationAttributes()) == kept


@given(st.dictionaries(st.text(max_size=30), st.text(max_size=30), max_size=12))
def test_reading_anything_stored_never_raises_and_its_stored_form_is_stable(
    stored: dict[str, str],
) -> None:
    written = ConversationAttributes.read(stored).to_stored()
    assert ConversationAttributes.read(written).to_stored() == written
