"""Validation of incoming bodies: clear 400s, and every other field kept as sent."""

from __future__ import annotations

import orjson
import pytest

from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.chat import parse_chat_request


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        (b"{not json", None),
        (b"[1, 2]", None),
        (b'{"messages": []}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": {"role": "user"}}', "messages"),
        (b'{"model": "m", "messages": ["hi"]}', "messages[0]"),
        (b'{"model": "m", "messages": [{"content": "hi"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "wizard", "content": "hi"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user"}, {"role": 3}]}', "messages[1].role"),
        (b'{"model": 7, "messages": []}', "model"),
    ],
)
def test_bad_bodies_are_rejected_naming_the_param(raw: bytes, param: str | None) -> None:
    with pytest.raises(BadRequest) as caught:
        parse_chat_request(raw)
    assert caught.value.status == 400
    assert caught.value.param == param


def test_unknown_fields_are_kept_as_sent() -> None:
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "hi", "x_vendor": {"a": 1}}],
        "temperature": 0.2,
        "stream": True,
        "some_future_field": [1, {"b": None}],
    }
    chat = parse_chat_request(orjson.dumps(body))
    assert chat.body == body
    assert chat.stream is True
    assert chat.messages is chat.body["messages"]


@pytest.mark.parametrize(
    ("fields", "cap"),
    [
        ({}, None),
        ({"max_tokens": 300}, 300),
        ({"max_completion_tokens": 500, "max_tokens": 300}, 500),
        ({"max_completion_tokens": None, "max_tokens": 300}, 300),
        # What the upstream will refuse is no cap the proxy plans with.
        ({"max_tokens": 0}, None),
        ({"max_tokens": -5}, None),
        ({"max_tokens": True}, None),
        ({"max_tokens": 12.5}, None),
        ({"max_tokens": "300"}, None),
    ],
)
def test_the_answer_cap_is_the_clients_positive_integer_field(
    fields: dict[str, object], cap: int | None
) -> None:
    raw = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields})
    assert parse_chat_request(raw).answer_cap == cap
