"""litellm off the start-up path: while another thread imports it, nothing waits for it."""

from __future__ import annotations

import threading
import time

import pytest

from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.meter import counter_for


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
