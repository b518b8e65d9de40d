"""``account_endpoints: owned``: which object a request addresses, which ids an answer makes its
caller's, and lists narrowed to the caller's own (pure tables)."""

from __future__ import annotations

import json
from typing import Any

import orjson
import pytest

from compaction_proxy.security import object_references
from compaction_proxy.security.account_endpoints import refused_account_endpoint
from compaction_proxy.security.object_references import (
    NamedObject,
    find_references,
    named_in_form,
    named_objects,
    scan,
)
from compaction_proxy.security.owned_objects import (
    MAX_OBJECT_ID,
    addressed_objects,
    created_objects,
    own_list,
)

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("path", "template", "addressed"),
    [
        ("/v1/files/file-1", "/v1/files/{id}", ["file-1"]),
        ("/v1/files/file-1/content", "/v1/files/{id}/content", ["file-1"]),
        (
            "/v1/vector_stores/vs_1/files/file-2/content",
            "/v1/vector_stores/{id}/files/{id}/content",
            ["vs_1", "file-2"],  # a vector store's file is a file of the account
        ),
        ("/v1/threads/t_1/runs/run_1/steps/s_1", "/v1/threads/{id}/runs/{id}/steps/{id}", ["t_1"]),
        ("/v1/containers/c_1/files/cf_1", "/v1/containers/{id}/files/{id}", ["c_1"]),
        ("/v1/conversations/c_1/items/i_1", "/v1/conversations/{id}/items/{id}", ["c_1"]),
        ("/v1/fine_tuning/jobs/ft_1/events", "/v1/fine_tuning/jobs/{id}/events", ["ft_1"]),
        ("/v1/files", "/v1/files", []),
    ],
)
def test_a_path_addresses_every_account_object_it_names_not_only_the_first(
    path: str, template: str, addressed: list[str]
) -> None:
    assert addressed_objects(path, template) == addressed


@pytest.mark.parametrize(
    ("template", "method", "answer", "created"),
    [
        ("/v1/files", "POST", {"id": "file-1"}, ["file-1"]),
        ("/v1/files", "GET", {"data": [{"id": "file-1"}]}, []),  # a list creates nothing
        (
            "/v1/uploads/{id}/complete",
            "POST",
            {"id": "upload_1", "file": {"id": "file-9"}},
            ["file-9"],
        ),
        (
            "/v1/batches/{id}",
            "GET",
            {"output_file_id": "file-o", "error_file_id": None},
            ["file-o"],
        ),
        ("/v1/responses", "POST", {"id": "x" * (MAX_OBJECT_ID + 1)}, []),  # no id of the API's
        # A response's output items, which a later input may name (``item_reference``).
        (
            "/v1/responses",
            "POST",
            {"id": "resp_1", "output": [{"id": "rs_1"}, {"id": "msg_1"}, "junk", {"id": 7}]},
            ["resp_1", "rs_1", "msg_1"],
        ),
        ("/v1/responses/{id}", "GET", {"id": "resp_1", "output": [{"id": "msg_1"}]}, ["msg_1"]),
        ("/v1/responses/{id}/input_items", "GET", {"data": [{"id": "msg_0"}]}, ["msg_0"]),
        ("/v1/conversations/{id}/items", "POST", {"data": [{"id": "msg_2"}]}, ["msg_2"]),
        ("/v1/conversations/{id}/items/{id}", "GET", {"id": "msg_3"}, ["msg_3"]),
        ("/v1/files", "POST", ["not", "an", "object"], []),
        ("/v1/files/{id}", "DELETE", {"id": "file-1", "deleted": True}, []),
    ],
)
def test_an_answer_makes_its_caller_the_owner_of_what_it_creates(
    template: str, method: str, answer: Any, created: list[str]
) -> None:
    assert created_objects(template, method, answer) == created


