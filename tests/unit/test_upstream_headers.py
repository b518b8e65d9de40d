"""Which of a client's headers go on to the upstream (pure: a table of header sets)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

from compaction_proxy.security.outbound import HOP_HEADER, upstream_headers, without
from compaction_proxy.security.tenant import api_key_of

KEPT = {"Authorization": "Bearer sk-client", "OpenAI-Beta": "assistants=v2", "X-Trace": "t-1"}


@pytest.mark.parametrize(
    ("sent", "dropped"),
    [
        ({"Connection": "keep-alive", "Keep-Alive": "timeout=5"}, {"Connection", "Keep-Alive"}),
        ({"Expect": "100-continue"}, {"Expect"}),
        ({"Host": "proxy:8080", "Content-Length": "12"}, {"Host", "Content-Length"}),
        (
            {"Content-Encoding": "gzip", "Accept-Encoding": "br"},
            {"Content-Encoding", "Accept-Encoding"},
        ),
        ({"Proxy-Connection": "keep-alive", "TE": "trailers"}, {"Proxy-Connection", "TE"}),
        # Named by Connection: this hop's alone, whatever its name.
        ({"Connection": "close, X-Hop-Only", "X-Hop-Only": "1"}, {"Connection", "X-Hop-Only"}),
        ({"connection": "X-HOP-ONLY", "x-hop-only": "1"}, {"connection", "x-hop-only"}),
    ],
)
def test_hop_by_hop_headers_stay_behind_and_the_clients_own_go_on(
    sent: dict[str, str], dropped: set[str]
) -> None:
    headers = upstream_headers(CIMultiDict({**KEPT, **sent}), None)
    expected = {name.lower() for name in {**KEPT, **sent} if name not in dropped}
    assert {name.lower() for name in headers} == expected | {HOP_HEADER.lower()}
    for name, value in KEPT.items():
        assert headers[name] == value


@pytest.mark.parametrize(
    ("anthropic", "sent", "dropped"),
    [
        (False, ("Authorization", "Bearer sk-route"), ("x-api-key", "api-key")),
        (True, ("x-api-key", "sk-route"), ("Authorization", "api-key")),
    ],
)
def test_a_route_key_replaces_every_client_credential_in_the_formats_own_header(
    monkeypatch: pytest.MonkeyPatch,
    anthropic: bool,
    sent: tuple[str, str],
    dropped: tuple[str, str],
) -> None:
    monkeypatch.setenv("ROUTE_KEY", "sk-route")
    client = {"Authorization": "Bearer sk-client", "x-api-key": "sk-ant", "api-key": "az"}
    headers = upstream_headers(client, "ROUTE_KEY", anthropic=anthropic)
    assert headers.getall(sent[0]) == [sent[1]]
    assert all(name not in headers for name in dropped)


def test_a_client_key_in_x_api_key_is_never_sent_on() -> None:
    headers = upstream_headers({"x-api-key": "cpk-client"}, None, proxy_keys=True)
    assert "x-api-key" not in headers


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        ({"Authorization": "Bearer a", "x-api-key": "b"}, "a"),
        ({"x-api-key": "b"}, "b"),
        ({"api-key": "c", "x-api-key": "b"}, "c"),
        ({}, ""),
    ],
)
def test_the_clients_credential_is_read_from_any_formats_header(
    headers: dict[str, str], key: str
) -> None:
    assert api_key_of(headers) == key


_NAMES = st.sampled_from(["Host", "host", "TE", "X-Trace", "x-trace", "Connection", "Keep-Alive"])
_VALUES = st.sampled_from(["1", "x-trace", "close, X-TRACE", "keep-alive"])


@given(st.lists(st.tuples(_NAMES, _VALUES), max_size=8))
def test_a_copy_keeps_every_header_not_dropped_in_its_order_and_repeats(
    sent: list[tuple[str, str]],
) -> None:
    headers = CIMultiDict(sent)
    dropped = frozenset({"host", "te", "connection", "keep-alive"})
    listed = headers.get("Connection")  # the first one's names: this hop's alone
    named = {token.strip().lower() for token in listed.split(",")} if listed else set()
    kept = [(k, v) for k, v in sent if k.lower() not in dropped | named]
    assert list(without(headers, dropped).items()) == kept
