"""``account_endpoints: owned``: which object a request addresses, which ids an answer makes its
caller's, and lists narrowed to the caller's own (pure tables)."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.security.account_endpoints import refused_account_endpoint
from compaction_proxy.security.owned_objects import (
    MAX_OBJECT_ID,
    addressed_object,
    created_objects,
    own_list,
    stateful_objects,
)


@pytest.mark.parametrize(
    ("path", "template", "addressed"),
    [
        ("/v1/files/file-1", "/v1/files/{id}", "file-1"),
        ("/v1/files/file-1/content", "/v1/files/{id}/content", "file-1"),
        ("/v1/vector_stores/vs_1/files/file-2", "/v1/vector_stores/{id}/files/{id}", "vs_1"),
        ("/v1/files", "/v1/files", None),
    ],
)
def test_a_request_addresses_the_object_at_its_first_id(
    path: str, template: str, addressed: str | None
) -> None:
    assert addressed_object(path, template) == addressed


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
        ("/v1/files", "POST", ["not", "an", "object"], []),
        ("/v1/files/{id}", "DELETE", {"id": "file-1", "deleted": True}, []),
    ],
)
def test_an_answer_makes_its_caller_the_owner_of_what_it_creates(
    template: str, method: str, answer: Any, created: list[str]
) -> None:
    assert created_objects(template, method, answer) == created


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"previous_response_id": "resp_1"}, ["resp_1"]),
        ({"conversation": "conv_1"}, ["conv_1"]),
        ({"conversation": {"id": "conv_2"}}, ["conv_2"]),
        ({"previous_response_id": 7}, [""]),  # not an id: owned by nobody
        ({"input": "hi"}, []),
    ],
)
def test_a_stateful_request_names_the_objects_it_builds_on(
    body: dict[str, Any], named: list[str]
) -> None:
    assert stateful_objects(body) == named


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