FILE_PART = {"type": "file", "file": {"file_id": "file-a"}}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"previous_response_id": "resp_1"}, [("previous_response_id", "resp_1")]),
        ({"previous_response_id": None}, []),  # null is "none"
        ({"conversation": "conv_1"}, [("conversation", "conv_1")]),
        ({"conversation": {"id": "conv_2"}}, [("conversation", "conv_2")]),
        ({"previous_response_id": 7}, [("previous_response_id", "")]),  # owned by nobody
        ({"input": "hi"}, []),
        # A chat file part, nested in a message's content.
        ({"messages": [{"role": "user", "content": ["x", FILE_PART]}]}, [("file_id", "file-a")]),
        # Responses: an input_file item, file_search and code_interpreter tools.
        (
            {
                "input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f1"}]}],
                "tools": [
                    {"type": "file_search", "vector_store_ids": ["vs_1", "vs_2"]},
                    {"type": "code_interpreter", "container": {"type": "auto", "file_ids": ["f2"]}},
                ],
            },
            [
                ("file_id", "f1"),
                ("vector_store_ids", "vs_1"),
                ("vector_store_ids", "vs_2"),
                ("file_ids", "f2"),
            ],
        ),
        # Anthropic: a document from the Files API, and a container.
        (
            {
                "container": "container_1",
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "document", "source": {"type": "file", "file_id": "f3"}}
                        ],
                    }
                ],
            },
            [("container", "container_1"), ("file_id", "f3")],
        ),
        # Batches, vector stores, fine-tuning.
        ({"input_file_id": "f4", "endpoint": "/v1/chat/completions"}, [("input_file_id", "f4")]),
        ({"name": "s", "file_ids": ["f5"]}, [("file_ids", "f5")]),
        (
            {"training_file": "f6", "validation_file": "f7"},
            [("training_file", "f6"), ("validation_file", "f7")],
        ),
        # Payloads the upstream never reads as references: an agent's own tool input, a
        # schema, metadata, a tool call's arguments.
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [
                            {
                                "type": "tool_use",
                                "id": "t",
                                "name": "read",
                                "input": {"file_id": "mine"},
                            }
                        ],
                    }
                ],
                "tools": [
                    {
                        "name": "read",
                        "input_schema": {"properties": {"file_id": {"type": "string"}}},
                    }
                ],
                "metadata": {"file_id": "label"},
            },
            [],
        ),
    ],
)
def test_a_body_names_every_stored_object_wherever_it_stands(
    body: dict[str, Any], named: list[tuple[str, str]]
) -> None:
    assert named_objects(body) == [NamedObject(param, object_id) for param, object_id in named]
    raw = orjson.dumps(body)
    assert scan(raw).may_name_objects or not named


@pytest.mark.parametrize(
    ("raw", "repeated"),
    [
        (b'{"model": "a", "messages": [], "model": "b"}', "model"),
        (b'{"model": "a", "stream": false, "stream": true}', "stream"),
        (
            b'{"model": "a", "previous_response_id": "r1", "previous_response_id": "r2"}',
            "previous_response_id",
        ),
        (
            b'{"model": "a", "input": [{"type": "input_file", "file_id": "f1", "file_id": "f2"}]}',
            "file_id",
        ),
        # Spelled with escapes: the same key once parsed.
        (b'{"model": "a", "mod\\u0065l": "b"}', "model"),
        (b'{"model": "a", "tools": [{"parameters": {"model": {}}}]}', None),  # other objects
        (b'{"model": "a", "temperature": 1, "temperature": 2}', None),  # read for no decision
        # A naming field twice where nothing is read as a reference (a tool's schema).
        (
            b'{"model": "a", "tools": [{"parameters": {"container": 1, "container": 2}}]}',
            None,
        ),
    ],
)
def test_a_decision_field_given_twice_in_one_object_is_found(
    raw: bytes, repeated: str | None
) -> None:
    assert find_references(raw, orjson.loads(raw)).duplicated == repeated


