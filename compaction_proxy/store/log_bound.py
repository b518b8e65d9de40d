"""One conversation's log is bounded in bytes (``log_max_bytes``), in either store.

A client may send one conversation messages of any size, as many as it likes: past the bound,
its oldest logged events are dropped. The log is a record for operators (the admin timeline);
compaction works from the request itself and the replacement records, so nothing a request
needs is lost. Each drop is counted; the first for a conversation is logged.
"""

from __future__ import annotations

import logging

from compaction_proxy.metrics import LOG_BYTES_DROPPED

log = logging.getLogger(__name__)


def log_bytes_dropped(conversation: str, dropped: int, first: bool) -> None:
    """Count ``dropped`` bytes of ``conversation``'s oldest events; said when ``first``."""
    LOG_BYTES_DROPPED.inc(dropped)
    if first:
        log.warning(
            "conversation %s outgrew its log's byte bound: its oldest events are dropped "
            "(%d bytes now; log_max_bytes)",
            conversation,
            dropped,
        )
