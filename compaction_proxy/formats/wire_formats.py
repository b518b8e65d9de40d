"""The wire formats the proxy serves, by name: one adapter per API (``formats.wire``)."""

from __future__ import annotations

from compaction_proxy.formats.anthropic import MESSAGES
from compaction_proxy.formats.chat import CHAT
from compaction_proxy.formats.responses import RESPONSES
from compaction_proxy.formats.wire import WireFormat

__all__ = ["CHAT", "MESSAGES", "RESPONSES", "WIRE_FORMATS", "wire_format_named"]

WIRE_FORMATS: dict[str, WireFormat] = {wire.name: wire for wire in (CHAT, RESPONSES, MESSAGES)}


def wire_format_named(name: str | None) -> WireFormat:
    """The format a request was logged in (``RequestLogEntry.api``); chat for a record older
    than the field."""
    return WIRE_FORMATS.get(name or "", CHAT)
