"""Which of a client's headers go on to the upstream (pure: a table of header sets)."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict

from compaction_proxy.security.outbound import HOP_HEADER, upstream_headers

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
