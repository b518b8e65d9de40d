"""What a wire format is: everything the proxy knows of one API, behind one interface.

A ``WireFormat`` is chosen once, by the route the request came in on, and carried by the
``ClientRequest`` it parses. It owns the API's parsing (its body into chat-shaped messages for
the shared core), writing a surface back as the API's body, the upstream path, the answer cap
field, whether the provider stores answers by default, the shape of the errors its clients
read, the API's family (``ApiFamily``: its default upstream, credentials and cache prices),
the header that names a conversation, the summary call (its cache-safe body in the client's
own format, the body rebuilt from the chat form, and the reading of the answer), and, for an
API also served over a WebSocket, how a frame becomes a request (``SocketDialect``). The
adapters are ``formats.chat``, ``formats.responses`` and ``formats.anthropic``;
``formats.wire_formats`` lists them. Code outside ``formats`` knows a format by this interface
alone (an import-linter contract).

Two readings are deliberately not the format's: the usage an answer reports
(``formats.usage``) and whether an error is a context overflow (``metering.overflow``). Their
shape is the upstream's, not the client's: an OpenAI-compatible gateway in front of Claude
answers a chat request with Anthropic's overflow wording, and Anthropic's own
OpenAI-compatible endpoint reports chat usage. Each is read by one function that knows every
provider's shape, whatever format the request came in.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.frozen import frozen
from compaction_proxy.parsing.recent_bodies import RecentBodies

if TYPE_CHECKING:
    from compaction_proxy.conversation.surface import Surface
    from compaction_proxy.formats.answer_edits import AnswerEdit
    from compaction_proxy.formats.asked_compaction import AskedCompaction, ClearedToolUses
    from compaction_proxy.formats.request import ClientRequest, ProviderHeld
    from compaction_proxy.formats.sealed_checkpoints import MadeCompaction


@frozen
class ParseContext:
    """What parsing a body may use besides its bytes: the messages this process validated
    (``KnownMessages``), the bodies it parsed a moment ago (``RecentBodies``), the client's
    name for the conversation, and Anthropic's ``anthropic-beta`` headers."""

    known: KnownMessages
    recent: RecentBodies
    session_id: str | None = None
    beta: Sequence[str] = ()  # every ``anthropic-beta`` header value


# The text of a summary call's parsed answer and whether it was cut at its cap; ValueError
# when the answer is not one of the format's.
SummaryReader = Callable[[Any], tuple[str, bool]]


@frozen
class SocketRequest:
    """A frame as the HTTP request it stands for: the body, the body's JSON as sent, and the
    JSON of its input's items (comma-separated) when it was written piece by piece, so that a
    frame continuing its response writes only what is new."""

    body: dict[str, Any]
    raw: bytes
    input_json: bytes | None = None


@frozen
class SocketResponse:
    """A socket connection's last response: its id, the whole input it answered, its output
    (what a later frame naming it continues from), and the input's items as JSON where known
    (``SocketRequest.input_json``)."""

    response_id: str
    input: list[Any]
    output: list[Any]
    input_json: bytes | None = None


class FrameRefused(ValueError):
    """A WebSocket frame that is no request: why, in the provider's words."""


class SocketDialect(Protocol):
    """How an API served over a WebSocket maps onto its HTTP endpoint (pure): each request
    frame is served as one streamed request, and the answer's events go back a frame each."""

    def request_body(self, frame: Any) -> dict[str, Any]:
        """The request a parsed frame stands for; ``FrameRefused`` for any other frame."""
        ...

    def http_request(self, body: dict[str, Any], last: SocketResponse | None) -> SocketRequest:
        """``body`` as the streamed HTTP request it asks for, given the connection's last
        response."""
        ...

    def answered_here(self, body: dict[str, Any]) -> list[dict[str, Any]] | None:
        """The events answering ``body`` without the upstream, if it asks for no answer."""
        ...

    def may_end(self, data: bytes) -> bool:
        """Whether an event with this data may end the answer, read as a client reads it (its
        JSON, not its SSE name): only those are parsed (``ends``, ``continued_by``), every
        other passes as it came."""
        ...

    def ends(self, event: dict[str, Any]) -> bool:
        """Whether ``event`` ends the answer to a frame (a client waits for no more)."""
        ...

    def continued_by(self, event: dict[str, Any], sent: SocketRequest) -> SocketResponse | None:
        """The response a later frame may continue from, when ``event`` ends one; ``sent``:
        the request it answered."""
        ...

    def error_event(self, status: int, body: Any, headers: Mapping[str, str]) -> dict[str, Any]:
        """An answer that is not a stream (``body``: its JSON, or its text; ``headers``:
        lower-cased) as the one event a socket client reads it as."""
        ...


# OpenAI's request fields that steer which cache a request reads, where it writes and how long
# it keeps it (chat and Responses alike): a cache-safe summary call carries them as sent.
PROMPT_CACHE_OPTIONS = ("prompt_cache_key", "prompt_cache_retention", "prompt_cache_options")
# Failures of a cache-safe summary call after which the rebuilt one is made: no text (the
# model, offered the client's tools, answered with a call), a body refused, or a summary cut or
# refused for its length (the client's thinking budget took its share).
REBUILT_AFTER = frozenset({"empty", "malformed", "http_400", "length", "overflow"})


@frozen
class SummaryPost:
    """One summary call in one format: where it goes, its body, how its answer is read; for a
    cache-safe call, the failures after which the rebuilt one is made (``rebuilt_after``)."""

    path: str
    body: dict[str, Any]
    read: SummaryReader
    headers: Mapping[str, str] = field(default_factory=dict)  # set unless the client sent them
    rebuilt_after: frozenset[str] = REBUILT_AFTER


