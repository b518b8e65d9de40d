"""Which user messages are an agent's outputs, not a person's words (pure).

Agents without native tool calling (mini-SWE-agent, SWE-agent, OpenHands without function
calls) return each command's output to the model as a ``user`` message. Those are observations:
compaction may shorten them like tool results. Every other user message is a person's words
(a task, a question, a pasted document or contract), and no cut ever touches it: a model that
answers from part of what a person wrote, as if it had read it all, loses their data silently.

The decision rests on evidence in the conversation, never on size: a user message is an agent's
output when it answers an assistant message and opens the way such outputs open, with the
markers these agents write around a command's result (``AGENT_OUTPUT_OPENINGS``). A person's
paste that happens to be long, or a chat whose assistant suggested shell commands, shows none.
The task (the first user message) never counts, whatever it holds.
"""

from __future__ import annotations

import re

from compaction_proxy.conversation.messages import Message
from compaction_proxy.conversation.text import text_of

# How an agent's returned output opens (after white space), by agent:
# mini-SWE-agent ``<returncode>0</returncode>\n<output>``, SWE-agent ``OBSERVATION:``, OpenHands
# ``EXECUTION RESULT of [execute_bash]:``, and the bare ``<output>``/``<stdout>`` wrappers.
AGENT_OUTPUT_OPENINGS = re.compile(
    r"\s*(?:<returncode>|<output>|<stdout>|<stderr>|<exit_code>|OBSERVATION:|Observation:"
    r"|EXECUTION RESULT)"
)
_OPENING_CHARS = 256  # how far into a message its opening is looked for


def is_agent_output(message: Message, previous: Message | None) -> bool:
    """Whether ``message`` (a user message) is an observation-style agent's output: it
    answers an assistant message (``previous``) and opens with an agent's output markers."""
    if message.get("role") != "user" or previous is None or previous.get("role") != "assistant":
        return False
    text = text_of(message.get("content"))
    return text is not None and AGENT_OUTPUT_OPENINGS.match(text[:_OPENING_CHARS]) is not None
