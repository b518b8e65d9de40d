"""The tokenizers' environment is written once, on the thread that builds the proxy; the
threads start-up runs later (encodings loaded off the loop, litellm's import) only read it."""

from __future__ import annotations

import os
import threading

import pytest

from compaction_proxy.config.settings import load_settings
from compaction_proxy.metering.tokenizers import use_bundled_tokenizers
from compaction_proxy.ops.app import create_app

SET_BY_THE_PROXY = ("TIKTOKEN_CACHE_DIR", "LITELLM_LOCAL_MODEL_COST_MAP")


class RecordingEnvironment(dict[str, str]):
    """``os.environ`` as a plain mapping that notes each write and the thread that made it."""

    def __init__(self, initial: dict[str, str]) -> None:
        super().__init__(initial)
        self.writes: list[tuple[str, str]] = []

    def __setitem__(self, key: str, value: str) -> None:
        if key in SET_BY_THE_PROXY:  # not pytest's own (PYTEST_CURRENT_TEST)
            self.writes.append((key, threading.current_thread().name))
        super().__setitem__(key, value)


@pytest.fixture
def environment(monkeypatch: pytest.MonkeyPatch) -> RecordingEnvironment:
    """The process's environment without the variables the proxy sets, recorded."""
    unset = {k: v for k, v in os.environ.items() if k not in SET_BY_THE_PROXY}
    recording = RecordingEnvironment(unset)
    monkeypatch.setattr(os, "environ", recording)
    return recording


def test_the_environment_is_written_once_and_a_later_thread_only_reads_it(
    environment: RecordingEnvironment,
) -> None:
    use_bundled_tokenizers()
    assert sorted(key for key, _ in environment.writes) == sorted(SET_BY_THE_PROXY)
    environment.writes.clear()
    use_bundled_tokenizers()
    later = threading.Thread(target=use_bundled_tokenizers, name="later")
    later.start()
    later.join()
    assert environment.writes == []


def test_an_operators_own_cost_map_choice_is_kept(environment: RecordingEnvironment) -> None:
    environment["LITELLM_LOCAL_MODEL_COST_MAP"] = "False"
    environment.writes.clear()
    use_bundled_tokenizers()
    assert environment["LITELLM_LOCAL_MODEL_COST_MAP"] == "False"
    assert [key for key, _ in environment.writes] == ["TIKTOKEN_CACHE_DIR"]


def test_building_the_proxy_writes_the_environment_on_the_callers_thread(
    environment: RecordingEnvironment,
) -> None:
    settings = load_settings(
        None, upstream_base_url="http://127.0.0.1:9/v1", tenant_secret="environment"
    )
    create_app(settings)
    written = dict(environment.writes)
    assert written == dict.fromkeys(SET_BY_THE_PROXY, threading.current_thread().name)