def test_the_whole_parse_for_repeats_runs_only_where_a_repeat_could_matter(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A tool schema with a parameter named like a naming field costs a scan, not a parse."""
    schema = b'{"model": "a", "tools": [{"parameters": {"properties": {"container": {}}}}]}'
    parsed: list[bytes] = []
    monkeypatch.setattr(object_references, "duplicated_key", lambda raw, _: parsed.append(raw))
    assert find_references(schema, orjson.loads(schema)).named == []
    assert parsed == []
    # A body that does name an object is parsed whole for repeats.
    named = b'{"model": "a", "previous_response_id": "r1"}'
    find_references(named, orjson.loads(named))
    assert parsed == [named]


def test_a_list_keeps_only_the_callers_objects_and_its_cursors_follow() -> None:
    answer = {
        "object": "list",
        "data": [{"id": "a"}, {"id": "b"}, {"id": "c"}, "junk"],
        "first_id": "a",
        "last_id": "c",
        "has_more": True,
    }
    kept = own_list(answer, lambda object_id: object_id in {"b", "c"})
    assert kept == {**answer, "data": [{"id": "b"}, {"id": "c"}], "first_id": "b"}
    assert own_list(answer, lambda _: False)["first_id"] is None
    assert answer["data"][0] == {"id": "a"}  # the answer itself is left as it was


@pytest.mark.parametrize(
    ("template", "method", "refused"),
    [
        ("/v1/files", "GET", False),  # a list: filtered
        ("/v1/files", "POST", False),  # creates: recorded
        ("/v1/files/{id}/content", "GET", False),  # addresses one: checked
        ("/v1/embeddings", "POST", False),
        ("other", "GET", True),  # no known template
        ("/v1/uploads", "GET", True),  # neither a list the API has nor an object
    ],
)
def test_owned_mode_serves_only_what_it_can_keep_apart(
    template: str, method: str, refused: bool
) -> None:
    assert refused_account_endpoint(template, method, True, "owned") is refused


_fields = st.sampled_from(
    [
        b'"file_id":"f1"',
        b'"model":"m"',
        b'"stream":true',
        b'"mod\\u0065l":"x"',
        b'"text":"hi"',
        b'"type":"item_reference"',
        b'"encrypted_content":"e"',
    ]
)
_messages = st.lists(_fields, min_size=1, max_size=3).map(lambda f: b"{" + b",".join(f) + b"}")


@given(
    shared=st.lists(_messages, min_size=1, max_size=5),
    first=st.lists(_messages, max_size=3),
    second=st.lists(_messages, max_size=3),
    top=st.lists(_fields, max_size=2),
)
def test_a_body_scanned_from_where_it_leaves_a_remembered_one_finds_what_a_whole_scan_does(
    shared: list[bytes], first: list[bytes], second: list[bytes], top: list[bytes]
) -> None:
    head = b'{"model":"m","messages":[' + b",".join(shared)
    tail = b"]" + b"".join(b"," + field for field in top) + b"}"
    earlier = head + b"".join(b"," + m for m in first) + tail
    later = head + b"".join(b"," + m for m in second) + tail
    assert scan(later, len(head), scan(earlier)) == scan(later)


def test_a_forms_fields_name_objects_but_its_files_bytes_do_not() -> None:
    raw = (
        b'--b\r\nContent-Disposition: form-data; name="file_id"\r\n\r\nfile-1\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file_id"\r\n\r\nfile-2\r\n'
        b'--b\r\nContent-Disposition: form-data; name="file_id"; filename="x.txt"\r\n\r\n'
        b"file-3\r\n--b--\r\n"
    )
    assert named_in_form(raw, "multipart/form-data; boundary=b") == [
        NamedObject("file_id", "file-1"),
        NamedObject("file_id", "file-2"),
    ]
    # No part to be seen: fails closed (an object nobody owns).
    assert named_in_form(b"not a form", "multipart/form-data; boundary=b") == [
        NamedObject("form", "")
    ]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, ["msg_1"]),
        ({"input": [{"type": "item_reference", "id": 7}]}, [""]),  # owned by nobody
        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, ["rs_1"]),
        ({"input": [{"type": "reasoning", "id": "rs_1", "encrypted_content": None}]}, ["rs_1"]),
        # Carrying its own content, a reasoning item is read as sent.
        ({"input": [{"type": "reasoning", "id": "rs_1", "encrypted_content": "gA"}]}, []),
        ({"input": [{"type": "reasoning", "id": None, "summary": []}]}, []),
        ({"input": [{"type": "reasoning", "summary": []}], "reasoning": {"effort": "low"}}, []),
        # Only top-level input items are items; a chat body has none.
        ({"input": [{"role": "user", "content": [{"type": "item_reference", "id": "m"}]}]}, []),
        ({"messages": [{"role": "assistant", "content": "x", "reasoning": "y"}]}, []),
        ({"input": "item_reference"}, []),
    ],
)
def test_an_input_item_naming_a_stored_item_is_found(
    body: dict[str, Any], named: list[str]
) -> None:
    raw = orjson.dumps(body)
    found = find_references(raw, body)
    assert found.named == [NamedObject("input", object_id) for object_id in named]
    assert found.duplicated is None


def test_items_are_parsed_whole_for_repeats_only_where_they_name_or_the_scan_disagrees(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex's reasoning items carry their content: a pass over the items, no whole parse."""
    parsed: list[bytes] = []
    monkeypatch.setattr(object_references, "duplicated_key", lambda raw, _: parsed.append(raw))
    codex = {
        "input": [{"type": "reasoning", "summary": [], "encrypted_content": "gA"}] * 3,
        "reasoning": {"effort": "high"},
        "include": ["reasoning.encrypted_content"],
    }
    assert find_references(raw := orjson.dumps(codex), codex).named == []
    assert parsed == []
    # "reasoning" standing where no item is: the scan and the parse disagree.
    odd = {"input": [], "tools": [{"parameters": {"properties": {"reasoning": {}}}}]}
    find_references(raw := orjson.dumps(odd), odd)
    assert parsed == [raw]


_item_fields = st.lists(
    st.sampled_from(
        [
            ("type", "item_reference"),
            ("type", "reasoning"),
            ("type", "message"),
            ("type", "custom"),
            ("type", "anthropic"),
            ("id", "theirs"),
            ("id", "mine"),
            ("id", None),
            ("encrypted_content", None),
            ("encrypted_content", "gA"),
            ("skill_id", "their_skill"),
            ("role", "user"),
        ]
    ),
    max_size=6,
)


def _names(body: Any) -> set[str]:
    """What the API reads ``body``'s items and skills to name."""
    found = set()
    for item in body["input"]:
        kind = item.get("type")
        stored_reasoning = kind == "reasoning" and item.get("encrypted_content") is None
        if (kind == "item_reference" or stored_reasoning) and item.get("id") is not None:
            found.add(item["id"])
    for skill in body["container"]["skills"]:
        if skill.get("type") == "custom" and "skill_id" in skill:
            found.add(skill["skill_id"])
    return found


def _objects(objects: list[list[tuple[str, Any]]]) -> bytes:
    return b",".join(
        b"{" + b",".join(orjson.dumps(k) + b":" + orjson.dumps(v) for k, v in fields) + b"}"
        for fields in objects
    )


@given(
    items=st.lists(_item_fields, min_size=1, max_size=4),
    skills=st.lists(_item_fields, max_size=3),
)
def test_what_any_parser_reads_a_body_to_name_is_checked_or_the_body_refused(
    items: list[list[tuple[str, Any]]], skills: list[list[tuple[str, Any]]]
) -> None:
    """Whether a parser keeps the first or the last of a field given twice, every stored item
    and skill it would read the body to name is among those found, or the body is refused."""
    raw = b'{"input":[' + _objects(items) + b'],"container":{"skills":[' + _objects(skills) + b"]}}"
    found = find_references(raw, orjson.loads(raw))
    if found.duplicated is not None:
        return
    keeping_first = json.loads(raw, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    named = {n.object_id for n in found.named}
    assert _names(keeping_first) <= named
    assert _names(orjson.loads(raw)) <= named


ANTHROPIC_SKILL = {"type": "anthropic", "skill_id": "pptx", "version": "latest"}


@pytest.mark.parametrize(
    ("body", "named"),
    [
        # OpenAI: an uploaded skill mounted in a shell tool's container.
        (
            {
                "tools": [
                    {
                        "type": "shell",
                        "environment": {
                            "type": "container_auto",
                            "skills": [{"type": "skill_reference", "skill_id": "skill_1"}],
                        },
                    }
                ]
            },
            ["skill_1"],
        ),
        # Anthropic: a custom skill is the account's, Anthropic's own are nobody's.
        (
            {"container": {"skills": [ANTHROPIC_SKILL, {"type": "custom", "skill_id": "skill_2"}]}},
            ["skill_2"],
        ),
        ({"container": {"skills": [ANTHROPIC_SKILL]}}, []),
        ({"container": {"skills": [{"type": "custom", "skill_id": 3}]}}, [""]),  # nobody's
        ({"container": {"skills": [{"type": [], "skill_id": "s"}]}}, []),  # no type the API has
        # A tool's own parameter named skill_id mounts nothing.
        ({"tools": [{"name": "t", "parameters": {"properties": {"skill_id": {}}}}]}, []),
    ],
)
def test_a_skill_the_account_keeps_is_found_where_it_is_mounted(
    body: dict[str, Any], named: list[str]
) -> None:
    found = find_references(orjson.dumps(body), body)
    assert found.named == [NamedObject("skill_id", skill) for skill in named]
    assert found.duplicated is None


def test_a_skill_type_given_twice_is_a_repeat() -> None:
    """Read as Anthropic's own by a parser keeping the last ``type``, as the account's custom
    skill by one keeping the first."""
    raw = b'{"container":{"skills":[{"type":"custom","type":"anthropic","skill_id":"s"}]}}'
    assert find_references(raw, orjson.loads(raw)).duplicated == "type"


@pytest.mark.parametrize(
    ("separators", "parsed_whole"),
    [
        ((",", ":"), False),  # JavaScript's JSON.stringify, as the Vercel AI SDK writes it
        ((", ", ": "), False),  # Python's json.dumps
        ((" ,", " :"), True),  # any other spelling: the exact parse decides
    ],
)
def test_plain_item_references_need_no_exact_parse(
    monkeypatch: pytest.MonkeyPatch, separators: tuple[str, str], parsed_whole: bool
) -> None:
    """A reference written as the plain two-field object cannot hide a second ``type`` or
    ``id``: its bytes say so, and the whole body is not parsed again for repeats."""
    parsed: list[bytes] = []
    monkeypatch.setattr(object_references, "duplicated_key", lambda raw, _: parsed.append(raw))
    body = {
        "input": [
            {"role": "user", "content": "Read the files."},
            {"type": "item_reference", "id": "msg_1"},
            {"type": "function_call", "call_id": "c1", "name": "bash", "arguments": "{}"},
            {"type": "item_reference", "id": "msg_2"},
        ],
        "store": True,
    }
    raw = json.dumps(body, separators=separators).encode()
    found = find_references(raw, body)
    assert [n.object_id for n in found.named] == ["msg_1", "msg_2"]
    assert parsed == ([raw] if parsed_whole else [])


def test_codexs_client_metadata_names_no_object_and_the_list_is_not_walked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Codex names its own session's ``thread_id`` in ``client_metadata`` on every request:
    a label of the client's, no object of the account. The naming key the scan saw stands
    outside the conversation's list, so the list is not walked."""
    walked: list[Any] = []
    walk = object_references.named_objects
    monkeypatch.setattr(object_references, "named_objects", lambda b: walked.append(b) or walk(b))
    body = {
        "model": "gpt-5.1-codex",
        "input": [{"role": "user", "content": "x"}] * 3,
        "client_metadata": {"session_id": "0199", "thread_id": "0199"},
    }
    assert find_references(orjson.dumps(body), body).named == []
    assert walked == [{k: v for k, v in body.items() if k != "input"}]
    # A naming key inside the list: the list is walked, and the object found.
    named = {**body, "input": [*body["input"], {"role": "user", "content": [FILE_PART]}]}
    assert find_references(orjson.dumps(named), named).named == [NamedObject("file_id", "file-a")]


@given(
    messages=st.lists(_messages, max_size=5),
    top=st.lists(_fields, max_size=3),
    labels=st.lists(_fields, max_size=2),
)
def test_walking_only_outside_the_list_finds_what_the_whole_walk_finds(
    messages: list[bytes], top: list[bytes], labels: list[bytes]
) -> None:
    raw = (
        b'{"messages":['
        + b",".join(messages)
        + b"]"
        + b"".join(b"," + field for field in top)
        + b',"client_metadata":{'
        + b",".join(labels)
        + b"}}"
    )
    body = orjson.loads(raw)
    found = [n for n in find_references(raw, body).named if n.param != "input"]
    assert found == named_objects(body)
