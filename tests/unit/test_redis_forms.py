"""The Redis store's script arguments and the reading of a load's answer (pure functions)."""

from __future__ import annotations

import re
from importlib.resources import files

import orjson

from compaction_proxy.conversation.log_events import MessageEvent
from compaction_proxy.store.attributes import ATTRIBUTE_NAMES, ShortfallReason
from compaction_proxy.store.redis_forms import (
    LOAD_FIELDS,
    STATE_FIELDS,
    consulted_positions,
    message_arguments,
    picked_chain_args,
    seen_member,
    state_of,
)

CHAIN = [f"{i:032x}" for i in range(6)]


def test_a_picked_chain_sends_its_length_and_only_the_picked_hashes_inside_it() -> None:
    assert picked_chain_args(CHAIN, [4, 1, 9, -1]) == [b"6", f"4:{CHAIN[4]} 1:{CHAIN[1]}".encode()]
    assert picked_chain_args(CHAIN, ()) == [b"6", b""]
    assert picked_chain_args([], [0]) == [b"0", b""]


def test_the_whole_conversation_sends_no_chain() -> None:
    assert picked_chain_args(None, [1, 2]) == [b"", b""]


def test_consulted_positions_are_read_once_each_in_order() -> None:
    assert consulted_positions("12 3 12 -1") == (-1, 3, 12)
    assert consulted_positions("") == ()


def test_the_attributes_a_load_reads_are_named_apart_from_the_logs_state_fields() -> None:
    assert not STATE_FIELDS.intersection(ATTRIBUTE_NAMES)
    assert len(set(LOAD_FIELDS)) == len(LOAD_FIELDS)


def test_the_load_script_reads_the_fields_its_answer_is_read_as_in_their_order() -> None:
    script = (files("compaction_proxy.store") / "lua" / "load.lua").read_text(encoding="utf-8")
    listed = re.search(r"local LOAD_FIELDS = \{(.*?)\}", script, re.DOTALL)
    assert listed is not None
    assert tuple(re.findall(r"'([a-z_]+)'", listed.group(1))) == LOAD_FIELDS


def test_a_loaded_state_reads_unset_fields_as_unknown_and_empty_ones_as_stored() -> None:
    loaded: list[str | None] = [None] * len(LOAD_FIELDS)
    loaded[LOAD_FIELDS.index("over_threshold")] = ""  # back under the threshold
    loaded[LOAD_FIELDS.index("generation")] = "7"
    loaded[LOAD_FIELDS.index("model")] = "m"
    state = state_of(loaded, [], [], None, None, lambda raw: None, True)
    assert state.attributes.over_threshold is ShortfallReason.BELOW_THRESHOLD
    assert (state.generation, state.attributes.model, state.attributes.tenant) == (7, "m", None)
    assert state.anchor is None and state.lease_owner is None


def _message(hash_: str, content_key: str, by_content: bool) -> MessageEvent:
    return MessageEvent(3, hash_, {"role": "tool", "content": "x"}, content_key, by_content)


def test_each_message_goes_as_eight_arguments_its_event_json_last() -> None:
    plain, by_content = f"{0x1AC639D084FDD:032x}", "d:" + "c" * 32
    arguments, lines = message_arguments(
        [_message(plain, "", False), _message("b" * 32, by_content, True)]
    )
    member = str(0x1AC639D084FDD).encode()
    assert arguments[:8] == [plain.encode(), b"5", member, b"", b"", b"", b"0", lines[0]]
    kept = [k.encode() for k in ("b" * 32, *seen_member("b" * 32), by_content)]
    kept += [k.encode() for k in seen_member(by_content)]
    assert arguments[8:] == [*kept, b"1", lines[1]]
    assert orjson.loads(lines[0]) == {"role": "tool", "content": "x"}
