"""Pass-through metrics are labelled by path template: ids never become label values."""

from __future__ import annotations

import pytest

from compaction_proxy.http.passthrough import path_template


@pytest.mark.parametrize(
    ("path", "template"),
    [
        ("/v1/embeddings", "/v1/embeddings"),
        ("/v1/models/gpt-4o-mini", "/v1/models/{id}"),
        ("/v1/files/file-abc123/content", "/v1/files/{id}/content"),
        ("/v1/responses/resp_123/input_items", "/v1/responses/{id}/input_items"),
        ("/v1/responses/compact", "/v1/responses/compact"),
        ("/v1/batches/batch_1/cancel", "/v1/batches/{id}/cancel"),
        ("/v1/threads/t1/runs/r1/steps", "/v1/threads/{id}/runs/{id}/steps"),
        ("/v1/anything-new/x/y", "/v1/{id}/{id}/{id}"),
        ("/v1/", "/v1/"),
    ],
)
def test_ids_are_replaced_and_kinds_kept(path: str, template: str) -> None:
    assert path_template(path) == template
