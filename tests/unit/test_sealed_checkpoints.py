"""The proxy's sealed checkpoints (pure): sealed for one tenant, opened only by it,
unaltered; the Responses trigger, items and answers; ``auto`` relays only where the upstream
has the endpoints."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.bad_request import BadRequest
from compaction_proxy.formats.responses_compaction import (
    asked_compaction,
    asks_for_compaction,
    compacted_answer,
    compaction_item,
    is_proxy_item,
    opened_items,
    trigger_answer,
    without_compaction_option,
)
from compaction_proxy.formats.sealed_checkpoints import (
    TOKEN_PREFIX,
    ForgedCheckpoint,
    MadeCompaction,
    is_sealed,
    seal,
    sealing_key,
    unseal,
)

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

KEY = sealing_key(b"tenant secret")


def test_a_token_opens_for_its_tenant_to_the_summary_it_carries() -> None:
    token = seal(KEY, "alice", "## Primary Request and Intent\nFix it.", 1_700_000_000)
    assert is_sealed(token) and token.startswith(TOKEN_PREFIX)
    assert unseal(KEY, "alice", token) == "## Primary Request and Intent\nFix it."
    item = compaction_item(token)
    assert is_proxy_item(item) and item["id"] == compaction_item(token)["id"]


@pytest.mark.parametrize(
    ("key", "tenant"),
    [(KEY, "bob"), (sealing_key(b"another proxy's secret"), "alice")],
    ids=["another tenant", "another secret"],
)
def test_a_token_does_not_open_for_another_tenant_or_under_another_secret(
    key: bytes, tenant: str
) -> None:
    with pytest.raises(ForgedCheckpoint):
        unseal(key, tenant, seal(KEY, "alice", "summary", 1))


@given(st.data())
def test_no_change_to_a_token_opens(data: st.DataObject) -> None:
    token = seal(KEY, "alice", "the summary", 1)
    index = data.draw(st.integers(0, len(token) - 1))
    replacement = data.draw(st.characters(codec="ascii").filter(lambda c: c != token[index]))
    with pytest.raises(ForgedCheckpoint):
        unseal(KEY, "alice", token[:index] + replacement + token[index + 1 :])


@given(st.text(max_size=200))
def test_made_up_content_never_opens(content: str) -> None:
    with pytest.raises(ForgedCheckpoint):
        unseal(KEY, "alice", TOKEN_PREFIX + content)


def test_an_item_opens_into_the_checkpoint_and_a_forged_one_is_named() -> None:
    token = seal(KEY, "alice", "s", 1)
    body = {"input": [compaction_item(token), {"role": "user", "content": "go"}]}
    opened = opened_items(body, lambda t: f"<checkpoint {unseal(KEY, 'alice', t)}>")
    assert opened is not None
    assert opened["input"][0]["content"] == [{"type": "input_text", "text": "<checkpoint s>"}]
    with pytest.raises(BadRequest) as refused:
        opened_items(body, lambda t: unseal(KEY, "bob", t))
    assert refused.value.param == "input[0].encrypted_content"
    assert opened_items({"input": [{"role": "user", "content": "go"}]}, str) is None


@pytest.mark.parametrize(
    ("items", "asks"),
    [
        ([{"role": "user", "content": "hi"}, {"type": "compaction_trigger"}], True),
        ([{"type": "compaction_trigger"}, {"role": "user", "content": "hi"}], False),
        ([], False),
        ("compaction_trigger", False),
    ],
)
def test_a_body_asks_for_compaction_when_its_input_ends_with_the_trigger(
    items: Any, asks: bool
) -> None:
    assert asks_for_compaction({"model": "m", "input": items}) is asks


@pytest.mark.parametrize(
    ("entries", "threshold", "left"),
    [
        ([{"type": "compaction", "compact_threshold": 5000}], 5000, None),
        ([{"type": "compaction"}], None, None),
        ([{"type": "compaction", "compact_threshold": True}], None, None),
        ([{"type": "other"}, {"type": "compaction"}], None, [{"type": "other"}]),
    ],
)
def test_the_context_management_option_is_read_and_taken_out(
    entries: list[dict[str, Any]], threshold: int | None, left: Any
) -> None:
    body = {"model": "m", "input": "x", "context_management": entries}
    asked = asked_compaction(body)
    assert asked is not None and asked.threshold == threshold
    assert without_compaction_option(body).get("context_management") == left
    assert asked_compaction({"model": "m", "context_management": [{"type": "other"}]}) is None


def test_an_openai_made_item_is_not_the_proxys() -> None:
    assert not is_proxy_item({"type": "compaction", "encrypted_content": "gAAAAB..."})


def test_the_trigger_answer_streams_one_item_and_ends_completed() -> None:
    made = MadeCompaction("s", seal(KEY, "alice", "s", 1), input_tokens=9)
    stream = trigger_answer("resp_1", "m", 1, made, stream=True)
    events = [
        orjson.loads(line[len(b"data: ") :])
        for line in stream.splitlines()
        if line.startswith(b"data: ")
    ]
    assert [e["type"] for e in events][-1] == "response.completed"
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == [compaction_item(made.token)]
    assert events[-1]["response"]["usage"]["input_tokens"] == 9
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    whole = orjson.loads(trigger_answer("resp_1", "m", 1, made, stream=False))
    assert whole["output"] == done


def test_compact_answers_the_user_messages_then_the_item() -> None:
    made = MadeCompaction("s", seal(KEY, "alice", "s", 1))
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "task"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]
    answer = orjson.loads(compacted_answer("cmp_1", 1, items, made))
    assert answer["output"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]},
        compaction_item(made.token),
    ]


@pytest.mark.parametrize(
    ("base_url", "mode", "served"),
    [
        ("https://api.openai.com/v1", "auto", False),  # the upstream has them: relayed
        ("https://api.anthropic.com/v1", "auto", False),
        ("http://localhost:8000/v1", "auto", True),  # vLLM, Ollama...: served
        ("https://example.openai.azure.com/openai/v1", "auto", True),
        ("https://api.openai.com/v1", "serve", True),
        ("http://localhost:8000/v1", "relay", False),
    ],
)
def test_auto_serves_only_where_the_upstream_lacks_the_endpoints(
    base_url: str, mode: str, served: bool
) -> None:
    route = Route.model_validate({"model": "*", "base_url": base_url, "native_compaction": mode})
    assert serves_compaction(route) is served
