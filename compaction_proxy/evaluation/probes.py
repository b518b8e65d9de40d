"""Probe questions about what a compaction took out of view (pure).

At a point where a policy changed what the model sees, the facts of the messages it removed
(masked, cut, or summarized away) are turned into questions with one right answer, made by
rules:

* **artifact**: a file path that appeared, asked by its file name ("the full path of
  ``models.py``");
* **recall**: the message an error carried, asked by the error's type; and where a name is
  defined, asked by the name (``def``/``class`` in a file's printed source);
* **continuation**: the command the agent ran right after another one;
* **recall** too: the first line a command printed, asked by the command;
* **decision**: what the assistant said it would do (graded by the model, with ``RUBRIC``).

A probe is kept only where its cue names one thing in the whole history (no ambiguity).
Whether the model can still answer it from what the policy forwarded (a summary may have kept
the fact, a mask cleared it) is what asking it finds out. Questions follow fixed templates, so
a fake model can answer them from what it is shown (``answer_from``).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Sequence
from enum import StrEnum
from typing import Any

from compaction_proxy.frozen import frozen

Message = dict[str, Any]


class ProbeKind(StrEnum):
    ARTIFACT = "artifact"
    RECALL = "recall"
    CONTINUATION = "continuation"
    DECISION = "decision"


@frozen
class Probe:
    kind: ProbeKind
    question: str
    answer: str
    exact: bool = True  # graded by match (False: by the model, against RUBRIC)


PATH = re.compile(r"(?<![\w/.-])(?:\.{1,2}/)?(?:[\w.-]+/)+[\w-]+\.[A-Za-z]{1,5}\b")
ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): ([^\n]{8,160})")
DEFINED = re.compile(r"\b(?:def|class) ([A-Za-z_]\w{3,})\b")
DECIDED = re.compile(r"\b(?:I will|I'll|Let me|Now I need to|The fix is to) ([^.\n]{12,160})")

ASK_PATH = "Earlier in this conversation a file named `{cue}` appeared. What is its full path?"
ASK_ERROR = "Earlier in this conversation a `{cue}` was raised. What message did it carry?"
ASK_DEFINED = "Earlier in this conversation a file's source defined `{cue}`. Which file was it?"
ASK_NEXT = "Earlier in this conversation the agent ran `{cue}`. What command did it run next?"
ASK_OUTPUT = "Earlier in this conversation the agent ran `{cue}`. What did it print first?"
ASK_DECIDED = 'Earlier in this conversation the assistant said: "{cue} ...". How did it go on?'
ANSWER_ONLY = " Answer with that alone, exactly as it appeared, or with UNKNOWN."

RUBRIC = (
    "You grade an answer against the expected one. The question was about a conversation; "
    "the expected answer is what the conversation said. Reply with exactly CORRECT when the "
    "answer states the same thing (wording may differ, the substance may not), else with "
    "exactly WRONG.\n\nQuestion: {question}\nExpected: {expected}\nAnswer: {answer}"
)


def text_of_message(message: Message) -> str:
    """A message's text with its calls' arguments: everything a model reads of it."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p.get("text", "") for p in content if isinstance(p, dict)]
        text = "\n".join(p for p in parts if isinstance(p, str))
    else:
        text = content if isinstance(content, str) else ""
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            text += f"\n{function.get('arguments', '')}"
    return text


def commands(messages: Iterable[Message]) -> list[str]:
    """The shell commands the agent ran, in order: a call's ``command`` argument, or a
    ```bash block of an agent without native tool calls."""
    found: list[str] = []
    for message in messages:
        if message.get("role") != "assistant":
            continue
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            function = call.get("function") if isinstance(call, dict) else None
            arguments = function.get("arguments") if isinstance(function, dict) else None
            if isinstance(arguments, str):
                match = re.search(r'"(?:command|cmd)"\s*:\s*"((?:[^"\\]|\\.)*)"', arguments)
                if match:
                    found.append(match.group(1).encode().decode("unicode_escape"))
        content = message.get("content")
        if isinstance(content, str):
            found += [b.strip() for b in re.findall(r"```bash\n(.*?)```", content, re.S)]
    return [c for c in found if c]


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def _normal_path(path: str) -> str:
    return path.removeprefix("./")


