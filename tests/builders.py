"""Small message builders for tests."""

from __future__ import annotations

import uuid
from typing import Any

Message = dict[str, Any]


def system(text: str = "You are a coding agent.") -> Message:
    return {"role": "system", "content": text}


def user(text: str) -> Message:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, *calls: tuple[str, str, str]) -> Message:
    message: Message = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = [
            {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}
            for cid, name, args in calls
        ]
    return message


def tool(call_id: str, text: str) -> Message:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def agent_turns(count: int, *, output: str = "output") -> list[Message]:
    """``count`` rounds of assistant tool call + tool result."""
    messages: list[Message] = []
    for i in range(count):
        messages.append(assistant(None, (f"call_{i}", "bash", f'{{"command": "step {i}"}}')))
        messages.append(tool(f"call_{i}", f"{output} {i}"))
    return messages


def file_output(seed: str, words: int = 900) -> str:
    """About 2.7k tokens of a tool's output, under the pruner's threshold."""
    return " ".join(f"{seed}{i % 89}" for i in range(words))


def agent_history(rounds: int = 6, words: int = 900) -> list[dict[str, Any]]:
    """An agent reading ``rounds`` files: over a 16k window's threshold from about five."""
    tag = uuid.uuid4().hex[:8]
    messages = [system(), user(f"FACT-7: ticket {tag}. Fix the importer.")]
    for index in range(rounds):
        call = f"call_{index}"
        messages.append(assistant(None, (call, "read_file", f'{{"path": "src/m{index}.py"}}')))
        messages.append(tool(call, file_output(f"m{index}x", words)))
    messages.append(user("Where are we?"))
    return messages


class Clock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now
