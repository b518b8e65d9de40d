"""What a summary call takes from the client's request: credentials, query string and the end
user it names go only where the request went (pure: a table of routes)."""

from __future__ import annotations

import pytest

from compaction_proxy.config.settings import Route
from compaction_proxy.security.credentials import (
    operator_query,
    summary_call_fields,
    summary_call_headers,
    summary_call_query,
)

OPENAI = Route(model="gpt-*", base_url="https://api.openai.com/v1")  # type: ignore[arg-type]
ALSO_OPENAI = Route(model="o*", base_url="https://api.openai.com/v1")  # type: ignore[arg-type]
ELSEWHERE = Route(
    model="cheap-*",
    base_url="https://summaries.example.com/v1",  # type: ignore[arg-type]
    api_key_env="SUMMARY_KEY",
)
CLIENT = {
    "Authorization": "Bearer sk-client",
    "OpenAI-Organization": "org-1",
    "X-Trace-Id": "t-1",
    "Cookie": "a=b",
}


@pytest.mark.parametrize(
    ("summary_route", "headers", "query"),
    [
        (
            ALSO_OPENAI,
            {"Authorization": "Bearer sk-client", "OpenAI-Organization": "org-1"},
            "api-version=2025-04-01-preview&key=k",
        ),
        (ELSEWHERE, {"OpenAI-Organization": "org-1"}, ""),
    ],
)
def test_a_summary_call_carries_the_clients_credentials_and_query_only_to_its_host(
    summary_route: Route, headers: dict[str, str], query: str
) -> None:
    assert summary_call_headers(CLIENT, OPENAI, summary_route) == headers
    assert summary_call_query("api-version=2025-04-01-preview&key=k", OPENAI, summary_route) == (
        query
    )


OPENAI_END_USER = (("safety_identifier", str), ("user", str))
ANTHROPIC_END_USER = (("metadata", dict),)


@pytest.mark.parametrize(
    ("body", "fields", "summary_route", "carried"),
    [
        (
            {"model": "gpt-5", "safety_identifier": "u-1", "user": "alice", "stream": True},
            OPENAI_END_USER,
            ALSO_OPENAI,
            {"safety_identifier": "u-1", "user": "alice"},
        ),
        ({"safety_identifier": "u-1", "user": "alice"}, OPENAI_END_USER, ELSEWHERE, {}),
        ({"model": "gpt-5"}, OPENAI_END_USER, ALSO_OPENAI, {}),
        # A value of a type the API refuses stays the client's own request's trouble.
        ({"safety_identifier": 7, "user": ["a"]}, OPENAI_END_USER, ALSO_OPENAI, {}),
        (
            {"metadata": {"user_id": "user_1_session_2"}},
            ANTHROPIC_END_USER,
            ALSO_OPENAI,
            {"metadata": {"user_id": "user_1_session_2"}},
        ),
        ({"metadata": "user_1"}, ANTHROPIC_END_USER, ALSO_OPENAI, {}),
    ],
)
def test_a_summary_call_names_the_clients_end_user_only_to_its_host(
    body: dict[str, object],
    fields: tuple[tuple[str, type], ...],
    summary_route: Route,
    carried: dict[str, object],
) -> None:
    assert summary_call_fields(body, fields, OPENAI, summary_route) == carried


@pytest.mark.parametrize(
    ("given", "query"),
    [
        ("", ""),
        ("api-version=2024-10-21", "api-version=2024-10-21"),
        ("?api-version=2024-10-21&x=%20y", "api-version=2024-10-21&x=%20y"),
        ("  a=b  ", "a=b"),
        ("a=b c", None),  # a space is not sent in a URL as it is
        ("a=b#frag", None),  # a fragment is never sent
        ("a=\u00e9", None),
        ("a=b\r\nHost: evil", None),
    ],
)
def test_an_operators_query_is_taken_only_when_it_is_a_valid_url_query(
    given: str, query: str | None
) -> None:
    assert operator_query(given) == query
