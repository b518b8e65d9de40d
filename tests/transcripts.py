"""Agent conversations to replay: the real transcripts when at hand, synthetic ones always.

Real transcripts come from ``TRANSCRIPTS_DIR`` (default: ``../shared/transcripts`` beside the
checkout, when it exists). A fresh clone has none, and the synthetic conversations of
``tests/synthetic.py`` (tool calls, big file reads, parallel calls, observation style) keep every
replay test meaningful without them.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

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
