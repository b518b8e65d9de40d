"""The session log's content limit, spared where a body is too small to reach it: no message
of any wire format's request holds more text than ``TEXT_PER_BODY_BYTE`` characters per byte
of the body it came in, however small its items and whatever numbers it writes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.conversation.log_events import TEXT_PER_BODY_BYTE, message_events
from compaction_proxy.conversation.text import text_size
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import ParseContext
from compaction_proxy.formats.wire_formats import WIRE_FORMATS
from compaction_proxy.parsing.recent_bodies import RecentBodies

pytest.importorskip("hypothesis")

from hypothesis import given, settings
from hypothesis import strategies as st

NUMBER = "\x00number"  # a value written as ``1E2`` in the body: 3 bytes, read back as 100.0
short = st.text(max_size=3)
ident = st.text("ab", max_size=2)
value = st.one_of(short, st.just(NUMBER), st.integers(0, 9), st.none())
json_object = st.dictionaries(ident, value, max_size=3)


def body_bytes(body: dict[str, Any]) -> bytes:
    """The body as a client writes it, its numbers in their shortest form."""
    return orjson.dumps(body).replace(orjson.dumps(NUMBER), b"1E2")


chat_message = st.one_of(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": short}
    ),
    st.fixed_dictionaries(
        {
            "role": st.just("assistant"),
            "content": st.none(),
            "tool_calls": st.lists(
                st.fixed_dictionaries(
                    {
                        "id": ident,
                        "type": st.just("function"),
                        "function": st.fixed_dictionaries({"name": ident, "arguments": short}),
                    }
                ),
                min_size=1,
                max_size=3,
            ),
        }
    ),
    st.fixed_dictionaries({"role": st.just("tool"), "tool_call_id": ident, "content": short}),
)
chat_body = st.fixed_dictionaries(
    {"model": st.just(""), "messages": st.lists(chat_message, min_size=1, max_size=6)}
)

response_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": short}),
    st.fixed_dictionaries(
        {"type": st.just("function_call"), "call_id": ident, "name": ident, "arguments": short}
    ),
    st.fixed_dictionaries(
        {"type": st.just("function_call_output"), "call_id": ident, "output": short}
    ),
    st.fixed_dictionaries(
        {"type": st.just("reasoning")},
        optional={"id": ident, "encrypted_content": st.one_of(short, st.just(NUMBER))},
    ),
    st.fixed_dictionaries(  # an item the proxy does not know: its JSON, its type in its name
        {"type": st.text("xyz_", min_size=1, max_size=80)}, optional={"n": value}
    ),
)
responses_body = st.fixed_dictionaries(
    {"model": st.just(""), "input": st.lists(response_item, min_size=1, max_size=8)},
    optional={"instructions": short, "store": st.just(False)},
)

user_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": short}),
    st.fixed_dictionaries(
        {"type": st.just("tool_result"), "tool_use_id": ident},
        optional={
            "content": st.one_of(
                short, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": short}))
            )
        },
    ),
    st.fixed_dictionaries({"type": st.just("x")}),
)
assistant_block = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": short}),
    st.fixed_dictionaries(
        {"type": st.just("tool_use"), "id": ident, "name": ident, "input": json_object}
    ),
    st.fixed_dictionaries({"type": st.just("thinking")}, optional={"signature": short}),
    st.fixed_dictionaries({"type": st.just("redacted_thinking")}, optional={"data": short}),
)
turn = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant"]), "content": short}),
    st.fixed_dictionaries(
        {"role": st.just("user"), "content": st.lists(user_block, min_size=1, max_size=4)}
    ),
    st.fixed_dictionaries(
        {"role": st.just("assistant"), "content": st.lists(assistant_block, min_size=1, max_size=4)}
    ),
)
messages_body = st.fixed_dictionaries(
    {"model": st.just(""), "messages": st.lists(turn, min_size=1, max_size=6)},
    optional={
        "system": st.one_of(
            short, st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": short}))
        )
    },
)

BODIES = {"chat": chat_body, "responses": responses_body, "messages": messages_body}


def parsed(wire: str, raw: bytes) -> ClientRequest:
    request = WIRE_FORMATS[wire].parse(raw, ParseContext(KnownMessages(), RecentBodies()))
    assert isinstance(request, ClientRequest)
    return request


@pytest.mark.parametrize("wire", sorted(BODIES))
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_no_message_holds_more_text_than_its_body_allows(wire: str, data: st.DataObject) -> None:
    raw = body_bytes(data.draw(BODIES[wire]))
    request = parsed(wire, raw)
    assert max(map(text_size, request.messages)) <= TEXT_PER_BODY_BYTE * len(raw)


def events_of(request: ClientRequest, limit: int, size: int) -> list[dict[str, Any]]:
    count = len(request.messages)
    chain = [f"h{n}" for n in range(count)]
    events = message_events(
        request.messages,
        chain,
        "root",
        0,
        log_content=True,
        now=0.0,
        content_limit=limit,
        body_bytes=size,
    )
    return [event.event for event in events]


@pytest.mark.parametrize("wire", sorted(BODIES))
@settings(max_examples=50, deadline=None)
@given(data=st.data(), limit=st.integers(1, 400))
def test_a_body_spared_the_measure_logs_what_a_measured_one_does(
    wire: str, data: st.DataObject, limit: int
) -> None:
    raw = body_bytes(data.draw(BODIES[wire]))
    request = parsed(wire, raw)
    assert events_of(request, limit, len(raw)) == events_of(request, limit, 0)


def test_a_body_over_half_the_limit_has_its_messages_measured() -> None:
    raw = body_bytes({"model": "m", "messages": [{"role": "user", "content": "x" * 600}]})
    request = parsed("chat", raw)
    assert "message" not in events_of(request, 599, len(raw))[0]
    assert "message" in events_of(request, 2 * len(raw), len(raw))[0]