def probes_for(removed: Sequence[Message], history: Sequence[Message]) -> list[Probe]:
    """The probes about ``removed`` (messages the policy took out of view, whole or in part:
    summarized, masked, cut) whose cue is unambiguous in ``history``."""
    whole = "\n".join(text_of_message(m) for m in history)
    gone = "\n".join(text_of_message(m) for m in removed)
    found: list[Probe] = []
    paths = {_normal_path(p) for p in PATH.findall(whole)}
    by_name: dict[str, set[str]] = {}
    for path in paths:
        by_name.setdefault(_basename(path), set()).add(path)
    for path in sorted({_normal_path(p) for p in PATH.findall(gone)}):
        if len(by_name.get(_basename(path), ())) == 1:
            question = ASK_PATH.format(cue=_basename(path)) + ANSWER_ONLY
            found.append(Probe(ProbeKind.ARTIFACT, question, path))
    errors: dict[str, set[str]] = {}
    for kind, said in ERROR.findall(whole):
        errors.setdefault(kind, set()).add(said.strip())
    for kind, said in ERROR.findall(gone):
        if len(errors[kind]) == 1:
            question = ASK_ERROR.format(cue=kind) + ANSWER_ONLY
            found.append(Probe(ProbeKind.RECALL, question, said.strip()))
    found += _definitions(removed, history)
    found += _outputs(removed, history)
    ran = commands(history)
    gone_commands = set(commands(removed))
    for before, after in itertools.pairwise(ran):
        if after in gone_commands and ran.count(before) == 1:
            question = ASK_NEXT.format(cue=before) + ANSWER_ONLY
            found.append(Probe(ProbeKind.CONTINUATION, question, after))
    for message in removed:
        if message.get("role") != "assistant":
            continue
        for said in DECIDED.findall(text_of_message(message)):
            words = said.split()
            if len(words) < 6:
                continue
            cue = " ".join(words[:4])
            if whole.count(cue) == 1:
                rest = " ".join(words[4:])
                question = ASK_DECIDED.format(cue=cue) + " Answer in one sentence, or UNKNOWN."
                found.append(Probe(ProbeKind.DECISION, question, rest, exact=False))
    return _unique(found)


def _definitions(removed: Sequence[Message], history: Sequence[Message]) -> list[Probe]:
    """Where a name is defined: a file's printed source (the output of a command naming one
    path) that defines it, the name defined in no other output."""
    outputs: dict[str, list[str]] = {}  # name -> the files printed defining it
    printed: dict[int, str] = {}  # output message id -> file
    pending: list[str] = []
    for message in history:
        role = message.get("role")
        if role == "assistant":
            ran = commands([message])
            pending = [_normal_path(p) for c in ran for p in PATH.findall(c)]
        elif role in ("tool", "user") and len(set(pending)) == 1:
            printed[id(message)] = pending[0]
            for name in set(DEFINED.findall(text_of_message(message))):
                outputs.setdefault(name, []).append(pending[0])
    found = []
    for message in removed:
        path = printed.get(id(message))
        if path is None:
            continue
        for name in sorted(set(DEFINED.findall(text_of_message(message)))):
            if len(set(outputs.get(name, ()))) == 1:
                question = ASK_DEFINED.format(cue=name) + ANSWER_ONLY
                found.append(Probe(ProbeKind.RECALL, question, path))
    return found


def _outputs(removed: Sequence[Message], history: Sequence[Message]) -> list[Probe]:
    """What a command printed first: the first line of the output answering a message that ran
    one command (run once in the whole history), where that output was taken out of view."""
    ran = commands(history)
    gone = {id(m) for m in removed}
    found = []
    for call, output in itertools.pairwise(history):
        if call.get("role") != "assistant" or output.get("role") not in ("tool", "user"):
            continue
        command = commands([call])
        if len(command) != 1 or ran.count(command[0]) != 1 or id(output) not in gone:
            continue
        first = first_line(text_of_message(output))
        if first is not None:
            question = ASK_OUTPUT.format(cue=command[0]) + ANSWER_ONLY
            found.append(Probe(ProbeKind.RECALL, question, first))
    return found