class WireFormat(ABC):
    """One API's adapter (see the module's docstring). Instances are stateless singletons."""

    name: ClassVar[str]  # "chat", "responses", "messages": metric labels, the log's ``api``
    family: ClassVar[ApiFamily]
    upstream_path: ClassVar[str]
    answer_cap_fields: ClassVar[tuple[str, ...]]  # first present positive integer wins
    stored_by_default: ClassVar[bool]  # ``store`` when the body does not say
    session_headers: ClassVar[tuple[str, ...]] = ()  # read after ``X-Session-Id``
    # Whether the provider reads a cached prefix only where an earlier prompt set a breakpoint
    # (Anthropic's), not wherever prompts share one: a cache-safe summary call then reads
    # through to such a place (``compaction.planning.ReadThrough``).
    caches_at_breakpoints: ClassVar[bool] = False
    socket: ClassVar[SocketDialect | None] = None  # served over a WebSocket as well
    # Request fields naming the end user a request is made for, with the type the API takes
    # (OpenAI's ``safety_identifier`` and ``user``, Anthropic's ``metadata.user_id``): a summary
    # call of that user's conversation to the same upstream names them too (``service.prepare``).
    end_user_fields: ClassVar[tuple[tuple[str, type], ...]] = (
        ("safety_identifier", str),
        ("user", str),
    )

    @abstractmethod
    def parse(self, raw: bytes, context: ParseContext) -> ClientRequest | ProviderHeld:
        """The body as a request for the shared core, or, when the provider holds the
        history (``ProviderHeld``), as what is relayed as sent. Raises ``BadRequest``."""

    @abstractmethod
    def payload(self, request: ClientRequest, surface: Surface) -> bytes:
        """The client's body with only its conversation replaced by ``surface``; every other
        field, and every message the surface keeps, as sent."""

    def cache_safe_summary(
        self, request: ClientRequest, prefix: Surface, body: dict[str, Any]
    ) -> SummaryPost | None:
        """The summary call in the client's own format, starting as its next request would
        (so the provider's cache serves its prefix): ``prefix`` is the surface from the head
        to the span's end, exactly as forwarded, ``body`` the chat-form summary request (its
        model, cap and instruction). None when it cannot be written."""
        return None

    def asks_for_compaction(self, body: dict[str, Any]) -> bool:
        """Whether the body asks for its history compacted in place of an answer (a
        Responses ``compaction_trigger``)."""
        return False

    def asked_compaction(self, body: dict[str, Any]) -> AskedCompaction | None:
        """What the body asks the provider to compact or clear on the way (Responses'
        ``context_management`` compaction, Anthropic's ``context_management.edits``); None
        when nothing. Raises ``BadRequest`` for an option the API would refuse."""
        return None

    def without_asked_compaction(self, request: ClientRequest) -> bytes:
        """The body of ``request`` without that option, for an upstream that lacks it."""
        return request.raw

    def opened_checkpoints(self, body: Any, opened: Callable[[str], str]) -> dict[str, Any] | None:
        """``body`` with each sealed checkpoint the proxy gave the client replaced by the
        checkpoint, ``opened(token)`` giving its text (``ForgedCheckpoint`` when the token
        does not verify: ``BadRequest`` naming where it was); None when it holds none."""
        return None

    def cleared_as_asked(
        self, payload: bytes, asked: AskedCompaction, cleared: ClearedToolUses | None
    ) -> tuple[bytes, tuple[dict[str, Any], ...]]:
        """``payload`` (what goes upstream) with the clearing ``asked`` that the surface does
        not do (whole turns' parts: calls' inputs, old thinking), and the edits applied, in
        the API's words (``cleared``: the tool uses the surface cleared)."""
        return payload, ()

    def compaction_edit(
        self,
        made: MadeCompaction | None,
        applied: tuple[dict[str, Any], ...],
        asked: AskedCompaction,
    ) -> AnswerEdit | None:
        """The edit that gives the client, with the upstream's answer, what the proxy did for
        ``asked``: the compaction ``made``, the edits ``applied``."""
        return None

    def compaction_answer(self, model: str, made: MadeCompaction, stream: bool) -> bytes:
        """The answer that is the compaction alone (a ``compaction_trigger``, Anthropic's
        ``pause_after_compaction``), as events when ``stream``."""
        raise NotImplementedError(f"{self.name} has no compaction-only answer")

    def error_body(
        self,
        status: int,
        message: str,
        *,
        error_type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ) -> dict[str, Any]:
        """An error the proxy itself answers, as this API's clients (and their SDKs) read
        one: OpenAI's ``{"error": {"message", "type", "param", "code"}}`` unless the format
        says otherwise."""
        return {"error": {"message": message, "type": error_type, "param": param, "code": code}}

    @abstractmethod
    def rebuilt_summary(self, body: dict[str, Any]) -> SummaryPost:
        """The summary call ``body`` (a chat completion) as this format's route takes it."""

    def __repr__(self) -> str:
        return f"<wire format {self.name}>"


def chat_summary_text(answer: Any) -> tuple[str, bool]:
    """A chat completion's text and whether it was cut at its cap (ValueError when it is no
    chat completion)."""
    try:
        choice = answer["choices"][0]
    except (KeyError, IndexError, TypeError) as exc:
        raise ValueError("not a chat completion") from exc
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict | None):
        raise ValueError("not a chat completion")
    if choice.get("finish_reason") == "length":
        return "", True
    content = (choice.get("message") or {}).get("content")
    if isinstance(content, list):
        content = "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return (content if isinstance(content, str) else ""), False


def chat_summary(body: dict[str, Any]) -> SummaryPost:
    """A chat-completion summary call, as an OpenAI-family route takes it."""
    return SummaryPost("/chat/completions", body, chat_summary_text)
