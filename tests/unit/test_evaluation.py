"""The evaluation's pure core: probes made by rule from what a policy took out of view, each
answerable from the history they came from; grading; retention, its interval and the bill."""

from __future__ import annotations

import json
from typing import Any

import pytest

from compaction_proxy.evaluation.generated_probes import (
    ANSWER_BRIEFLY,
    generated_probes,
    generation_points,
)
from compaction_proxy.evaluation.grading import matches, verdict
from compaction_proxy.evaluation.probes import ProbeKind, answer_from, probes_for
from compaction_proxy.evaluation.report import Asked, bill_units, retention, wilson
from compaction_proxy.ops.eval_replay import transcript

pytest.importorskip("hypothesis")

from hypothesis import given
from hypothesis import strategies as st


def call(command: str, said: str = "Running it.") -> dict[str, Any]:
    arguments = json.dumps({"command": command})
    return {
        "role": "assistant",
        "content": said,
        "tool_calls": [
            {"id": "c", "type": "function", "function": {"name": "bash", "arguments": arguments}}
        ],
    }


def history() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "Fix the importer."},
        call(
            "cat -n src/importer/loader.py", "I will read the importer's source before changing it."
        ),
        {"role": "tool", "tool_call_id": "c", "content": "1\tdef load_rows(path):\n2\t    pass"},
        call("python -m pytest tests/test_loader.py"),
        {"role": "tool", "tool_call_id": "c", "content": "ValueError: row 7 has no id column"},
        call("git diff"),
        {"role": "tool", "tool_call_id": "c", "content": "(no changes)"},
    ]


def test_probes_ask_for_what_went_and_the_history_answers_every_one() -> None:
    messages = history()
    probes = probes_for(messages[1:5], messages)
    kinds = {p.kind for p in probes}
    assert kinds == {
        ProbeKind.ARTIFACT,
        ProbeKind.RECALL,
        ProbeKind.CONTINUATION,
        ProbeKind.DECISION,
    }
    whole = transcript(messages)  # as the model is shown it
    for probe in probes:
        if probe.exact:
            assert matches(probe, answer_from(probe.question, whole)), probe
    made = {(p.kind, p.answer) for p in probes}
    assert (ProbeKind.ARTIFACT, "src/importer/loader.py") in made  # by its file name
    assert (ProbeKind.RECALL, "src/importer/loader.py") in made  # where load_rows is defined
    assert (ProbeKind.RECALL, "row 7 has no id column") in made
    assert (ProbeKind.CONTINUATION, "python -m pytest tests/test_loader.py") in made
    # What a command printed first, asked by the command, where its output went.
    assert (ProbeKind.RECALL, "1\tdef load_rows(path):") in made
    assert (ProbeKind.RECALL, "ValueError: row 7 has no id column") in made
    assert not any(p.answer == "(no changes)" for p in probes)  # still in view


def test_what_a_command_printed_is_not_answered_once_its_output_is_cleared() -> None:
    messages = history()
    asked = [p for p in probes_for(messages[1:5], messages) if "print first" in p.question]
    cleared = [*messages[:4], {**messages[4], "content": "[output cleared]"}, *messages[5:]]
    for probe in asked:
        assert matches(probe, answer_from(probe.question, transcript(messages)))
    assert not matches(asked[-1], answer_from(asked[-1].question, transcript(cleared)))


def test_a_fact_out_of_view_is_not_answered() -> None:
    messages = history()
    (artifact,) = [p for p in probes_for(messages[1:3], messages) if p.kind is ProbeKind.ARTIFACT]
    assert answer_from(artifact.question, "a summary that kept no path") == "UNKNOWN"


def test_an_ambiguous_cue_makes_no_probe() -> None:
    messages = [*history(), call("cat src/other/loader.py")]
    made = probes_for(messages[1:3], messages)
    assert all("named `loader.py`" not in p.question for p in made)


@pytest.mark.parametrize(
    ("given", "right"),
    [("src/importer/loader.py", True), ("`./src/importer/loader.py`.", True),
     ("It is src/importer/loader.py", True), ("loader.py", False), ("UNKNOWN", False)],
)  # fmt: skip
def test_a_fact_is_matched_whole_quotes_and_dot_slash_aside(given: str, right: bool) -> None:
    (probe,) = [p for p in probes_for(history()[1:3], history()) if p.kind is ProbeKind.ARTIFACT]
    assert matches(probe, given) is right


def test_the_graders_verdict_is_its_first_word() -> None:
    assert verdict("CORRECT.") and verdict("correct") and not verdict("WRONG") and not verdict("")


@given(st.integers(0, 200), st.integers(0, 200))
def test_the_interval_holds_the_share_within_zero_and_one(right: int, more: int) -> None:
    probes = right + more
    low, high = wilson(right, probes)
    assert 0 <= low <= high <= 1
    if probes:
        assert low <= right / probes <= high


def test_retention_counts_only_what_the_whole_history_got_right() -> None:
    asked = [
        Asked(ProbeKind.RECALL, True, True),
        Asked(ProbeKind.RECALL, True, False),
        Asked(ProbeKind.RECALL, False, True),  # wrong with everything in view: not counted
        Asked(ProbeKind.ARTIFACT, None, True),  # the history did not fit: counted
    ]
    assert (retention(asked).probes, retention(asked).right) == (3, 2)
    assert retention(asked, ProbeKind.RECALL).share == 0.5


def test_a_prefix_sent_before_is_billed_as_a_cache_read() -> None:
    first = [("a", 100), ("b", 50)]
    second = [("a", 100), ("b", 50), ("c", 10)]
    changed = [("x", 20), ("b", 50), ("c", 10)]
    assert bill_units([first, second], read=0.1, write=1.25) == pytest.approx(
        150 * 1.25 + 150 * 0.1 + 10 * 1.25
    )
    assert bill_units([second, changed], 0.1, 1.25) == pytest.approx(160 * 1.25 + 80 * 1.25)


def test_a_written_probe_is_read_from_each_json_line_and_graded_by_the_model() -> None:
    reply = "\n".join(
        [
            "Here are the questions:",
            '{"kind": "artifact", "question": "Which port?", "answer": "8443"},',
            '{"kind": "guess", "question": "Which user ran it?", "answer": "deploy"}',
            '{"question": "", "answer": "x"}',
            '{"question": "No answer?"}',
            "{not json}",
            '["a list"]',
            '{"kind": "recall", "question": "Third?", "answer": "3"}',
        ]
    )
    found = generated_probes(reply, 5)
    assert [(p.kind, p.answer) for p in found] == [
        (ProbeKind.ARTIFACT, "8443"),
        (ProbeKind.RECALL, "deploy"),
        (ProbeKind.RECALL, "3"),
    ]
    assert all(not p.exact and p.question.endswith(ANSWER_BRIEFLY) for p in found)
    assert len(generated_probes(reply, 1)) == 1
    assert generated_probes("I cannot help with that.", 3) == []


@given(st.integers(0, 60), st.integers(-2, 70))
def test_probes_are_written_at_points_spread_from_first_to_last(points: int, most: int) -> None:
    chosen = generation_points(list(range(points)), most)
    assert len(chosen) == max(0, min(points, most))
    assert chosen == sorted(set(chosen))
    if len(chosen) >= 2:
        assert chosen[0] == 0 and chosen[-1] == points - 1
