"""The proxy's compaction items (pure): sealed for one tenant, opened only by it, unaltered;
the trigger recognized; ``auto`` relays only where the upstream has the endpoints."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from compaction_proxy.config.native_compaction import serves_compaction
from compaction_proxy.config.settings import Route
from compaction_proxy.formats.compaction_items import (
    TOKEN_PREFIX,
    ForgedItem,
    asks_for_compaction,
    compacted_response,
    is_sealed,
    item_key,
    responses_usage,
    seal,
    trigger_events,
    trigger_response,
    unseal,
)

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

KEY = item_key(b"tenant secret")


def test_an_item_opens_for_its_tenant_to_the_summary_it_carries() -> None:
    item = seal(KEY, "alice", "## Primary Request and Intent\nFix it.", 1_700_000_000)
    assert is_sealed(item) and item["encrypted_content"].startswith(TOKEN_PREFIX)
    assert (
        unseal(KEY, "alice", item["encrypted_content"]) == "## Primary Request and Intent\nFix it."
    )
    assert seal(KEY, "alice", "x", 1)["id"] == seal(KEY, "alice", "x", 1)["id"]


@pytest.mark.parametrize(
    ("key", "tenant"),
    [(KEY, "bob"), (item_key(b"another proxy's secret"), "alice")],
    ids=["another tenant", "another secret"],
)
def test_an_item_does_not_open_for_another_tenant_or_under_another_secret(
    key: bytes, tenant: str
) -> None:
    content = seal(KEY, "alice", "summary", 1)["encrypted_content"]
    with pytest.raises(ForgedItem):
        unseal(key, tenant, content)


@given(st.data())
def test_no_change_to_an_item_opens(data: st.DataObject) -> None:
    content = seal(KEY, "alice", "the summary", 1)["encrypted_content"]
    index = data.draw(st.integers(0, len(content) - 1))
    replacement = data.draw(st.characters(codec="ascii").filter(lambda c: c != content[index]))
    changed = content[:index] + replacement + content[index + 1 :]
    with pytest.raises(ForgedItem):
        unseal(KEY, "alice", changed)


@given(st.text(max_size=200))
def test_made_up_content_never_opens(content: str) -> None:
    with pytest.raises(ForgedItem):
        unseal(KEY, "alice", TOKEN_PREFIX + content)


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


def test_an_openai_made_item_is_not_the_proxys() -> None:
    assert not is_sealed({"type": "compaction", "encrypted_content": "gAAAAB..."})


def test_the_trigger_answer_streams_one_item_and_ends_completed() -> None:
    item = seal(KEY, "alice", "s", 1)
    response = trigger_response("resp_1", "m", 1, item, responses_usage({"prompt_tokens": 9}))
    events = [
        orjson.loads(line[len(b"data: ") :])
        for line in trigger_events(response).splitlines()
        if line.startswith(b"data: ")
    ]
    assert [e["type"] for e in events][-1] == "response.completed"
    assert [e["item"] for e in events if e["type"] == "response.output_item.done"] == [item]
    assert events[-1]["response"]["usage"]["input_tokens"] == 9
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


def test_compact_answers_the_user_messages_then_the_item() -> None:
    item = seal(KEY, "alice", "s", 1)
    items = [
        {"role": "developer", "content": "rules"},
        {"role": "user", "content": "task"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
    ]
    answer = compacted_response("cmp_1", 1, items, item, responses_usage(None))
    assert answer["output"] == [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "task"}]},
        item,
    ]


@pytest.mark.parametrize(
    ("base_url", "mode", "served"),
    [
        ("https://api.openai.com/v1", "auto", False),  # the upstream has them: relayed
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
