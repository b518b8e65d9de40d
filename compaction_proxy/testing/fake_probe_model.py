"""A fake model for ``compaction-proxy eval``'s tests: it answers from what it is shown.

``POST /v1/chat/completions``:

* a probe (the conversation as a transcript, the question after it) is answered by the rules
  that made the probe, read off the transcript (``evaluation.probes.answer_from``): a fact in
  view is answered right, one cleared or summarized away is not;
* a grading request (``evaluation.probes.RUBRIC``) says CORRECT when most of the expected
  answer's words are in the answer;
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
from compaction_proxy.evaluation.probes import (
    DEFINED,
    ERROR,
    PATH,
    answer_from,
    commands,
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

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/chat/completions", self._complete)
        return app

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages: list[dict[str, Any]] = body.get("messages") or []
        last = str(messages[-1].get("content") or "") if messages else ""
        if last.startswith(INSTRUCTION_OPENING):
            self.summaries += 1
            careful = self.careful and not str(body.get("model", "")).startswith(FORGETFUL)
            text = careful_summary(messages[:-1]) if careful else fake_summary(body)
        elif last.startswith(RUBRIC_OPENING):
            text = _graded(last)
        else:
            shown, _, question = last.partition("</conversation>")
            self.asked.append(question.strip())
            text = answer_from(question.strip(), shown)
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        usage = {"prompt_tokens": len(str(messages)) // 4, "completion_tokens": len(text) // 4}
        return web.json_response(
            {
                "object": "chat.completion",
                "choices": [{**choice, "finish_reason": "stop"}],
                "usage": usage,
            }
        )


def careful_summary(messages: list[dict[str, Any]]) -> str:
    """A checkpoint whose sections carry every fact line of ``messages``, written so that the
    probes' rules read them back (commands as their call's argument, a definition after the
    file it was printed from)."""
    facts: list[str] = []
    printed: str | None = None  # the one file the last command named
    for message in messages:
        text = text_of_message(message)
        facts += [f"file {p}" for p in PATH.findall(text)]
        facts += [f"{kind}: {said}" for kind, said in ERROR.findall(text)]
        if message.get("role") == "assistant":
            ran = commands([message])
            facts += [f"ran {json.dumps({'command': c})}" for c in ran]
            named = {p for c in ran for p in PATH.findall(c)}
            printed = named.pop() if len(named) == 1 else None
        elif printed is not None:
            facts += [f"{printed} defines {name}: def {name}" for name in DEFINED.findall(text)]
    kept = list(dict.fromkeys(facts))
    body = "\n".join(f"- {fact}" for fact in kept) or "None."
    sections = [f"## {s}\n{body if s == 'Critical Context' else 'None.'}" for s in SECTIONS]
    return "\n".join(sections)


def _graded(ask: str) -> str:
    expected = re.search(r"\nExpected: (.*)\nAnswer: (.*)", ask, re.S)
    if expected is None:
        return "WRONG"
    want = set(expected.group(1).lower().split())
    given = set(expected.group(2).lower().split())
    return "CORRECT" if want and len(want & given) * 2 >= len(want) else "WRONG"
