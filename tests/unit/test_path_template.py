"""Pass-through metrics are labelled by path template and method from fixed tables: neither
ids nor a client's own paths or methods ever become label values."""

from __future__ import annotations

import pytest

from compaction_proxy.http.passthrough import _KINDS, KNOWN_TEMPLATES, method_label, path_template

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/models/gpt-4o-mini", "/v1/models/{id}"),
        ("/v1/files/file-abc123/content", "/v1/files/{id}/content"),
        ("/v1/responses/resp_123/input_items", "/v1/responses/{id}/input_items"),
        ("/v1/responses/compact", "/v1/responses/compact"),
        ("/v1/messages/cache_touch", "/v1/messages/cache_touch"),
        ("/v1/batches/batch_1/cancel", "/v1/batches/{id}/cancel"),
        ("/v1/threads/t1/runs/r1/steps", "/v1/threads/{id}/runs/{id}/steps"),
        ("/v1/anything-new/x/y", "other"),
        ("/v1/", "other"),
        ("/v1/files/a/b/c/d/e/f/g/h", "other"),
        ("/v1/files/" + "x" * 8192, "/v1/files/{id}"),
        ("/v1/threads/runs/runs/runs", "other"),
    ],
)
def test_ids_are_replaced_kinds_kept_and_unknown_shapes_are_other(path: str, template: str) -> None:
    assert path_template(path) == template


@given(st.lists(st.sampled_from([*sorted(_KINDS), "x", "", "{id}"]), max_size=12))
def test_no_path_makes_a_label_outside_the_fixed_table(segments: list[str]) -> None:
    assert path_template("/v1/" + "/".join(segments)) in KNOWN_TEMPLATES | {"other"}


@pytest.mark.parametrize(
    ("method", "label"),
    [("GET", "GET"), ("DELETE", "DELETE"), ("PURGE", "other"), ("X" * 99, "other")],
)
def test_methods_are_labelled_from_a_fixed_list(method: str, label: str) -> None:
    assert method_label(method) == label
