"""Rescue cuts: the live turn's observations, largest first, only as far as needed (pure)."""

from __future__ import annotations

from typing import Any

from compaction_proxy.compaction.prune import Pruner
from compaction_proxy.compaction.rescue import RESCUE_MARKER, rescuable, rescue_cuts
from compaction_proxy.conversation.surface import SurfaceNode
from compaction_proxy.conversation.text import text_of
from tests.builders import assistant, tool, user


def chars(message: dict[str, Any]) -> int:
    """A price of four characters a token."""
    return len(text_of(message.get("content")) or "") // 4 + 1


def nodes(body: list[dict[str, Any]]) -> list[SurfaceNode]:
    return [SurfaceNode(m, "body", i, i) for i, m in enumerate(body)]


PRUNER = Pruner()


def cut_sizes(body: list[dict[str, Any]], live: int, need: int, pruner: Pruner = PRUNER) -> Any:
    cuts = rescue_cuts(nodes(body), body, live, pruner, chars, need)
    return None if cuts is None else {c.position: c.pruned.chars_after for c in cuts}


def test_the_largest_observation_is_cut_first_and_only_as_far_as_needed() -> None:
    body = [
        user("Run both."),
        assistant(None, ("a", "bash", "{}"), ("b", "bash", "{}")),
        tool("a", "a" * 40_000),
        tool("b", "b" * 100_000),
    ]
    sizes = cut_sizes(body, 2, need=5_000)  # 20,000 characters at four a token
    assert sizes is not None and list(sizes) == [3]
    assert 100_000 - 20_000 * 1.2 < sizes[3] < 100_000 - 20_000
    cut = rescue_cuts(nodes(body), body, 2, Pruner(), chars, 5_000)
    assert cut is not None and "Run a narrower command" in text_of(cut[0].pruned.content)


def test_several_are_cut_when_one_is_not_enough_and_none_when_all_are_not() -> None:
    body = [user("Go."), assistant(None, ("a", "bash", "{}"), ("b", "bash", "{}"))]
    body += [tool("a", "a" * 40_000), tool("b", "b" * 40_000)]
    sizes = cut_sizes(body, 2, need=15_000)
    assert sizes is not None and set(sizes) == {2, 3}
    assert cut_sizes(body, 2, need=25_000) is None  # 80,000 characters cannot save 100,000


def test_the_users_typed_text_beside_tool_results_is_never_cut() -> None:
    body = [user("Go."), assistant(None, ("a", "bash", "{}")), tool("a", "small output")]
    body.append(user("Also read this: " + "y" * 60_000))
    assert cut_sizes(body, 2, need=1_000) is None
    assert not rescuable(nodes(body), body, 2, PRUNER)  # so the history is not compacted for it


def test_an_observation_style_output_is_a_user_message_and_is_cut() -> None:
    output = "<returncode>0</returncode>\n<output>\n/\n" + "z" * 60_000
    body = [user("Go."), assistant("```bash\nls -R /\n```"), user(output)]
    sizes = cut_sizes(body, 2, need=5_000)
    assert sizes is not None and list(sizes) == [2]
    assert cut_sizes(body, 2, need=5_000, pruner=Pruner(user_messages=False)) is None
    assert "{removed}" in RESCUE_MARKER


PASTED = "WHEREAS the parties agree ... " * 2_000  # a 60k-character contract


def test_a_persons_words_are_never_rescued() -> None:
    """A lone user message, a person chatting then pasting a document, and an agent's task:
    none is an agent's output, so none is cut, however far over the window."""
    cases = {
        "lone user message": [user(PASTED)],
        "person chatting": [
            user("Hi, can you help with contracts?"),
            assistant("Of course: paste it."),
            user("Thanks. First, what is a clause?"),
            assistant("A clause is one provision of a contract."),
            user(PASTED),
        ],
        "agent's task": [user("<returncode>0</returncode>\n<output>\n" + PASTED)],
        "output style, no assistant before": [
            user("Go."),
            user("<returncode>0</returncode>\n<output>\n" + PASTED),
        ],
    }
    for name, body in cases.items():
        live = max((i + 1 for i, m in enumerate(body) if m["role"] == "assistant"), default=0)
        assert cut_sizes(body, live, need=5_000) is None, name
        assert not rescuable(nodes(body), body, live, PRUNER), name
