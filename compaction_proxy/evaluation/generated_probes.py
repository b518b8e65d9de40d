"""Probes the model writes (pure: the prompt, where to ask for them, reading its reply).

The rules of ``probes`` find paths, errors, definitions, commands and stated decisions; a
conversation's other facts (a value read from a config, a cause the agent worked out, what a
test printed) have no rule. With ``--model-probes N`` the model is shown what a policy took out
of view at N change points and writes one question about a fact in it, with the answer. Such
a probe is graded by the model against ``probes.RUBRIC``, like a decision. The prompt is here,
in the repository, so that what was asked can be read and changed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import orjson

from compaction_proxy.evaluation.probes import Probe, ProbeKind

Point = TypeVar("Point")

GENERATE = (
    "You write probe questions about a part of a conversation that an assistant can no longer "
    "see in full. Write {count} question(s), each about one specific fact the part above "
    "states (a file, a value, an error and its cause, a command and what it printed, a "
    "decision and its reason), that a reader of this part alone could answer in a few words, "
    "and that no other part of a long conversation would answer differently. Reply with one "
    'JSON object per question, one per line, nothing else: {{"kind": "recall", "artifact", '
    '"continuation" or "decision", "question": "...", "answer": "..."}}'
)
ANSWER_BRIEFLY = " Answer in a few words, or with UNKNOWN."


def generation_points(points: Sequence[Point], most: int) -> list[Point]:
    """At most ``most`` change points, spread evenly from the first to the last: where the
    model is asked for a probe (one each)."""
    if most <= 0 or not points:
        return []
    if most >= len(points):
        return list(points)
    if most == 1:
        return [points[len(points) // 2]]
    step = (len(points) - 1) / (most - 1)
    return [points[round(i * step)] for i in range(most)]


def generated_probes(reply: str, most: int) -> list[Probe]:
    """The probes a reply to ``GENERATE`` holds: each line that is a JSON object with a
    question and an answer (other lines, and a kind it does not know, are let go: a kind
    unknown is ``recall``), at most ``most``."""
    found: list[Probe] = []
    for line in reply.splitlines():
        line = line.strip().strip(",")
        if not line.startswith("{"):
            continue
        try:
            item = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(item, dict):
            continue
        question, answer = item.get("question"), item.get("answer")
        if not (isinstance(question, str) and isinstance(answer, str)):
            continue
        if not (question.strip() and answer.strip()):
            continue
        kind = item.get("kind")
        known = kind if isinstance(kind, str) and kind in set(ProbeKind) else ProbeKind.RECALL
        question = question.strip() + ANSWER_BRIEFLY
        found.append(Probe(ProbeKind(known), question, answer.strip(), exact=False))
        if len(found) == most:
            break
    return found
