"""The shared agent transcripts: where they are and how a client replays them."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import orjson

TRANSCRIPTS_DIR = Path(
    os.environ.get(
        "TRANSCRIPTS_DIR", Path(__file__).resolve().parents[2] / "shared" / "transcripts"
    )
)


def transcript_paths() -> list[Path]:
    return sorted(TRANSCRIPTS_DIR.glob("*.messages.json"))


def load(path: Path) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = orjson.loads(path.read_bytes())
    return messages


def replay_requests(messages: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """What the agent posted: before every assistant message, the whole history so far."""
    return [messages[:i] for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]
