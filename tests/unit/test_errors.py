"""The client's answer when the upstream fails, and the error shape each wire format writes
(tables)."""

from __future__ import annotations

import aiohttp
import orjson
import pytest

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.formats.wire_formats import CHAT, MESSAGES, RESPONSES, family_wire_format
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


@pytest.mark.parametrize(
    ("status", "anthropic_type"),
    [
        (400, "invalid_request_error"),
        (401, "authentication_error"),
        (403, "permission_error"),
        (404, "not_found_error"),
        (408, "invalid_request_error"),
        (413, "request_too_large"),
        (429, "rate_limit_error"),
        (500, "api_error"),
        (502, "api_error"),
        (503, "api_error"),
        (504, "timeout_error"),
        (529, "overloaded_error"),
    ],
)
def test_each_format_writes_the_error_its_clients_read(status: int, anthropic_type: str) -> None:
    said = {"error_type": "upstream_error", "param": "model", "code": "upstream_unavailable"}
    for wire in (CHAT, RESPONSES):
        assert wire.error_body(status, "It failed.", **said) == {
            "error": {
                "message": "It failed.",
                "type": "upstream_error",
                "param": "model",
                "code": "upstream_unavailable",
            }
        }
    assert MESSAGES.error_body(status, "It failed.", **said) == {
        "type": "error",
        "error": {"type": anthropic_type, "message": "It failed."},
    }


def test_a_path_no_format_parses_answers_in_its_familys_format() -> None:
    assert family_wire_format(ApiFamily.OPENAI) is CHAT
    assert family_wire_format(ApiFamily.ANTHROPIC) is MESSAGES
    answer = upstream_failed("https://api.anthropic.com/v1", TimeoutError(), wire=MESSAGES)
    body = orjson.loads(answer.body)  # type: ignore[arg-type]
    assert answer.status == 504 and body["error"]["type"] == "timeout_error"
