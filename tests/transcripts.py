"""Agent conversations to replay: the real transcripts when at hand, synthetic ones always.

Real transcripts come from ``TRANSCRIPTS_DIR`` (default: ``../shared/transcripts`` beside the
checkout, when it exists). A fresh clone has none, and the synthetic conversations of
``tests/synthetic.py`` (tool calls, big file reads, parallel calls, observation style) keep every
replay test meaningful without them.
"""

from __future__ import annotations

import json
import os
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from compaction_proxy.conversation.text import text_of
from compaction_proxy.formats.anthropic_summary import summary_messages_body
from tests.synthetic import agent_conversation, synthetic_transcripts

Message = dict[str, Any]

TRANSCRIPTS_DIR = Path(
    os.environ.get(
        "TRANSCRIPTS_DIR", Path(__file__).resolve().parents[2] / "shared" / "transcripts"
    )
)


@dataclass(frozen=True)
class Transcript:
    name: str
    messages: list[Message]


def transcript_paths() -> list[Path]:
    return sorted(TRANSCRIPTS_DIR.glob("*.messages.json"))


def load(path: Path) -> list[Message]:
    messages: list[Message] = orjson.loads(path.read_bytes())
    return messages


def transcripts() -> list[Transcript]:
    """The real transcripts (if any), then the synthetic ones."""
    real = [Transcript(p.name.split(".")[0], load(p)) for p in transcript_paths()]
    synthetic = [Transcript(name, m) for name, m in synthetic_transcripts().items()]
    return real + synthetic


def transcript_named(fragment: str) -> Transcript:
    """The real transcript whose name holds ``fragment``, else a modest synthetic conversation
    of its own (30 turns of short outputs, seeded by ``fragment``)."""
    real = next((t for t in transcripts() if fragment in t.name), None)
    if real is not None:
        return real
    seed = zlib.crc32(fragment.encode())
    return Transcript(fragment, agent_conversation(seed, turns=30, output_chars=(300, 3_000)))


# What a replay plants in the first user message and checks in the last request.
FACTS = [
    "FACT-17: the staging database is pg-stage-3.internal on port 6432",
    "FACT-23: never touch the vendored copy under third_party/legacy",
]


def plant_facts(messages: list[dict[str, Any]], run: str) -> list[dict[str, Any]]:
    planted = [dict(m) for m in messages]
    first_user = next(i for i, m in enumerate(planted) if m["role"] == "user")
    facts = "\n".join(FACTS) + f"\nrun {run} {uuid.uuid4().hex}\n\n"
    planted[first_user]["content"] = facts + str(planted[first_user]["content"])
    return planted


REPLAY_WINDOWS = (8_000, 16_000, 32_000)  # the windows the replays' fake upstream enforces


