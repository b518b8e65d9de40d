"""The wire formats the proxy serves, by name: one adapter per API (``formats.wire``)."""

from __future__ import annotations

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.formats.anthropic import MESSAGES
from compaction_proxy.formats.chat import CHAT
from compaction_proxy.formats.responses import RESPONSES
from compaction_proxy.formats.wire import WireFormat

__all__ = [
    "CHAT",
    "MESSAGES",
    "RESPONSES",
    "WIRE_FORMATS",
    "family_wire_format",
    "wire_format_named",
]

WIRE_FORMATS: dict[str, WireFormat] = {wire.name: wire for wire in (CHAT, RESPONSES, MESSAGES)}


def wire_format_named(name: str | None) -> WireFormat:
    """The format a request was logged in (``RequestLogEntry.api``); chat for a record older
    than the field."""
    return WIRE_FORMATS.get(name or "", CHAT)


def family_wire_format(family: ApiFamily) -> WireFormat:
    """The format that speaks for ``family`` on a path no format parses (a file upload, a
    batch, the model list): its errors are answered in that format's shape."""
    return MESSAGES if family is ApiFamily.ANTHROPIC else CHAT
