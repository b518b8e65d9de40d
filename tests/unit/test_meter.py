"""The token meter: close to the provider's count, anchored on usage, cheap on history."""

from __future__ import annotations

import math
from typing import Any

import pytest

from compaction_proxy.compaction.request_view import RequestView
from compaction_proxy.metering.anchor import Anchor
from compaction_proxy.metering.meter import (
    UNDER_REPORT_MARGIN,
    Measurement,
    TokenMeter,
    counter_for,
)
from compaction_proxy.metering.windows import LearnedWindows, mapped_window, resolve_window
from compaction_proxy.testing.fake_upstream import FakeUpstream
from tests.builders import agent_turns, system, user
from tests.transcripts import replay_requests, transcripts

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "bash",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
]


def measure(
    meter: TokenMeter,
    messages: list[dict[str, Any]],
    tools: Any = None,
    anchor: Anchor | None = None,
    model: str = "fake-model",
    tenant: str = "tenant",
) -> Measurement:
    view = RequestView.of(tenant, model, messages, None, tools)
    return meter.measure(view, view.surface(()), anchor)


@pytest.mark.parametrize("transcript", transcripts(), ids=lambda t: t.name)
def test_meter_within_two_percent_of_the_upstream_on_every_request(transcript: Any) -> None:
    fake = FakeUpstream()
    meter = TokenMeter()
    worst = 0.0
    for history in replay_requests(transcript.messages):
        exact = fake.prompt_tokens({"messages": history, "tools": TOOLS})
        estimate = measure(meter, history, TOOLS).tokens
        worst = max(worst, abs(estimate - exact) / exact)
    assert worst <= 0.02


def conversation() -> list[dict[str, Any]]:
    return [system(), user("Fix the bug"), *agent_turns(4)]


def test_anchor_plus_delta_scaled_as_the_upstream_counted_the_anchored_surface() -> None:
    meter = TokenMeter()
    first = conversation()
    measured = measure(meter, first, TOOLS)
    reported = measured.estimated * 5 // 4  # the upstream counts a quarter more
    anchor = measured.anchor_for(reported)
    assert anchor is not None
    later = [*first, user("and now the tests")]
    again = measure(meter, later, TOOLS, anchor)
    assert again.anchored
    new_message = meter.message(later[-1], counter_for("fake-model"))
    assert again.tokens == reported + math.ceil(new_message * reported / measured.estimated)
    assert again.estimated == measured.estimated + new_message


@pytest.mark.parametrize(
    "change",
    [
        lambda ms, tools: ([system("another system prompt"), *ms[1:]], tools),
        lambda ms, tools: ([*ms[:3], user("edited"), *ms[4:]], tools),
        lambda ms, tools: (ms, None),
        lambda ms, tools: (ms[:3], tools),
    ],
    ids=["head-changed", "edited-inside", "tools-changed", "shorter"],
)
def test_plain_estimate_when_the_surface_does_not_extend_the_anchor(change: Any) -> None:
    meter = TokenMeter()
    first = conversation()
    anchor = measure(meter, first, TOOLS).anchor_for(10_000)
    messages, tools = change([*first, user("next")], TOOLS)
    again = measure(meter, messages, tools, anchor)
    assert not again.anchored
    assert again.tokens == again.estimated


def test_under_reported_usage_is_not_anchored() -> None:
    measured = measure(TokenMeter(), conversation())
    floor = measured.estimated * (1 - UNDER_REPORT_MARGIN)
    assert measured.anchor_for(int(floor) - 1) is None
    assert measured.anchor_for(int(floor) + 1) is not None


def test_what_a_tenants_usage_teaches_scales_its_own_first_estimates_alone() -> None:
    """A tenant whose content the meter undercounts (screenshots) teaches a ratio of 3; its
    next conversation's first estimate takes it, another tenant's of the same model does not."""
    meter = TokenMeter()
    plain = measure(meter, conversation(), tenant="other").tokens
    for _ in range(10):
        meter.calibrate("screenshots", "fake-model", estimated=1_000, reported=3_000)
    assert measure(meter, conversation(), tenant="other").tokens == plain
    taught = measure(meter, conversation(), tenant="screenshots").tokens
    assert taught == pytest.approx(3 * plain, rel=0.05)


def test_history_is_counted_once_per_message() -> None:
    meter = TokenMeter()
    calls = 0
    counter = counter_for("fake-model")

    class Counting:
        name = counter.name

        def __call__(self, text: str) -> int:
            nonlocal calls
            calls += 1
            return counter(text)

    import compaction_proxy.metering.meter as meter_module

    original = meter_module.counter_for
    meter_module.counter_for = lambda model: Counting()  # type: ignore[assignment]
    try:
        history = conversation()
        measure(meter, history)
        first = calls
        measure(meter, [*history, user("one more")])
    finally:
        meter_module.counter_for = original
    assert calls - first == 2  # role and content of the one new message


