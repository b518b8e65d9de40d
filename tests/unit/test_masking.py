"""Observation masking: which observations a step clears, to what, and when a step is worth
its cache miss (pure)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from compaction_proxy.compaction.masking import (
    MaskCandidate,
    Masker,
    live_rereads,
    mask_candidates,
    mask_relieves,
    observations,
    oldest_masks,
    rereads,
)
from compaction_proxy.conversation.surface import SurfaceNode
from tests.builders import assistant, tool, user

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st

BIG = "x" * 2_000
EVERY_OLD_ONE = Masker(keep=0)


def nodes(body: list[dict[str, Any]]) -> list[SurfaceNode]:
    return [SurfaceNode(m, "body", i, i) for i, m in enumerate(body)]


def cleared(
    body: list[dict[str, Any]],
    before: int | None = None,
    masker: Masker = EVERY_OLD_ONE,
    masked: frozenset[int] = frozenset(),
    surface: list[SurfaceNode] | None = None,
) -> list[int]:
    found = mask_candidates(
        surface if surface is not None else nodes(body),
        body,
        len(body) if before is None else before,
        masker,
        masked.__contains__,
    )
    return [c.position for c in found]


def tool_history(count: int, output: str = BIG) -> list[dict[str, Any]]:
    body: list[dict[str, Any]] = [user("Fix the failing test.")]
    for i in range(count):
        body.append(assistant(None, (f"c{i}", "bash", f'{{"command": "cat file_{i}.py"}}')))
        body.append(tool(f"c{i}", f"{output} {i}"))
    return body


def test_the_placeholder_names_the_call_its_arguments_and_the_size_cleared() -> None:
    body = tool_history(1)
    (candidate,) = mask_candidates(nodes(body), body, 3, Masker(keep=0), lambda _: False)
    assert candidate.position == 2 and candidate.tool == "bash"
    assert candidate.chars_before == len(BIG) + 2
    assert candidate.placeholder == (
        "[compaction-proxy cleared this output of bash(command='cat file_0.py') to save "
        "context: 2,002 characters. Run the tool again if you need it.]"
    )


def test_the_newest_keep_observations_are_never_cleared() -> None:
    body = tool_history(5)
    observed = [2, 4, 6, 8, 10]
    assert cleared(body, masker=Masker(keep=0)) == observed
    assert cleared(body, masker=Masker(keep=3)) == observed[:2]
    assert cleared(body, masker=Masker(keep=5)) == []
    assert cleared(body, masker=Masker(keep=9)) == []  # more than there are: all kept


def test_nothing_at_or_after_before_is_offered() -> None:
    body = tool_history(5)
    assert cleared(body, before=6) == [2, 4]
    assert cleared(body, before=0) == []


def test_excluded_tools_keep_their_outputs() -> None:
    body = [
        user("Go."),
        assistant(None, ("a", "read_memory", "{}")),
        tool("a", BIG),
        assistant(None, ("b", "bash", "{}")),
        tool("b", BIG),
    ]
    masker = Masker(keep=0, exclude_tools=frozenset({"read_memory"}))
    assert cleared(body, masker=masker) == [4]


def test_head_checkpoint_and_already_masked_nodes_are_never_offered() -> None:
    body = tool_history(3)
    surface = [
        SurfaceNode(body[0], "head"),
        SurfaceNode({"role": "user", "content": "<compacted-summary>…"}, "checkpoint", 1, 2),
        *[SurfaceNode(m, "body", i, i) for i, m in enumerate(body) if i > 2],
    ]
    assert cleared(body, surface=surface) == [4, 6]
    assert cleared(body, surface=surface, masked=frozenset({4})) == [6]


def test_a_pruned_node_is_cleared_and_sized_from_the_client_message() -> None:
    body = tool_history(2, output="y" * 20_000)
    surface = nodes(body)
    surface[2] = SurfaceNode(tool("c0", "y" * 5_000), "pruned", 2, 2)
    (first, _) = mask_candidates(surface, body, 5, Masker(keep=0), lambda _: False)
    assert first.position == 2 and first.chars_before == 20_002


def test_an_output_not_much_longer_than_its_placeholder_stays() -> None:
    body = tool_history(2, output="short")
    assert cleared(body) == []


def test_a_result_answers_the_latest_call_of_its_repeated_id() -> None:
    body = [
        user("Go."),
        assistant(None, ("same", "read", '{"path": "a.py"}')),
        tool("same", BIG),
        assistant(None, ("same", "grep", '{"pattern": "def "}')),
        tool("same", BIG),
    ]
    found = mask_candidates(nodes(body), body, 5, Masker(keep=0), lambda _: False)
    assert [c.tool for c in found] == ["read", "grep"]
    assert "grep(pattern='def ')" in found[1].placeholder


def test_legacy_function_results_are_observations() -> None:
    body = [
        user("Go."),
        {"role": "assistant", "content": None, "function_call": {"name": "run", "arguments": "{}"}},
        {"role": "function", "name": "run", "content": BIG},
    ]
    (candidate,) = mask_candidates(nodes(body), body, 3, Masker(keep=0), lambda _: False)
    assert candidate.tool == "run" and "output of run()" in candidate.placeholder


def test_observation_style_user_messages_are_cleared_but_never_the_task() -> None:
    body = [
        user(BIG + " the task"),
        assistant("ls"),
        user("OBSERVATION:\nfile listing " + BIG),
        assistant("cat"),
        user("OBSERVATION:\ncontents " + BIG),
    ]
    found = mask_candidates(nodes(body), body, 5, Masker(keep=0), lambda _: False)
    assert [c.position for c in found] == [2, 4]
    assert found[0].tool is None
    assert 'beginning "OBSERVATION: file listing xxx' in found[0].placeholder
    assert "Run the command again" in found[0].placeholder
    assert cleared(body, masker=Masker(keep=0, user_messages=False)) == []


def test_user_text_beside_tool_results_is_never_an_observation() -> None:
    body = [*tool_history(2), user("Now also fix the docs. " + BIG)]
    assert [o.position for o in observations(body, True)] == [2, 4]
    assert cleared(body) == [2, 4]


def test_arguments_are_shortened_to_one_line() -> None:
    long_command = "python -c '" + "print(1);\n" * 50 + "'"
    body = [
        user("Go."),
        assistant(None, ("a", "bash", '{"command": ' + repr(long_command).replace("'", '"') + "}")),
        tool("a", BIG),
        assistant(None, ("b", "edit", "not json at all")),
        tool("b", BIG),
    ]
    first, second = mask_candidates(nodes(body), body, 5, Masker(keep=0), lambda _: False)
    assert "\n" not in first.placeholder and "…" in first.placeholder
    assert len(first.placeholder) < 320
    assert "edit(not json at all)" in second.placeholder


def test_inputs_are_never_mutated() -> None:
    body = tool_history(4)
    surface = nodes(body)
    body_copy, surface_copy = copy.deepcopy(body), copy.deepcopy(surface)
    mask_candidates(surface, body, len(body), Masker(keep=1), lambda _: False)
    assert body == body_copy and surface == surface_copy


@pytest.mark.parametrize(
    ("tokens", "saved", "threshold", "floor", "relieves"),
    [
        (26_000, 12_000, 25_600, 3_200, True),  # lands well under the threshold
        (26_000, 3_000, 25_600, 3_200, False),  # frees less than clear_at_least
        (26_000, 3_300, 25_600, 3_200, False),  # frees enough, yet lands a hair under
        (30_000, 7_600, 25_600, 3_200, True),  # exactly clear_at_least of room left
        (30_000, 7_599, 25_600, 3_200, False),
        (26_000, 0, 25_600, 0, False),  # nothing saved is never a step
    ],
)
def test_a_step_must_free_clear_at_least_and_leave_that_much_room(
    tokens: int, saved: int, threshold: int, floor: int, relieves: bool
) -> None:
    assert mask_relieves(tokens, saved, threshold, floor) is relieves


def test_clear_at_least_defaults_to_a_tenth_of_the_window() -> None:
    assert Masker().clear_at_least_for(128_000) == 12_800
    assert Masker(clear_at_least=500).clear_at_least_for(128_000) == 500


@pytest.mark.parametrize("bad", [{"keep": -1}, {"clear_at_least": -5}])
def test_a_masker_refuses_negative_settings(bad: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        Masker(**bad)


def offered(*positions: int) -> list[MaskCandidate]:
    return [MaskCandidate(p, "[cleared]", "bash", 1_000) for p in positions]


@pytest.mark.parametrize(
    ("worth", "need", "chosen", "saved"),
    [
        ({2: 100, 4: 100, 6: 100}, 150, [2, 4], 200),  # the fewest, oldest first
        ({2: 100, 4: 100, 6: 100}, 100, [2], 100),
        ({2: 0, 4: 100, 6: 100}, 100, [4], 100),  # one that saves nothing is skipped
        ({2: 100, 4: 100}, 500, [2, 4], 200),  # not enough: all of them, the saving short
        ({2: 100}, 0, [], 0),  # nothing needed, nothing cleared
    ],
)
def test_the_fewest_oldest_masks_that_save_what_is_needed(
    worth: dict[int, int], need: int, chosen: list[int], saved: int
) -> None:
    cuts = oldest_masks(offered(*worth), list(worth.values()), need)
    assert [c.position for c in cuts.candidates] == chosen and cuts.saved == saved


roles = st.sampled_from(["tool", "assistant", "user"])


@given(
    st.lists(st.tuples(roles, st.integers(0, 3_000)), max_size=30),
    st.integers(0, 5),
    st.integers(0, 32),
)
def test_candidates_are_old_observations_outside_the_newest_keep(
    shape: list[tuple[str, int]], keep: int, before: int
) -> None:
    body: list[dict[str, Any]] = [user("task")]
    for index, (role, size) in enumerate(shape):
        if role == "tool":
            body.append(assistant(None, (f"id{index}", "bash", "{}")))
            body.append(tool(f"id{index}", "z" * size))
        else:
            body.append({"role": role, "content": "z" * size})
    found = mask_candidates(nodes(body), body, before, Masker(keep=keep), lambda _: False)
    observed = [o.position for o in observations(body, True)]
    newest = set(observed[-keep:]) if keep else set()
    positions = [c.position for c in found]
    assert positions == sorted(positions)
    for candidate in found:
        assert candidate.position < before and candidate.position in observed
        assert candidate.position not in newest
        assert 2 * len(candidate.placeholder) < candidate.chars_before


def test_a_call_repeating_a_masked_one_is_a_reread_and_its_output_is_not_masked_again() -> None:
    body = tool_history(3)
    # The agent runs the first call again, its JSON spelled otherwise.
    body.append(assistant(None, ("c9", "bash", '{ "command":"cat file_0.py" }')))
    body.append(tool("c9", f"{BIG} again"))
    body.append(assistant(None, ("c10", "bash", '{"command": "cat other.py"}')))
    body.append(tool("c10", f"{BIG} other"))
    masked = frozenset({2})  # file_0's first output was cleared
    assert rereads(observations(body, True), masked.__contains__) == {8}
    assert 8 not in cleared(body, masked=masked)
    assert 10 in cleared(body, masked=masked)
    # Counted once it is the live turn: the output answering the repeat.
    assert live_rereads(body[:9], 8, masked.__contains__, True) == 1
    assert live_rereads(body, 10, masked.__contains__, True) == 0
    # Without a mask, a repeat is no re-read.
    assert rereads(observations(body, True), frozenset().__contains__) == set()
