"""The client's answer when the upstream fails, in OpenAI's error shape (a table)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from compaction_proxy.http.errors import upstream_failed


@pytest.mark.parametrize(
    ("failure", "status", "code", "says"),
    [
        (TimeoutError(), 504, "upstream_timeout", "did not answer in time"),
        # both kinds at once
        (aiohttp.ServerTimeoutError("read"), 504, "upstream_timeout", "did not answer in time"),
        (aiohttp.ServerDisconnectedError(), 502, "upstream_unavailable", "could not be reached"),
        (aiohttp.ClientPayloadError("cut"), 502, "upstream_unavailable", "not valid HTTP"),
        (
            aiohttp.ClientResponseError(None, (), status=400, message="Invalid chunk size"),  # type: ignore[arg-type]
            502,
            "upstream_unavailable",
            "not valid HTTP",
        ),
    ],
)
def test_a_timeout_is_a_504_and_any_other_failure_a_502(
    failure: BaseException, status: int, code: str, says: str
) -> None:
    answer = upstream_failed("https://api.example.com/v1", failure)
    assert answer.status == status
    assert answer.body is not None
    error = orjson.loads(answer.body)["error"]  # type: ignore[arg-type]
    assert error["type"] == "upstream_error" and error["code"] == code
    assert says in error["message"]
    assert set(error) == {"message", "type", "param", "code"}