@pytest.mark.parametrize(
    ("model", "tokenizer"),
    [
        ("gpt-4o", "o200k_base"),
        ("gpt-5-mini", "o200k_base"),
        ("gpt-4", "cl100k_base"),
        ("gpt-3.5-turbo", "cl100k_base"),
        ("fake-model", "o200k_base"),
        ("deepseek-chat", "hf:deepseek"),
        ("llama-3-70b", "o200k_base"),
    ],
)
def test_tokenizer_choice_is_offline_and_model_aware(model: str, tokenizer: str) -> None:
    assert counter_for(model).name == tokenizer


@pytest.mark.parametrize("model", ["gpt-4o", "gpt-4"])
def test_a_long_text_counts_the_same_tokens_as_tiktoken_encode(model: str) -> None:
    """Long texts are counted through tiktoken's buffer (no list of ints built while holding
    the interpreter); the count is the one ``encode`` gives, special tokens included as text."""
    from compaction_proxy.metering.tokenizers import encoding

    text = "def f(x):\n    return x  # <|endoftext|> naïve 数据 \U0001f600\n" * 4000
    count = counter_for(model)
    expected = len(encoding(count.name).encode(text, disallowed_special=()))
    assert len(text) > 64 * 1024
    assert count(text) == expected


@pytest.mark.parametrize(
    ("configured", "mapped", "learned", "window"),
    [
        (32_000, 128_000, None, 32_000),
        (None, 128_000, None, 128_000),
        (None, None, None, None),
        (None, None, 16_385, 16_385),
        (32_000, 128_000, 16_000, 16_000),
        (8_000, None, 16_000, 8_000),
    ],
)
def test_window_resolution_order(
    configured: int | None, mapped: int | None, learned: int | None, window: int | None
) -> None:
    assert resolve_window(configured, mapped, learned) == window


@pytest.mark.parametrize(
    ("model", "window"),
    [
        ("gpt-4o", 128_000),
        ("openai/gpt-4o-mini", 128_000),
        ("gpt-3.5-turbo", 16_385),
        ("no-such-model-anywhere", None),
    ],
)
def test_litellm_model_map_is_read_offline(model: str, window: int | None) -> None:
    assert mapped_window(model) == window


def test_learned_window_keeps_the_smallest_stated_limit_for_its_tenant_alone() -> None:
    learned = LearnedWindows()
    learned.learn("*", "tenant", "m", 16_000)
    learned.learn("*", "tenant", "m", 32_000)
    assert learned.get("*", "tenant", "m") == 16_000
    assert learned.get("*", "tenant", "other") is None
    assert learned.get("*", "another tenant", "m") is None


def test_surface_with_replacements_is_priced_as_its_messages() -> None:
    from compaction_proxy.conversation.replacements import Checkpoint, Prune

    meter = TokenMeter()
    messages = [system(), user("Fix the bug"), *agent_turns(6, output="long output " * 50)]
    view = RequestView.of("tenant", "fake-model", messages, None, TOOLS)
    records = [
        Checkpoint(
            0,
            4,
            view.root,
            view.chain[4],
            user("<compacted-summary>s</compacted-summary>"),
            tokens=12,
        ),
        Prune(8, view.chain[8], "pruned output"),
    ]
    surface = view.surface(records)
    assert surface.checkpoints and surface.prunes
    measured = meter.measure(view, surface)
    assert measured.estimated == meter.measure_messages("fake-model", surface.messages, TOOLS)
    assert (
        sum(meter.node_tokens(view, surface))
        + 3
        + meter.tools_tokens(TOOLS, counter_for("fake-model"))
        == measured.estimated
    )

    reported = measured.estimated + 40
    anchor = measured.anchor_for(reported)
    later = RequestView.of("tenant", "fake-model", [*messages, user("next")], None, TOOLS)
    again = meter.measure(later, later.surface(records), anchor)
    assert again.anchored
    delta = meter.message(user("next"), counter_for("fake-model"))
    assert again.tokens == reported + math.ceil(delta * reported / measured.estimated)
    # A new checkpoint inside the anchored prefix changes what was forwarded: no anchor.
    deeper = Checkpoint(
        0, 8, view.root, view.chain[8], user("<compacted-summary>t</compacted-summary>"), tokens=12
    )
    assert not meter.measure(later, later.surface([*records, deeper]), anchor).anchored


def test_the_tools_are_priced_alike_with_or_without_the_requests_digest_of_them() -> None:
    """A request view's ``tools_digest`` hashes the bytes the meter would: the price it gives
    is the one cached for the tools, serialized or not."""
    view = RequestView.of("tenant", "fake-model", [user("hi")], None, TOOLS)
    count = counter_for("fake-model")
    fresh = TokenMeter().tools_tokens(TOOLS, count)
    given = TokenMeter()
    assert given.tools_tokens(TOOLS, count, view.tools_digest) == fresh > 0
    assert given._messages.get((count.name, "tools:" + view.tools_digest)) == fresh
