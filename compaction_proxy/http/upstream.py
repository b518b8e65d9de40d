"""Talking to the upstream: the client's URL and the answer's headers, relaying answers,
noting usage.

The proxy passes the upstream's answer through untouched: status, body bytes and content type,
plus its useful headers (``x-request-id``, rate limits, ...). Only hop-by-hop and framing
headers are dropped, since aiohttp re-frames the body it writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import orjson
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from compaction_proxy.formats.answer_edits import EventEditor
from compaction_proxy.formats.usage import usage_in
from compaction_proxy.security.outbound import HOP_BY_HOP, upstream_url, without
from compaction_proxy.upstream_seam import UpstreamAnswer, UpstreamBroke

# The client session decompresses, so length and encoding no longer describe the bytes we write.
_NOT_FORWARDED_DOWN = HOP_BY_HOP | {"content-length", "content-encoding"}


def client_query(request: web.BaseRequest) -> str:
    """The query string of the client's request, exactly as it encoded it ("" for none)."""
    return request.raw_path.partition("?")[2]


def same_path_upstream_url(base: str, request: web.BaseRequest) -> URL:
    """``base`` + the client's path after ``/v1`` and its query, as the client encoded them
    (a path the proxy relays without reading it)."""
    path, _, query = request.raw_path.partition("?")
    return upstream_url(base, path.removeprefix("/v1"), query)


def client_headers(upstream: UpstreamAnswer) -> CIMultiDict[str]:
    return without(upstream.headers, _NOT_FORWARDED_DOWN)


def is_event_stream(upstream: UpstreamAnswer) -> bool:
    return upstream.content_type == "text/event-stream"


# Records created objects as the caller's (``http.ownership``).
Claim = Callable[[Sequence[str]], Awaitable[None]]


