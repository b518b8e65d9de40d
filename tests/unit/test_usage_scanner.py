"""The SSE usage scanner sees the usage chunk however the bytes are split."""

from __future__ import annotations

import pytest

from proxy.upstream import UsageScanner, usage_of_body

STREAM = (
    b'data: {"choices":[{"delta":{"content":"hi"}}],"usage":null}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":3,"total_tokens":15}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 2, 7, 64, len(STREAM)])
def test_usage_chunk_found_at_any_split(size: int) -> None:
    scanner = UsageScanner()
    for i in range(0, len(STREAM), size):
        scanner.feed(STREAM[i : i + size])
    scanner.close()
    assert scanner.usage == {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}


def test_stream_without_usage_leaves_none() -> None:
    scanner = UsageScanner()
    scanner.feed(b'data: {"choices":[],"usage":null}\n\ndata: [DONE]\n\n')
    scanner.close()
    assert scanner.usage is None


@pytest.mark.parametrize(
    ("body", "usage"),
    [
        (b'{"usage": {"prompt_tokens": 5}}', {"prompt_tokens": 5}),
        (b"not json", None),
        (b"[]", None),
        (b'{"usage": null}', None),
    ],
)
def test_usage_of_body(body: bytes, usage: dict[str, int] | None) -> None:
    assert usage_of_body(body) == usage
