"""Messages seen before: same digests as hashing from scratch, validated once, bounded."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.conversation.messages import message_digest
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.chat import parse_chat_request
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.parsing import jsonio
from tests.strategies import messages

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st


def _no_check(message: Any, index: int) -> None:
    pass


@pytest.mark.slow  # seconds of examples or waits: the full run has it
@settings(max_examples=300, deadline=None)
@given(batch=st.lists(messages, max_size=8))
def test_digests_are_message_digest_whether_seen_or_not(batch: list[dict[str, Any]]) -> None:
    known = KnownMessages()
    expected = [message_digest(m) for m in batch]
    assert known.digests(batch, _no_check) == expected  # first sight
    assert known.digests(batch, _no_check) == expected  # from the cache
    reordered = [dict(reversed(list(m.items()))) for m in batch]
    assert known.digests(reordered, _no_check) == expected  # other key order, other bytes


def test_only_unseen_messages_are_validated() -> None:
    known = KnownMessages()
    checked: list[int] = []
    history = [{"role": "user", "content": f"turn {i}"} for i in range(5)]
    known.digests(history, lambda m, i: checked.append(i))
    assert checked == [0, 1, 2, 3, 4]
    checked.clear()
    grown = [*history, {"role": "assistant", "content": "new"}]
    known.digests(grown, lambda m, i: checked.append(i))
    assert checked == [5]


def test_an_invalid_message_is_refused_every_time_it_is_sent() -> None:
    known = KnownMessages()
    sent = [{"role": "user", "content": "ok"}, {"role": "user", "content": 3}]
    body = orjson.dumps({"model": "m", "messages": sent})
    for _ in range(2):
        with pytest.raises(BadRequest) as caught:
            parse_chat_request(body, known)
        assert caught.value.param == "messages[1].content"
    assert len(known) == 1  # the valid first message only


def test_parse_gives_the_digests_of_head_and_body_in_order() -> None:
    sent = [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": "hi", "cache_control": {"type": "ephemeral"}},
    ]
    chat = parse_chat_request(orjson.dumps({"model": "m", "messages": sent}), KnownMessages())
    assert chat.digests == [message_digest(m) for m in sent]


def test_held_bytes_stay_under_the_bound_oldest_out_first() -> None:
    known = KnownMessages(max_bytes=20_000)
    batch = [{"role": "user", "content": f"{i:04d}" + "x" * 500} for i in range(100)]
    known.digests(batch, _no_check)
    assert known.held_bytes <= 20_000
    assert 0 < len(known) < 100
    checked: list[int] = []
    known.digests([batch[0], batch[-1]], lambda m, i: checked.append(i))
    assert checked == [0]  # the oldest was evicted, the newest kept


def test_a_message_too_big_to_hold_is_hashed_but_not_held() -> None:
    known = KnownMessages(max_bytes=10_000)
    big = {"role": "tool", "tool_call_id": "c", "content": "y" * 5_000}
    assert known.digests([big], _no_check) == [message_digest(big)]
    assert len(known) == 0


def test_integers_orjson_cannot_write_are_hashed_without_the_cache() -> None:
    known = KnownMessages()
    message = {"role": "user", "content": "n", "metadata": 2**70}
    assert known.digests([message], _no_check) == [message_digest(message)]
    assert len(known) == 0


@pytest.mark.parametrize("text", ["[NaN, 12345678901234567890]", "[1e400, 12345678901234567890]"])
def test_the_fallback_parser_refuses_what_orjson_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        jsonio.loads(text)