class UsageScanner:
    """Watches SSE bytes go by and keeps the last ``usage`` object a ``data:`` line carried.

    Linear in the stream, however it is cut: the pieces of a line are joined once, when it
    ends (an upstream may stream one line of megabytes, a base64 image say, in thousands of
    chunks). A line that is no ``data:`` line, or longer than ``MAX_LINE_BYTES``, is not kept.
    Lines end with LF, CRLF or CR, as SSE allows. Only lines that mention usage are parsed.
    """

    MAX_LINE_BYTES = 64 * 1024 * 1024

    # Events after which an answer is whole: a client may leave at once (Codex does, at
    # ``response.completed``), and has its answer all the same.
    TERMINAL_EVENTS = (b'"response.completed"', b'"response.incomplete"', b'"message_stop"')

    def __init__(self, wants_created: bool = False) -> None:
        self._line: list[bytes] = []  # the pieces of the line not ended yet
        self._line_size = 0
        self._is_data = False  # that line is known to start with "data:"
        self._skipping = False  # that line is not kept
        self.usage: dict[str, Any] | None = None
        self.finished = False  # a terminal event, or chat's usage chunk or [DONE], went by
        # With ``wants_created``, the ids of what the stream creates, not yet taken
        # (``take_created``): its first event names the response or chat completion, its
        # terminal event the output items a later Responses input may name.
        self._created: list[str] = []
        self._found: set[str] = set()  # every id found, taken or not
        self._wants_created = wants_created
        self._first = wants_created

    def feed(self, chunk: bytes) -> None:
        end = max(chunk.rfind(b"\n"), chunk.rfind(b"\r"))
        if end < 0:
            self._hold(chunk)
            return
        lines = chunk[:end].splitlines() or [b""]
        self._hold(lines[0])
        self._end_line()
        for line in lines[1:]:
            self._scan(line)
        if end + 1 < len(chunk):
            self._hold(chunk[end + 1 :])

    def close(self) -> None:
        self._end_line()

    def _hold(self, piece: bytes) -> None:
        if self._skipping or not piece:
            return
        self._line.append(piece)
        self._line_size += len(piece)
        if not self._is_data:
            # Undecided, the line holds under 5 bytes before this piece: a cheap join.
            start = b"".join(self._line)[:5]
            self._is_data = start == b"data:"
            if not b"data:".startswith(start):
                self._skip()
        if self._line_size > self.MAX_LINE_BYTES:
            self._skip()

    def _skip(self) -> None:
        self._line, self._line_size, self._skipping = [], 0, True

    def _end_line(self) -> None:
        if not self._skipping and self._line:
            self._scan(b"".join(self._line))
        self._line, self._line_size, self._is_data, self._skipping = [], 0, False, False

    def _scan(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        terminal = line[5:].strip() == b"[DONE]" or any(e in line for e in self.TERMINAL_EVENTS)
        if terminal:
            self.finished = True
        first, self._first = self._first, False
        ends_created = terminal and self._wants_created
        if b'"usage"' not in line and not first and not ends_created:
            return
        try:
            event = orjson.loads(line[5:].strip())
        except orjson.JSONDecodeError:
            return
        if first or ends_created:
            found = [i for i in created_ids(event) if i not in self._found]
            self._found.update(found)
            self._created += found
        usage = usage_in(event)
        if usage is not None:
            # Messages streams the prompt's usage first (``message_start``) and the answer's
            # last (``message_delta``): the later adds to the earlier.
            earlier = self.usage
            if earlier is not None and usage.get("prompt_tokens") is None:
                usage = {**earlier, **usage, "prompt_tokens": earlier.get("prompt_tokens")}
            self.usage = usage
            # Chat sends its usage in a last chunk of its own (no choices), then [DONE].
            if isinstance(event, dict) and event.get("choices") == []:
                self.finished = True

    def take_created(self) -> list[str]:
        """The ids of what the stream creates seen since the last call."""
        taken, self._created = self._created, []
        return taken


# Stream events that carry the whole response: the first, and those that end it.
_WHOLE_RESPONSE_EVENTS = ("response.created", "response.completed", "response.incomplete")


def created_ids(answer: Any) -> list[str]:
    """The ids of what an answer creates: the response or chat completion (a whole answer, a
    chat stream's chunk, a Responses stream's event carrying the response), then the output
    items a Responses answer holds (which a later input may name by ``item_reference``)."""
    if not isinstance(answer, dict):
        return []
    if answer.get("type") in _WHOLE_RESPONSE_EVENTS and isinstance(answer.get("response"), dict):
        answer = answer["response"]
    found = answer.get("id")
    ids = [found] if isinstance(found, str) else []
    output = answer.get("output")
    if ids and isinstance(output, list):
        ids += [i["id"] for i in output if isinstance(i, dict) and isinstance(i.get("id"), str)]
    return ids


async def claim_created(claim: Claim, answer: bytes) -> None:
    """Claim what a whole JSON answer creates, if it names anything."""
    try:
        created = created_ids(orjson.loads(answer))
    except orjson.JSONDecodeError:
        return
    if created:
        await claim(created)


class ClientGone(Exception):
    """The client went away while its answer (``response``, already started) was written;
    ``answered`` when it had the whole answer by then (it left after the terminal event)."""

    def __init__(self, response: web.StreamResponse, answered: bool = False) -> None:
        super().__init__("the client went away")
        self.response = response
        self.answered = answered


class UpstreamCut(Exception):
    """The upstream broke off an answer already being relayed (its connection cut, a read
    timed out): the client's connection is cut too, as the only signal left once bytes are
    out. The upstream's failure, not the client's."""

    def __init__(self, response: web.StreamResponse, cause: BaseException) -> None:
        super().__init__(f"the upstream cut the answer off: {type(cause).__name__}")
        self.response = response
        self.cause = type(cause).__name__


async def _next_chunk(
    upstream: UpstreamAnswer, response: web.StreamResponse, scanner: UsageScanner
) -> bytes:
    """The upstream's next bytes. aiohttp cancels a handler whose client has gone: one that
    went after the answer's terminal event had its whole answer, so the cancellation is taken
    back and the request ends as answered (``ClientGone(answered=True)``)."""
    try:
        return await upstream.next_chunk()
    except UpstreamBroke as broke:
        raise UpstreamCut(response, broke.cause) from broke
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if not scanner.finished or task is None:
            raise
        task.uncancel()
        raise ClientGone(response, answered=True) from None


def cut_off(request: web.BaseRequest) -> None:
    """Cut the client's connection mid-answer, so it sees the answer end short (a clean end
    would pass a truncated answer off as whole)."""
    if request.transport is not None:
        request.transport.abort()


async def relay_stream(
    request: web.Request,
    upstream: UpstreamAnswer,
    headers: CIMultiDict[str],
    scanner: UsageScanner,
    claim: Claim | None = None,
    editor: EventEditor | None = None,
) -> web.StreamResponse:
    """Write the upstream's SSE bytes to the client as they arrive, chunk by chunk; with
    ``claim``, what the stream creates is claimed before the client reads of it, so its next
    request can name it.

    The upstream breaking off is ``UpstreamCut``; a failure writing to the client is
    ``ClientGone``: the two are never confused. With ``editor``, the client gets the events
    as it edits them (``formats.answer_edits``); usage is read from the upstream's own."""
    response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers=headers)
    try:
        await response.prepare(request)
    except ConnectionError as exc:
        raise ClientGone(response) from exc
    while chunk := await _next_chunk(upstream, response, scanner):
        answered = scanner.finished  # what the client had before this chunk
        scanner.feed(chunk)
        if claim is not None and (created := scanner.take_created()):
            await claim(created)
        sent = chunk if editor is None else editor.feed(chunk)
        try:
            if sent:
                await response.write(sent)
        except ConnectionError as exc:
            raise ClientGone(response, answered) from exc
    scanner.close()
    try:
        if editor is not None and (rest := editor.close()):
            await response.write(rest)
        await response.write_eof()
    except ConnectionError as exc:
        raise ClientGone(response, scanner.finished) from exc
    return response


def buffered_response(status: int, headers: CIMultiDict[str], body: bytes) -> web.Response:
    return web.Response(status=status, headers=headers, body=body)