def replay_requests(messages: list[Message]) -> list[list[Message]]:
    """What the agent posted: before every assistant message, the whole history so far."""
    return [messages[:i] for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


# -- variants ------------------------------------------------------------------------------


def observation_style(messages: list[Message]) -> list[Message]:
    """As an agent without native tool calling sends it: tool calls become assistant text
    (one ```bash block per call), tool results become one user message per turn."""
    converted: list[Message] = []
    for message in messages:
        calls = message.get("tool_calls") or []
        if message.get("role") == "assistant" and calls:
            commands = [_command(call) for call in calls]
            blocks = "\n\n".join(f"```bash\n{command}\n```" for command in commands)
            text = str(message.get("content") or "").strip()
            converted.append({"role": "assistant", "content": f"{text}\n\n{blocks}".strip()})
        elif message.get("role") == "tool":
            output = str(message.get("content") or "")
            previous = converted[-1] if converted else None
            if previous is not None and previous.get("observation"):
                previous["content"] += "\n" + output
            else:
                converted.append({"role": "user", "content": output, "observation": True})
        else:
            converted.append(dict(message))
    return [{k: v for k, v in m.items() if k != "observation"} for m in converted]


def _command(call: Message) -> str:
    arguments = (call.get("function") or {}).get("arguments") or "{}"
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return str(arguments)
    return str(parsed.get("command", arguments)) if isinstance(parsed, dict) else str(arguments)


def reused_ids(messages: list[Message]) -> list[Message]:
    """As clients that number calls per turn send it: every call id is ``call_0``."""
    converted: list[Message] = []
    for message in messages:
        copy = dict(message)
        if message.get("tool_calls"):
            copy["tool_calls"] = [{**call, "id": "call_0"} for call in message["tool_calls"]]
        if message.get("role") == "tool":
            copy["tool_call_id"] = "call_0"
        converted.append(copy)
    return converted


VARIANTS = {
    "as-sent": lambda messages: messages,
    "observations": observation_style,
    "reused-ids": reused_ids,
}


# -- Anthropic's Messages form -------------------------------------------------------------

# The transcripts' shell tool as Anthropic declares tools, Claude Code's breakpoint on it.
# The replays' one tool, as each API declares it.
BASH_PARAMETERS = {
    "type": "object",
    "properties": {"command": {"type": "string"}},
    "required": ["command"],
}
BASH = {"name": "bash", "description": "Run a shell command."}
CHAT_BASH = {"type": "function", "function": {**BASH, "parameters": BASH_PARAMETERS}}
RESPONSES_BASH = {"type": "function", **BASH, "parameters": BASH_PARAMETERS}
BASH_TOOL = [CHAT_BASH]  # a chat request's ``tools``
ANTHROPIC_BASH = {**BASH, "input_schema": BASH_PARAMETERS, "cache_control": {"type": "ephemeral"}}


def as_messages_body(model: str, history: list[Message], max_tokens: int = 512) -> dict[str, Any]:
    """A chat history as the Messages request Claude Code would send for it: the system
    prompt and tool carrying a breakpoint each, calls and results as ``tool_use`` and
    ``tool_result`` blocks (the results of one round in one user turn), and a third breakpoint
    moving on the newest user block."""
    body = summary_messages_body({"model": model, "messages": history, "max_tokens": max_tokens})
    body.pop("tool_choice", None)
    body["tools"] = [ANTHROPIC_BASH]
    body["system"] = [
        {
            "type": "text",
            "text": body.get("system") or "You are an agent.",
            "cache_control": {"type": "ephemeral"},
        }
    ]
    newest = body["messages"][-1]
    if isinstance(newest["content"], str):
        newest["content"] = [{"type": "text", "text": newest["content"] or "(empty)"}]
    newest["content"][-1] = {**newest["content"][-1], "cache_control": {"type": "ephemeral"}}
    return body


def as_responses_body(model: str, history: list[Message]) -> dict[str, Any]:
    """A chat history as the Responses request Codex would send for it: the system prompt as
    ``instructions``, assistant text as an output message, each call as a ``function_call``
    item and each result as its ``function_call_output``; the bash tool when calls are made."""
    items: list[Any] = []
    instructions = None
    for message in history:
        role, content = message.get("role"), message.get("content")
        text = text_of(content) or ""
        if role == "system":
            instructions = text if instructions is None else f"{instructions}\n\n{text}"
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            items.append({"type": "function_call_output", "call_id": call_id, "output": text})
        elif role == "assistant":
            if text:
                items.append(
                    {
                        "type": "message",
                        "role": "assistant",
                        "content": [{"type": "output_text", "text": text}],
                    }
                )
            for call in message.get("tool_calls") or []:
                function = call.get("function") or {}
                items.append(
                    {
                        "type": "function_call",
                        "call_id": str(call.get("id") or ""),
                        "name": str(function.get("name") or "bash"),
                        "arguments": str(function.get("arguments") or "{}"),
                    }
                )
        else:
            items.append({"type": "message", "role": "user", "content": text or "(empty)"})
    body: dict[str, Any] = {"model": model, "input": items, "store": False}
    if instructions is not None:
        body["instructions"] = instructions
    if any(item["type"] == "function_call" for item in items):
        body["tools"] = [RESPONSES_BASH]
    return body


def plain_text(content: Any) -> str:
    """The text of a message's content, its parts' texts joined."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content or "")


def as_items(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A chat history as Responses input items."""
    items: list[dict[str, Any]] = []
    for message in messages:
        role = message["role"]
        if role == "tool":
            output = plain_text(message.get("content"))
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": message["tool_call_id"],
                    "output": output,
                }
            )
            continue
        if message.get("content"):
            items.append({"role": role, "content": plain_text(message["content"])})
        for call in message.get("tool_calls") or []:
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"],
                }
            )
    return items
