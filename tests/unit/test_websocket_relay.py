"""What the WebSocket relay passes from one side to the other (pure: tables)."""

from __future__ import annotations

import pytest

from compaction_proxy.http.websocket_relay import (
    close_code_for,
    offered_protocols,
    protocols_to_offer,
)


@pytest.mark.parametrize(
    ("received", "sent"),
    [
        (1000, 1000),
        (1001, 1001),
        (4001, 4001),  # an application's own code
        (None, 1000),  # closed without a code
        (1005, 1000),  # "no status": reserved, never in a close frame
        (1006, 1011),  # dropped without a close frame: the other side hears of an error
        (1015, 1000),
    ],
)
def test_a_close_code_goes_on_unless_no_close_frame_may_carry_it(
    received: int | None, sent: int
) -> None:
    assert close_code_for(received) == sent


@pytest.mark.parametrize(
    ("header", "offered"),
    [
        ("", ()),
        ("realtime", ("realtime",)),
        ("realtime, openai-insecure-api-key.sk-x", ("realtime", "openai-insecure-api-key.sk-x")),
        (" a ,, b ", ("a", "b")),
    ],
)
def test_offered_subprotocols_are_read_in_order(header: str, offered: tuple[str, ...]) -> None:
    assert offered_protocols(header) == offered


@pytest.mark.parametrize(
    ("client_key_goes_on", "offered_upstream"),
    [(True, ("realtime", "openai-insecure-api-key.sk-x")), (False, ("realtime",))],
)
def test_a_browsers_key_subprotocol_goes_on_only_where_its_key_would(
    client_key_goes_on: bool, offered_upstream: tuple[str, ...]
) -> None:
    offered = ("realtime", "openai-insecure-api-key.sk-x")
    assert protocols_to_offer(offered, client_key_goes_on) == offered_upstream
