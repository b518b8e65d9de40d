"""A scripted coding agent's model for the OpenAI formats (chat completions and Responses), so
real agents (Codex, opencode) can be run against the fake provider (pure functions).

Its policy: print one data file per turn with the agent's shell tool, then answer naming how
many it read. It reads how far it got from the request itself: every data file opens with a
``FACT-n`` line naming it (``data_file``), and that line survives in a pruned output's head and
in a summary (the proxy's or the agent's own), so a compacted history still tells it.

A request that asks for a summary of the conversation (an agent compacting on its own: no
tools offered, or a last user message asking for one) is answered with one that keeps every
``FACT-n`` line, as a summarizing model would.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import orjson

from compaction_proxy.frozen import frozen

FACT_BASE = 100  # data file k is named by FACT-(100 + k)
_FACT = re.compile(r"FACT-(\d+):[^\n<\"\\]*")
_ASKS_FOR_SUMMARY = re.compile(
    r"CONTEXT CHECKPOINT COMPACTION|summary of (the|our) conversation|summarize (the|this|our) "
    r"conversation|detailed summary",
    re.IGNORECASE,
)


def data_file(index: int, size: int = 24_000) -> str:
    """Data file ``index``: its ``FACT`` line, then rows up to about ``size`` characters."""
    lines = [f"FACT-{FACT_BASE + index}: data file {index} was printed."]
    row = 0
    while sum(len(line) + 1 for line in lines) < size:
        lines.append(f"row {index}.{row}: " + "value " * 12)
        row += 1
    return "\n".join(lines)


@frozen
class ShellCall:
    call_id: str
    name: str
    arguments: str  # JSON, as the API carries it


Move = ShellCall | str


def shell_arguments(tool: str, command: str) -> dict[str, Any]:
    """The shell tool's arguments as each agent declares them: Codex's ``exec_command``
    takes ``cmd``, its older ``shell`` an argv, opencode's and Claude Code's ``bash`` a
    ``command`` with a ``description``."""
    if tool == "exec_command":
        return {"cmd": command}
    if tool == "shell":
        return {"command": ["bash", "-lc", command]}
    return {"command": command, "description": "Print a data file"}


SHELL_TOOLS = ("exec_command", "shell", "bash", "Bash")


def tool_names(tools: Any) -> list[str]:
    """The function tools a request offers, in chat's shape or Responses' flat one."""
    names = []
    for tool in tools if isinstance(tools, list) else []:
        if not isinstance(tool, dict):
            continue
        function = tool.get("function")
        declared = function if isinstance(function, dict) else tool
        if isinstance(declared.get("name"), str):
            names.append(declared["name"])
    return names


def facts_in(text: str) -> list[str]:
    found: list[str] = []
    for match in _FACT.finditer(text):
        if match.group(0).strip() not in found:
            found.append(match.group(0).strip())
    return found


def asks_for_summary(last_user_text: str, tools: Sequence[str]) -> bool:
    return not tools or bool(_ASKS_FOR_SUMMARY.search(last_user_text))


def agent_summary(request_text: str) -> str:
    """An agent's own summary of the conversation: every ``FACT-n`` line it holds."""
    facts = "\n".join(f"- {fact}" for fact in facts_in(request_text))
    return f"Summary of the work so far.\n{facts}\nNext: go on with the next data file."


@frozen
class FileReader:
    """The policy over ``files`` (paths the shell can print)."""

    files: Sequence[str]

    def move(self, request_text: str, last_user_text: str, tools: Sequence[str], turn: int) -> Move:
        if asks_for_summary(last_user_text, tools):
            return agent_summary(request_text)
        printed = {
            int(m.group(1)) - FACT_BASE
            for m in _FACT.finditer(request_text)
            if int(m.group(1)) >= FACT_BASE
        }
        step = max(printed, default=-1) + 1
        shell = next((name for name in tools if name in SHELL_TOOLS), None)
        if "No such file" in request_text:  # a path the agent's shell cannot see: stop
            return "Could not read a data file."
        if step >= len(self.files) or shell is None:
            return f"Read all {len(self.files)} files."
        arguments = orjson.dumps(shell_arguments(shell, f"cat {self.files[step]}")).decode()
        return ShellCall(call_id=f"call_fake{turn:04d}", name=shell, arguments=arguments)


def text_of_request(value: Any) -> str:
    return orjson.dumps(value).decode() if not isinstance(value, str) else value


def last_user_text(messages: Any) -> str:
    """The text of the last user message (chat) or user input item (Responses)."""
    for message in reversed(messages if isinstance(messages, list) else []):
        if isinstance(message, dict) and message.get("role") == "user":
            return text_of_request(message.get("content"))
    return ""


def chat_answer(move: Move) -> tuple[dict[str, Any], str]:
    """The assistant message of a chat completion for ``move``, and its finish reason."""
    if isinstance(move, str):
        return {"role": "assistant", "content": move}, "stop"
    call = {
        "id": move.call_id,
        "type": "function",
        "function": {"name": move.name, "arguments": move.arguments},
    }
    return {"role": "assistant", "content": None, "tool_calls": [call]}, "tool_calls"


def chat_deltas(move: Move) -> list[dict[str, Any]]:
    """The streamed deltas of ``move`` after the role's: text, or one tool call."""
    if isinstance(move, str):
        return [{"content": move}]
    opened = {
        "index": 0,
        "id": move.call_id,
        "type": "function",
        "function": {"name": move.name, "arguments": ""},
    }
    filled = {"index": 0, "function": {"arguments": move.arguments}}
    return [{"tool_calls": [opened]}, {"tool_calls": [filled]}]


def responses_item(move: Move, number: int) -> dict[str, Any]:
    """The Responses output item for ``move``."""
    if isinstance(move, str):
        return {
            "type": "message",
            "id": f"msg_fake{number}",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": move, "annotations": []}],
        }
    return {
        "type": "function_call",
        "id": f"fc_fake{number}",
        "call_id": move.call_id,
        "name": move.name,
        "arguments": move.arguments,
        "status": "completed",
    }
