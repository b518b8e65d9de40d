"""The access log: one line a request, aiohttp's own (its default format, ``%a %t "%r" %s %b
"%{Referer}i" "%{User-Agent}i"``), written for less.

aiohttp's ``AccessLogger`` compiles any format into a list of methods, calls each for every
request, builds a dictionary of ``extra`` values for the record, and formats the request's
start time through ``datetime`` every time: about 1,400 bytecodes a request at the default
``INFO`` level, 8 % of a request's bytecodes on the in-process store (docs/perf.md). The
format is fixed here, so the line is one format call, the start time's text is made once a
second, and the record carries the line alone (the proxy's log format shows nothing else of
it).

A WebSocket frame's request reaches this process over loopback (``http.socket_endpoint``):
its line names the client that sent the frame, as the route guard found it vouched for
(``CLIENT_ADDRESS``), not the proxy's own address.
"""

from __future__ import annotations

import logging
import time

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

# Where the route guard leaves the address a loopback request stands for (``ops.app``).
CLIENT_ADDRESS = web.RequestKey("client_address", str)
_LINE = '%s %s "%s %s HTTP/%d.%d" %d %d "%s" "%s"'


class AccessLine(AbstractAccessLogger):
    """aiohttp's default access line for every request (``log_format`` is not read)."""

    __slots__ = ("_second", "_stamp")

    def __init__(self, logger: logging.Logger, log_format: str) -> None:
        super().__init__(logger, log_format)
        self._second = -1
        self._stamp = ""

    @property
    def enabled(self) -> bool:
        """Lines are made only when they are written (aiohttp asks once a connection)."""
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: BaseRequest, response: StreamResponse, elapsed: float) -> None:
        """``elapsed``: the seconds the request took; the line shows when it started."""
        try:
            address = request.get(CLIENT_ADDRESS) or request.remote or "-"
            headers, version = request.headers, request.version
            self.logger.info(
                _LINE,
                address,
                self._started(elapsed),
                request.method,
                request.path_qs,
                version.major,
                version.minor,
                response.status,
                response.body_length,
                headers.get("Referer", "-"),
                headers.get("User-Agent", "-"),
            )
        except Exception:  # as aiohttp's: a line that cannot be made never fails a request
            self.logger.exception("Error in logging")

    def _started(self, took: float) -> str:
        """The start time as aiohttp writes it (``[07/Dec/2026:21:22:27 +0000]``, local
        time), its text made again only when the second changes."""
        second = int(time.time() - took)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("[%d/%b/%Y:%H:%M:%S %z]", time.localtime(second))
        return self._stamp
