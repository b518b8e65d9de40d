"""Which credential a request carries (pure: a table of headers)."""

from __future__ import annotations

import pytest

from compaction_proxy.security.tenant import api_key_of

BROWSER = "realtime, openai-insecure-api-key.sk-browser"


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({}, ""),
        ({"Authorization": "Bearer sk-a"}, "sk-a"),
        ({"Authorization": "bearer  sk-a "}, "sk-a"),
        ({"Authorization": "Basic abc", "api-key": "az-1"}, "az-1"),
        ({"Authorization": "Bearer sk-a", "Sec-WebSocket-Protocol": BROWSER}, "sk-a"),
        ({"api-key": "az-1", "Sec-WebSocket-Protocol": BROWSER}, "az-1"),
        ({"Sec-WebSocket-Protocol": BROWSER}, "sk-browser"),
        ({"Sec-WebSocket-Protocol": "realtime"}, ""),
        ({"Sec-WebSocket-Protocol": "openai-insecure-api-key."}, ""),  # no key after it
        ({"Sec-WebSocket-Protocol": "openai-beta.realtime-v1"}, ""),
    ],
)
def test_the_credential_is_the_bearer_token_else_api_key_else_a_browsers_subprotocol(
    headers: dict[str, str], key: str
) -> None:
    assert api_key_of(headers) == key