def first_line(output: str) -> str | None:
    """An output's first line worth asking for: not blank, 8 to 160 characters."""
    for line in output.splitlines():
        line = line.strip()
        if line:
            return line if 8 <= len(line) <= 160 else None
    return None


def _unique(probes: Iterable[Probe]) -> list[Probe]:
    seen: set[str] = set()
    kept = []
    for probe in probes:
        if probe.question not in seen:
            seen.add(probe.question)
            kept.append(probe)
    return kept


def answer_from(question: str, shown: str) -> str:
    """A probe's answer read off ``shown`` (all a model was shown) by the rules that made it,
    UNKNOWN when it is not there: how a model answers that can only repeat what it sees. For
    the fake model of the tests; never used to grade."""
    for template, rule in ((ASK_PATH, _path_of), (ASK_ERROR, _error_of)):
        cue = _cue(template, question)
        if cue is not None:
            return rule(cue, shown) or "UNKNOWN"
    cue = _cue(ASK_NEXT, question)
    if cue is not None:
        ran = commands_in(shown)
        after = [ran[i + 1] for i, c in enumerate(ran[:-1]) if c == cue]
        return after[0] if after else "UNKNOWN"
    cue = _cue(ASK_DEFINED, question)
    if cue is not None:
        return _defined_in(cue, shown) or "UNKNOWN"
    cue = _cue(ASK_OUTPUT, question)
    if cue is not None:
        return printed_first(cue, shown) or "UNKNOWN"
    cue = _cue(ASK_DECIDED, question)
    if cue is not None:
        at = shown.find(cue)
        return shown[at + len(cue) :].split(".")[0].strip() if at >= 0 else "UNKNOWN"
    return "UNKNOWN"


def _cue(template: str, question: str) -> str | None:
    head, _, tail = template.partition("{cue}")
    if not question.startswith(head):
        return None
    rest = question[len(head) :]
    end = rest.find(tail)
    return rest[:end] if end >= 0 else None


def _path_of(name: str, shown: str) -> str | None:
    paths = [_normal_path(p) for p in PATH.findall(shown) if _basename(p) == name]
    return paths[0] if paths else None


def _error_of(kind: str, shown: str) -> str | None:
    said = [m for k, m in ERROR.findall(shown) if k == kind]
    return said[0].strip() if said else None


COMMAND_IN_TEXT = re.compile(r'"(?:command|cmd)"\s*:\s*"((?:[^"\\]|\\.)*)"|```bash\n(.*?)```', re.S)


def commands_in(shown: str) -> list[str]:
    """The commands in ``shown``, in the order they appear."""
    return [command for _, command in command_positions(shown)]


def command_positions(shown: str) -> list[tuple[int, str]]:
    """The commands in ``shown``, each with where it appears."""
    found = []
    for match in COMMAND_IN_TEXT.finditer(shown):
        argument, block = match.groups()
        command = argument.encode().decode("unicode_escape") if argument else block.strip()
        found.append((match.start(), command))
    return found


OUTPUT_MARK = re.compile(r"^\[(?:tool|user)\]\n", re.M)  # a transcript's output message
PRINTED = " printed first: "  # how a summary of the fake model notes it


def printed_first(command: str, shown: str) -> str | None:
    """The first line ``command`` printed, read off a transcript: the first line of the output
    message after it (``[tool]`` or ``[user]`` opening each), or what follows ``PRINTED`` on
    the command's own line."""
    for at, ran in command_positions(shown):
        if ran == command:
            line = shown[at:].split("\n", 1)[0]
            if PRINTED in line:
                return line.split(PRINTED, 1)[1].strip()
            after = OUTPUT_MARK.search(shown, at)
            return first_line(shown[after.end() :]) if after else None
    return None


def _defined_in(name: str, shown: str) -> str | None:
    at = re.search(rf"\b(?:def|class) {re.escape(name)}\b", shown)
    if at is None:
        return None
    paths = PATH.findall(shown[: at.start()])
    return _normal_path(paths[-1]) if paths else None
