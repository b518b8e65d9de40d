"""A fake model for ``compaction-proxy eval``'s tests: it answers from what it is shown.

``POST /v1/chat/completions``:

* a probe (the conversation as a transcript, the question after it) is answered by the rules
  that made the probe, read off the transcript (``evaluation.probes.answer_from``): a fact in
  view is answered right, one cleared or summarized away is not;
* a grading request (``evaluation.probes.RUBRIC``) says CORRECT when most of the expected
  answer's words are in the answer;
* a request to write probes (``evaluation.generated_probes.GENERATE``) gets one: how a long
  line of the part shown goes on after its first words (and such a question, asked, is
  answered from the line where it is shown, UNKNOWN where it is not);
* a summary call (the proxy's instruction last) is answered with a summary that keeps, with
  ``careful``, every fact line of what it summarizes (paths, errors, definitions with their
  file, commands), or else only the ``FACT-n`` lines, as the other fakes do; a summary model
  whose name begins with ``forgetful`` is never careful (a policy naming it drops facts).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from compaction_proxy.compaction.summarize import INSTRUCTION_OPENING, SECTIONS
from compaction_proxy.evaluation.generated_probes import GENERATE
from compaction_proxy.evaluation.probes import (
    DEFINED,
    ERROR,
    PATH,
    PRINTED,
    answer_from,
    command_positions,
    printed_first,
    text_of_message,
)
from compaction_proxy.testing.fake_answers import fake_summary

RUBRIC_OPENING = "You grade an answer"
FORGETFUL = "forgetful"  # a summary model named so keeps only the FACT-n lines


@dataclass
class FakeProbeModel:
    careful: bool = True  # summaries keep every fact line
    asked: list[str] = field(default_factory=list)  # the probe questions, in order
    summaries: int = 0
    written: int = 0  # requests to write probes

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_post("/v1/messages", self._messages)
        return app

    async def _chat(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages: list[dict[str, Any]] = body.get("messages") or []
        last = str(messages[-1].get("content") or "") if messages else ""
        shown, _, asked = last.rpartition("</conversation>")
        if not shown:  # a summary call: its history, then the instruction
            history = (f"[{m.get('role')}]\n{text_of_message(m)}" for m in messages[:-1])
            shown, asked = "\n\n".join(history), last
        text = self._text(str(body.get("model", "")), asked.strip(), shown, body)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        usage = {"prompt_tokens": len(str(messages)) // 4, "completion_tokens": len(text) // 4}
        answer = {"choices": [{**choice, "finish_reason": "stop"}], "usage": usage}
        return web.json_response({"object": "chat.completion", **answer})

    async def _messages(self, request: web.Request) -> web.Response:
        """Anthropic's Messages API, as ``compaction-proxy eval --api anthropic`` asks it: one
        user turn, the conversation as a transcript before what is asked."""
        body = await request.json()
        prompt = str(body["messages"][-1]["content"])
        shown, _, asked = prompt.rpartition("</conversation>")
        text = self._text(str(body.get("model", "")), asked.strip() or prompt, shown, body)
        usage = {"input_tokens": len(prompt) // 4, "output_tokens": len(text) // 4}
        answer = {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": text}],
        }
        return web.json_response({**answer, "stop_reason": "end_turn", "usage": usage})

    def _text(self, model: str, asked: str, shown: str, body: dict[str, Any]) -> str:
        if asked.startswith(INSTRUCTION_OPENING):
            self.summaries += 1
            careful = self.careful and not model.startswith(FORGETFUL)
            cap = body.get("max_tokens") or body.get("max_completion_tokens") or 4096
            return careful_summary(shown, int(cap)) if careful else fake_summary(body)
        if asked.startswith(RUBRIC_OPENING):
            return _graded(asked)
        if asked.startswith(GENERATE_OPENING):
            self.written += 1
            return _written_probe(shown)
        self.asked.append(asked)
        line = re.match(LINE_ASKED, asked)
        if line is not None:
            return _line_after(line.group(1), shown)
        return answer_from(asked, shown)


def careful_summary(shown: str, max_tokens: int = 4096) -> str:
    """A checkpoint whose sections carry the fact lines of ``shown`` (what a summary call
    carried, as a transcript), written so that the probes' rules read them back: commands as
    their call's argument with the first line they printed, a definition after the file last
    named before it. As a model writes within its answer's ``max_tokens``, the newest facts
    are kept that fit about half of it (four characters a token)."""
    found = [(m.start(), f"file {m.group(0)}") for m in PATH.finditer(shown)]
    found += [(m.start(), f"{m.group(1)}: {m.group(2)}") for m in ERROR.finditer(shown)]
    for at, command in command_positions(shown):
        printed = printed_first(command, shown)
        noted = f"{PRINTED}{printed}" if printed else ""
        found.append((at, f"ran {json.dumps({'command': command})}{noted}"))
    for match in DEFINED.finditer(shown):
        before = PATH.findall(shown[: match.start()])
        if before:
            name = match.group(1)
            found.append((match.start(), f"{before[-1]} defines {name}: def {name}"))
    kept: list[str] = []
    room = 2 * max_tokens
    for fact in reversed(list(dict.fromkeys(fact for _, fact in sorted(found)))):
        if len(fact) + 3 <= room:  # a long one (a file written by a heredoc) is left out
            room -= len(fact) + 3
            kept.insert(0, fact)
    body = "\n".join(f"- {fact}" for fact in kept) or "None."
    sections = [f"## {s}\n{body if s == 'Critical Context' else 'None.'}" for s in SECTIONS]
    return "\n".join(sections)


GENERATE_OPENING = " ".join(GENERATE.split()[:4])
LINE_QUESTION = 'In the part shown, a line begins "{cue}". How does that line go on?'
LINE_ASKED = re.escape(LINE_QUESTION).replace(re.escape("{cue}"), "(.+?)")


def _written_probe(shown: str) -> str:
    """One probe about ``shown``: the longest line of eight words or more whose first five
    are found once, asked by those words."""
    lines = [line.strip() for line in shown.splitlines() if len(line.split()) >= 8]
    for line in sorted(lines, key=len, reverse=True):
        cue = " ".join(line.split()[:5])
        if shown.count(cue) == 1 and '"' not in cue:
            rest = line[line.index(cue) + len(cue) :].strip()
            probe = {"kind": "recall", "question": LINE_QUESTION.format(cue=cue), "answer": rest}
            return json.dumps(probe)
    return "No fact to ask about."


def _line_after(cue: str, shown: str) -> str:
    at = shown.find(cue)
    if at < 0:
        return "UNKNOWN"
    return shown[at + len(cue) :].split("\n", 1)[0].strip() or "UNKNOWN"


def _graded(ask: str) -> str:
    expected = re.search(r"\nExpected: (.*)\nAnswer: (.*)", ask, re.S)
    if expected is None:
        return "WRONG"
    want = set(expected.group(1).lower().split())
    given = set(expected.group(2).lower().split())
    return "CORRECT" if want and len(want & given) * 2 >= len(want) else "WRONG"
