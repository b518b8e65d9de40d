"""The access log's line: aiohttp's default one, word for word, made for less; a socket
frame's request named by the client the route guard found vouched for."""

from __future__ import annotations

import logging
import re
import time

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from aiohttp.web_log import AccessLogger
from multidict import CIMultiDict

from compaction_proxy.ops.access_log import CLIENT_ADDRESS, AccessLine

STAMP = re.compile(r"\[(\d\d/\w{3}/\d{4}:\d\d:\d\d:\d\d [+-]\d{4})\]")


@pytest.fixture
def logged(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="test.access")
    return caplog


REQUESTS = [
    ("POST", "/v1/chat/completions", {"User-Agent": "OpenAI/Python 2.1"}, 200, b"{}"),
    ("GET", "/v1/models?limit=2&after=m%20x", {"Referer": "https://x/y"}, 404, b"nope" * 9),
    ("POST", "/v1/messages", {"User-Agent": "claude-cli/2.1 (external, cli)"}, 529, b""),
    ("DELETE", "/v1/responses/resp_1", {}, 204, b""),
]


@pytest.mark.parametrize(("method", "path", "headers", "status", "body"), REQUESTS)
@pytest.mark.parametrize("took", [0.0, 0.25, 3.5])
def test_the_line_is_aiohttps_default_one(
    logged: pytest.LogCaptureFixture,
    method: str,
    path: str,
    headers: dict[str, str],
    status: int,
    body: bytes,
    took: float,
) -> None:
    logger = logging.getLogger("test.access")
    request = make_mocked_request(method, path, headers=CIMultiDict(headers))
    response = web.Response(status=status, body=body)
    for _ in range(3):  # both made within one second (the line shows it)
        logged.clear()
        AccessLogger(logger, AccessLogger.LOG_FORMAT).log(request, response, took)
        AccessLine(logger, AccessLogger.LOG_FORMAT).log(request, response, took)
        theirs, ours = logged.messages
        if STAMP.findall(theirs) == STAMP.findall(ours):
            break
    assert ours == theirs
    (stamp,) = STAMP.findall(ours)
    started = time.mktime(time.strptime(stamp.split()[0], "%d/%b/%Y:%H:%M:%S"))
    assert abs(started - (time.time() - took)) < 3


def test_a_loopback_request_is_named_by_the_client_it_stands_for(
    logged: pytest.LogCaptureFixture,
) -> None:
    request = make_mocked_request("POST", "/v1/responses")
    request[CLIENT_ADDRESS] = "10.1.2.3"
    AccessLine(logging.getLogger("test.access"), "").log(request, web.Response(), 0.1)
    assert logged.messages[0].startswith("10.1.2.3 [")


def test_no_line_is_made_below_the_info_level() -> None:
    logger = logging.getLogger("test.access.quiet")
    logger.setLevel(logging.WARNING)
    assert not AccessLine(logger, "").enabled
    logger.setLevel(logging.INFO)
    assert AccessLine(logger, "").enabled
