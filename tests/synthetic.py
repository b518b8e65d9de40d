"""Synthetic coding-agent conversations, standing in for real transcripts on a fresh clone.

Deterministic (seeded) and shaped like a real agent run: a system prompt, a long task message,
then turns of reasoning with a shell tool call and its output. Some turns make parallel calls,
some read big files; a conversation can also be observation style (no tool calling: commands in
the assistant's text, output back as user messages), as agents without native tool calling do.
"""

from __future__ import annotations

import random
from typing import Any

Message = dict[str, Any]

WORDS = [
    "parser",
    "token",
    "node",
    "visit",
    "field",
    "model",
    "query",
    "cache",
    "index",
    "schema",
    "migration",
    "value",
    "error",
    "result",
    "buffer",
    "stream",
    "handler",
    "request",
    "response",
    "config",
    "option",
    "default",
    "path",
    "module",
    "import",
    "return",
    "yield",
    "raise",
    "class",
    "def",
    "self",
    "args",
    "kwargs",
    "list",
    "dict",
    "tuple",
    "none",
    "true",
    "false",
    "test",
    "fixture",
]
SYSTEM = "You are a helpful assistant that can interact with a computer shell to solve tasks."


def _words(rng: random.Random, count: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(count))


def _code(rng: random.Random, chars: int) -> str:
    """Numbered source lines, like ``cat -n`` of a Python file."""
    lines: list[str] = []
    size = 0
    number = 1
    while size < chars:
        indent = "    " * rng.randint(0, 3)
        name = f"{rng.choice(WORDS)}_{rng.randint(0, 99)}"
        line = f"{number:6}\t{indent}{rng.choice(['def', 'if', 'return', 'for'])} {name}("
        line += ", ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 3))) + "):"
        lines.append(line)
        size += len(line) + 1
        number += 1
    return "\n".join(lines)[:chars]


def _output(rng: random.Random, chars: int) -> str:
    return f"<returncode>0</returncode>\n<output>\n{_code(rng, chars)}\n</output>"


def agent_conversation(
    seed: int,
    turns: int,
    *,
    observation_style: bool = False,
    parallel_every: int = 6,
    big_reads: dict[int, int] | None = None,
    output_chars: tuple[int, int] = (300, 9_000),
) -> list[Message]:
    """``turns`` agent turns after the task. ``big_reads`` maps a turn to the size (in
    characters) of a file it reads; other outputs are ``output_chars`` characters long."""
    rng = random.Random(seed)
    big_reads = big_reads or {}
    task = (
        "<pr_description>\n"
        + "\n".join(_words(rng, 18) for _ in range(12))
        + "\n</pr_description>\n\n<instructions>\n"
        + "\n".join(f"{i}. {_words(rng, 14)}" for i in range(1, 60))
        + "\n</instructions>"
    )
    messages: list[Message] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": task},
    ]
    for turn in range(turns):
        calls = 2 if parallel_every and turn % parallel_every == parallel_every - 1 else 1
        commands = [f"grep -rn {rng.choice(WORDS)} src/ | head -{rng.randint(5, 80)}"]
        outputs = [big_reads.get(turn, rng.randint(*output_chars))]
        if turn in big_reads:
            commands = [f"cat -n src/{rng.choice(WORDS)}/{rng.choice(WORDS)}.py"]
        if calls == 2:
            commands.append(f"sed -n '{rng.randint(1, 400)},+40p' src/{rng.choice(WORDS)}.py")
            outputs.append(rng.randint(300, 3_000))
        thought = f"THOUGHT: {_words(rng, rng.randint(20, 70))}"
        if observation_style:
            blocks = "\n\n".join(f"```bash\n{c}\n```" for c in commands)
            messages.append({"role": "assistant", "content": f"{thought}\n\n{blocks}"})
            observation = "\n".join(_output(rng, size) for size in outputs)
            messages.append({"role": "user", "content": observation})
            continue
        ids = [f"call_{seed}_{turn}_{i}" for i in range(calls)]
        messages.append(
            {
                "role": "assistant",
                "content": thought,
                "tool_calls": [
                    {
                        "id": call_id,
                        "type": "function",
                        "function": {"name": "bash", "arguments": f'{{"command": "{command}"}}'},
                    }
                    for call_id, command in zip(ids, commands, strict=True)
                ],
            }
        )
        for call_id, size in zip(ids, outputs, strict=True):
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": _output(rng, size)}
            )
    messages.append({"role": "assistant", "content": "THOUGHT: done.\n\n```bash\nsubmit\n```"})
    return messages


def synthetic_transcripts() -> dict[str, list[Message]]:
    """The conversations replayed when no real transcripts are at hand (and alongside them)."""
    return {
        "synthetic-tools": agent_conversation(
            1, turns=70, big_reads={10: 20_000, 33: 14_000, 50: 20_000}
        ),
        # Like the Gemini runs: observations as user messages, one of them about 11k tokens.
        "synthetic-observations": agent_conversation(
            2, turns=45, observation_style=True, parallel_every=0, big_reads={12: 40_000}
        ),
    }
