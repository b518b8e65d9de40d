"""What one attempt of a request sends upstream (immutable), and its status.

A request is forwarded once, and again after an overflow when recovery has the evidence for a
retry (``service.recover``): each attempt is a new ``Forwarded``. What the request writes to
its log after its answer accumulates apart, in its ``service.record.RequestLogEntry``.
"""

from __future__ import annotations

from enum import StrEnum

from compaction_proxy.compaction.planning import CompactionJob
from compaction_proxy.conversation.surface import Surface
from compaction_proxy.formats.answer_edits import AnswerEdit
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.meter import Measurement
from compaction_proxy.store.base import ConversationState


class RequestStatus(StrEnum):
    """``X-Compaction-Status``, and the ``status`` of the log's ``request`` event."""

    NONE = "none"  # the client's messages went as sent
    PRUNED = "pruned"  # prunes alone changed them
    MASKED = "masked"  # old observations cleared to placeholders (and maybe pruned), no checkpoint
    COMPACTED = "compacted"  # the surface carries a checkpoint (new or committed earlier)
    PRECOMPACTING = "precompacting"  # as sent, with a checkpoint on its way in the background
    RECOVERED = "recovered"  # a retry after an overflow, compacted harder
    RESCUED = "rescued"  # the live turn's observations cut: whole, it could never fit
    TRIMMED = "trimmed"  # the oldest agent turns left out for a marker: no summary to be had
    BYPASS = "bypass"  # the store or the proxy failed: the client's bytes as they came


def status_of(surface: Surface) -> RequestStatus:
    """What the header says of a forwarded surface: ``compacted`` whenever it carries a
    checkpoint, this request's or an earlier one's (a 22-message history sent as 6 messages is
    compacted, whoever made the checkpoint); ``masked`` when, without one, old observations
    are cleared; ``pruned`` when prunes alone changed it; ``none`` only when the client's
    messages went as sent."""
    if surface.checkpoints:
        return RequestStatus.COMPACTED
    if surface.masks:
        return RequestStatus.MASKED
    return RequestStatus.PRUNED if surface.prunes else RequestStatus.NONE


@frozen
class Forwarded:
    """The bytes to send and what the response headers say of them; for recovery, the
    compaction job, the state and the surface they were derived from (None on a bypass)."""

    payload: bytes
    status: RequestStatus
    conversation: str | None = None
    generation: int | None = None
    measurement: Measurement | None = None
    tokens_before: int | None = None  # the client's own messages, when the surface changed
    job: CompactionJob | None = None
    state: ConversationState | None = None
    surface: Surface | None = None  # what the payload carries
    # A checkpoint is being prepared in the background (said in the header of a request sent
    # as it came; its log event keeps the status of what was sent).
    precompacting: bool = False
    # An edit to the upstream's answer: a compaction the proxy served (native_compaction).
    answer_edit: AnswerEdit | None = None

    @classmethod
    def bypass(cls, raw: bytes) -> Forwarded:
        """The client's request as it came, nothing recorded."""
        return cls(payload=raw, status=RequestStatus.BYPASS)

    def compaction_headers(self) -> dict[str, str]:
        """The ``X-Compaction-*`` headers of the client's answer."""
        status = self.status
        if self.precompacting and status is RequestStatus.NONE:
            status = RequestStatus.PRECOMPACTING
        headers = {"X-Compaction-Status": status.value}
        if self.conversation is not None:
            headers["X-Compaction-Conversation"] = self.conversation
        if self.generation is not None:
            headers["X-Compaction-Generation"] = str(self.generation)
        if self.measurement is not None:
            headers["X-Compaction-Tokens"] = str(self.measurement.tokens)
        if self.tokens_before is not None:
            headers["X-Compaction-Tokens-Before"] = str(self.tokens_before)
        return headers
