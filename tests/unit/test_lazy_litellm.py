"""litellm off the start-up path: while another thread imports it, nothing waits for it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.meter import counter_for
from compaction_proxy.ops import cli


@pytest.fixture
def importing_elsewhere(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """As in a proxy that has just started: the import runs in another thread."""
    done = threading.Event()
    monkeypatch.setattr(lazy_litellm, "_started", True)
    monkeypatch.setattr(lazy_litellm, "_imported", done)
    return done


def test_while_litellm_loads_counting_falls_back_to_tiktoken_at_once(
    importing_elsewhere: threading.Event,
) -> None:
    started = time.perf_counter()
    assert not lazy_litellm.available()
    assert counter_for("deepseek-chat").name == "o200k_base"
    assert time.perf_counter() - started < 1.0  # no import, no wait on the import lock


def test_once_loaded_the_models_own_tokenizer_is_used(
    importing_elsewhere: threading.Event,
) -> None:
    lazy_litellm._import()  # what the worker thread runs (a no-op when already imported)
    assert lazy_litellm.available()
    assert counter_for("deepseek-chat").name == "hf:deepseek"
    assert counter_for("gpt-4o").name == "o200k_base"


def test_at_exit_an_import_under_way_is_waited_for_only_as_long_as_allowed(
    importing_elsewhere: threading.Event,
) -> None:
    assert not lazy_litellm.settle(0.05)  # still importing: the caller leaves without it
    threading.Timer(0.05, importing_elsewhere.set).start()
    assert lazy_litellm.settle(5.0)  # over within the time allowed


def test_at_exit_nothing_is_waited_for_when_no_import_was_started(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lazy_litellm, "_started", False)
    monkeypatch.setattr(lazy_litellm, "_imported", threading.Event())
    assert lazy_litellm.settle(60.0)


@pytest.fixture
def exits(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The statuses ``os._exit`` was called with, instead of leaving the test session."""
    called: list[int] = []
    monkeypatch.setattr(cli.os, "_exit", called.append)
    monkeypatch.setattr(cli.logging, "shutdown", lambda: None)  # the test session's handlers
    return called


def test_a_proxy_that_cannot_settle_the_import_exits_without_finalizing(
    importing_elsewhere: threading.Event, exits: list[int]
) -> None:
    cli.exit_after_an_import_under_way(0.01)
    assert exits == [0]
    importing_elsewhere.set()
    cli.exit_after_an_import_under_way(0.01)
    assert exits == [0]  # over: the interpreter finalizes as usual


def test_a_proxy_that_cannot_listen_leaves_without_finalizing_while_the_import_runs(
    importing_elsewhere: threading.Event, exits: list[int]
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = cli.main(["serve", "--host", "127.0.0.1", "--port", str(port)])
    assert status == 1
    assert exits == [1]  # the bind failed after the import started: no finalizing under it


def test_a_proxy_whose_app_fails_says_why_and_leaves_without_finalizing_while_the_import_runs(
    importing_elsewhere: threading.Event,
    exits: list[int],
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("a start-up failure")

    monkeypatch.setattr(cli.web, "run_app", fails)
    with pytest.raises(RuntimeError):  # os._exit is stubbed: the exception goes on
        cli.main(["serve", "--port", "0"])
    assert exits == [1]
    assert "RuntimeError: a start-up failure" in capfd.readouterr().err
