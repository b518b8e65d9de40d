"""The fakes' prompt caches (``compaction_proxy.testing.prompt_cache``) read and write as the
providers describe theirs: OpenAI by prefix from 1,024 tokens in 128-token steps, Anthropic at
breakpoints, looking back 20 blocks."""

from __future__ import annotations

from typing import Any

import pytest

from compaction_proxy.testing.prompt_cache import (
    CacheUse,
    PromptCaches,
    PromptPart,
    messages_prompt,
)


def parts(*tokens: int, marks: tuple[int, ...] = (), tag: str = "m") -> list[PromptPart]:
    return [PromptPart(f"{tag}{i}:{n}", n, i in marks) for i, n in enumerate(tokens)]


@pytest.mark.parametrize(
    ("first", "second", "read"),
    [
        ((2_000,), (2_000,), 1_920),  # the same prompt: all but what the 128-token steps leave
        ((600, 600), (600, 600, 50), 1_152),  # a longer one reads the earlier whole (1,200)
        ((600, 600), (600, 700), 0),  # shares 600 tokens: under the 1,024 that are cached
        ((900,), (900, 900), 0),  # the first was too short to be cached at all
        ((500, 600, 700), (500, 600, 9), 1_024),  # a prefix of an earlier one: 1,100 shared
    ],
)
def test_openai_reads_the_longest_shared_prefix_in_steps(
    first: tuple[int, ...], second: tuple[int, ...], read: int
) -> None:
    caches = PromptCaches()
    assert caches.openai(parts(*first)) == 0
    assert caches.openai(parts(*second)) == read


def test_openai_never_reads_a_prefix_that_differs_from_its_first_part() -> None:
    caches = PromptCaches()
    caches.openai(parts(2_000, 2_000))
    assert caches.openai(parts(2_000, 2_000, tag="other")) == 0


def test_openai_reads_only_what_prompts_under_the_same_cache_key_wrote() -> None:
    caches = PromptCaches()
    caches.openai(parts(2_000), "session-1")
    assert caches.openai(parts(2_000)) == 0
    assert caches.openai(parts(2_000), "session-2") == 0
    assert caches.openai(parts(2_000), "session-1") == 1_920


@pytest.mark.parametrize(
    ("first_marks", "second_tokens", "second_marks", "use"),
    [
        # No breakpoint: nothing is written, so nothing is read.
        ((), (800, 800, 100), (2,), CacheUse(0, 1_700)),
        # The first wrote its whole prompt; the second reads it and writes its new block.
        ((1,), (800, 800, 100), (2,), CacheUse(1_600, 100)),
        # A breakpoint under 1,024 tokens writes nothing.
        ((0,), (800, 800, 100), (2,), CacheUse(0, 1_700)),
        # The second has no breakpoint: it neither reads nor writes.
        ((1,), (800, 800, 100), (), CacheUse(0, 0)),
    ],
)
def test_anthropic_reads_and_writes_at_breakpoints(
    first_marks: tuple[int, ...],
    second_tokens: tuple[int, ...],
    second_marks: tuple[int, ...],
    use: CacheUse,
) -> None:
    caches = PromptCaches()
    caches.anthropic(parts(800, 800, marks=first_marks))
    assert caches.anthropic(parts(*second_tokens, marks=second_marks)) == use


def test_anthropic_looks_back_twenty_blocks_from_a_breakpoint_and_no_further() -> None:
    caches = PromptCaches()
    caches.anthropic(parts(2_000, marks=(0,)))
    near = (2_000, *[10] * 20)
    assert caches.anthropic(parts(*near, marks=(20,))).read == 2_000
    far = (2_000, *[10] * 21)
    assert caches.anthropic(parts(*far, marks=(21,), tag="m")).read == 2_000 + 200  # near's
    fresh = PromptCaches()
    fresh.anthropic(parts(2_000, marks=(0,)))
    assert fresh.anthropic(parts(*far, marks=(21,))).read == 0


def test_a_moved_breakpoint_is_the_same_cached_content() -> None:
    body: dict[str, Any] = {
        "system": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "x " * 3_000}]},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "go", "cache_control": {}}]},
        ],
    }
    marked = {"type": "ephemeral"}
    body["messages"][0]["content"][0]["cache_control"] = marked
    caches = PromptCaches()
    first = caches.anthropic(messages_prompt(body, len, lambda b: len(str(b.get("text")))))
    assert first.read == 0 and first.written >= 1_024
    del body["messages"][0]["content"][0]["cache_control"]
    body["messages"][2]["content"][0]["cache_control"] = marked
    second = caches.anthropic(messages_prompt(body, len, lambda b: len(str(b.get("text")))))
    assert second.read == first.written


def test_a_breakpoint_moved_within_the_system_prompt_changes_nothing_cached() -> None:
    marked = {"type": "ephemeral"}
    system = [{"type": "text", "text": "a " * 2_000}, {"type": "text", "text": "b"}]
    turns = [{"role": "user", "content": [{"type": "text", "text": "go", "cache_control": marked}]}]
    caches = PromptCaches()

    def use(first: bool) -> CacheUse:
        blocks = [
            {**block, "cache_control": marked} if (i == 0) == first else block
            for i, block in enumerate(system)
        ]
        body = {"system": blocks, "messages": turns}
        return caches.anthropic(messages_prompt(body, len, lambda b: len(str(b.get("text")))))

    written = use(True).written
    assert use(False) == CacheUse(written, 0)
