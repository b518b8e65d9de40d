"""``compaction-proxy eval``: is compaction hurting my agent?

A recorded conversation is replayed, request by request as the agent sent it, through a proxy
started in this process under each policy named, in front of a recorder that answers each
request with the conversation's own next assistant message and passes the proxy's summary
calls to the model. Wherever a policy changed what the model would see, probes are made of
what it took out of view (``evaluation.probes``), and the model is asked each twice: with the
whole history (where it fits) and with what the policy forwarded. Answers are graded by match,
or by the model against the rubric in ``evaluation.probes.RUBRIC``; the report
(``evaluation.report``) gives retention by probe kind beside forwarded tokens, the bill on
the provider's caching terms and the summary calls.

The model sees the conversation as one transcript (its messages, tool calls and results as
text) with the question after it, the same way for both askings: any OpenAI-compatible server
can answer, tools or not. Answers are cached on disk by the digest of what was asked, so a
rerun pays only for what changed; ``--dry-run`` prints the calls it would make.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from compaction_proxy.compaction.cache_prices import PRESETS
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.policy import configured_window, family_route_for, resolve_policy
from compaction_proxy.config.settings import ConfigError, config_path_from_env, load_settings
from compaction_proxy.evaluation.generated_probes import generated_probes, generation_points
from compaction_proxy.evaluation.probes import Probe, probes_for, text_of_message
from compaction_proxy.evaluation.report import (
    Asked,
    PolicyRun,
    as_json,
    chart_html,
    table,
)
from compaction_proxy.formats.known_messages import KnownMessages
from compaction_proxy.formats.request import ClientRequest
from compaction_proxy.formats.wire import ParseContext, WireFormat
from compaction_proxy.formats.wire_formats import CHAT, MESSAGES, RESPONSES
from compaction_proxy.frozen import frozen
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.tokenizers import use_bundled_tokenizers
from compaction_proxy.ops.eval_replay import (
    Model,
    Point,
    Replayed,
    replay,
    requests_of,
    tokens,
    transcript,
)
from compaction_proxy.parsing.recent_bodies import RecentBodies

Message = dict[str, Any]
DEFAULT_POLICIES = {"default": {}, "masking off": {"masking": {"enabled": False}}}
DEFAULT_WINDOW = 128_000


def conversation_of(path: Path) -> list[Message]:
    """A recorded conversation as chat messages: a chat ``messages`` list (or an object holding
    one), a Responses body (``input``), or an Anthropic Messages body (blocks)."""
    data = orjson.loads(path.read_bytes())
    if isinstance(data, list):
        data = {"messages": data}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a conversation")
    wire: WireFormat = CHAT
    if "input" in data:
        wire = RESPONSES
    elif any(
        isinstance(m, dict)
        and isinstance(m.get("content"), list)
        and any(
            isinstance(b, dict) and b.get("type") in ("tool_use", "tool_result")
            for b in m["content"]
        )
        for m in data.get("messages", [])
    ):
        wire = MESSAGES
    raw = orjson.dumps({"model": "eval", **data})
    parsed = wire.parse(raw, ParseContext(KnownMessages(), RecentBodies()))
    if not isinstance(parsed, ClientRequest):
        raise ValueError(f"{path}: a history the provider holds cannot be replayed")
    return parsed.messages


async def conversation_in_store(store_url: str, conversation: str) -> list[Message]:
    """A conversation the proxy logged, as its newest request carried it: the head of its
    last logged context, then its messages from the log's tip back along their chain.
    ValueError when a message was logged without its content (``log_content`` off, or over
    ``log_content_max_chars``)."""
    from compaction_proxy.store import open_store

    store = open_store(load_settings(None, store_url=store_url, tenant_secret="eval"))
    try:
        events, cursor = [], None
        while True:
            page = await store.read_log(conversation, cursor, 1000)
            events += [event for _, event in page.events]
            if page.next_cursor is None or not page.events:
                break
            cursor = page.next_cursor
    finally:
        await store.close()
    by_hash = {e["hash"]: e for e in events if e.get("type") == "message"}
    tips = [e for e in events if e.get("type") == "message"]
    if not tips:
        raise ValueError(f"no messages logged for conversation {conversation}")
    branch: list[Message] = []
    event: dict[str, Any] | None = tips[-1]
    while event is not None:
        if "message" not in event:
            raise ValueError("a message was logged without its content: set log_content")
        branch.append(event["message"])
        event = by_hash.get(event.get("prev", ""))
    contexts = [e for e in events if e.get("type") == "context" and "head" in e]
    head = list(contexts[-1]["head"]) if contexts else []
    return [*head, *reversed(branch)]


def removed_at(point: Point) -> list[Message]:
    """The messages of the history the policy took out of view at ``point`` (whole or in
    part: summarized, masked, cut)."""
    shown = {text_of_message(m) for m in point.forwarded}
    return [m for m in point.history if text_of_message(m) and text_of_message(m) not in shown]


def newly_removed(points: Sequence[Point]) -> list[tuple[Point, list[Message]]]:
    """The change points that took something out of view that the one before had not, each
    with what that was (a checkpoint's span, the outputs a mask cleared): the requests after
    one, until the next, show the same."""
    found: list[tuple[Point, list[Message]]] = []
    before: set[str] = set()
    for point in points:
        removed = removed_at(point)
        fresh = [m for m in removed if text_of_message(m) not in before]
        if fresh:
            found.append((point, fresh))
        before = {text_of_message(m) for m in removed}
    return found


def newest_within(messages: Sequence[Message], budget: int) -> list[Message]:
    """The newest of ``messages`` whose transcript fits ``budget`` tokens (at least one),
    each message counted once (a transcript's separators are a few tokens more)."""
    kept: list[Message] = []
    total = 0
    for message in reversed(messages):
        total += tokens(transcript([message]))
        if kept and total > budget:
            break
        kept.insert(0, message)
    return kept


def sampled_probes(points: Sequence[Point], most: int, seed: int = 0) -> list[tuple[Point, Probe]]:
    """The probes of every change point (a question asked once, at its first point), at most
    ``most`` of them, drawn the same way every run."""
    seen: set[str] = set()
    found: list[tuple[Point, Probe]] = []
    for point in points:
        for probe in probes_for(removed_at(point), point.history):
            if probe.question not in seen:
                seen.add(probe.question)
                found.append((point, probe))
    if len(found) <= most:
        return found
    return sorted(random.Random(seed).sample(found, most), key=found.index)


@frozen
class Evaluation:
    """What one ``eval`` run is asked (the command line, read)."""

    messages: list[Message]
    policies: dict[str, dict[str, Any]]
    model: Model
    replayed: Replayed
    probes: int
    dry_run: bool
    model_probes: int = 0


async def probes_written(
    model: Model, points: Sequence[Point], most: int, window: int, asked: set[str]
) -> list[tuple[Point, Probe]]:
    """One probe written by the model at each of at most ``most`` change points that took
    something new out of view, about that (the newest of it that fits half the window); a
    question already in ``asked`` is not asked twice."""
    found: list[tuple[Point, Probe]] = []
    for point, fresh in generation_points(newly_removed(points), most):
        part = newest_within(fresh, window // 2)
        for probe in generated_probes(await model.write_probes(part, 1), 1):
            if probe.question not in asked:
                asked.add(probe.question)
                found.append((point, probe))
    return found


async def evaluate(run: Evaluation) -> list[PolicyRun]:
    """Every policy replayed, probed and graded (or, dry, counted)."""
    model = run.model
    runs: list[PolicyRun] = []
    requests = len(requests_of(run.messages))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        model.session = session
        for name, overrides in run.policies.items():
            print(f"policy {name!r}: replaying {requests} requests", file=sys.stderr)
            points, outcome = await replay(
                run.messages, overrides, model, run.replayed, run.dry_run
            )
            outcome.name = name
            chosen = sampled_probes(points, run.probes)
            runs.append(outcome)
            if run.dry_run:
                writing = generation_points(newly_removed(points), run.model_probes)
                _print_dry(outcome, chosen, len(writing))
                continue
            if run.model_probes:
                asked = {probe.question for _, probe in chosen}
                written = await probes_written(
                    model, points, run.model_probes, run.replayed.window, asked
                )
                outcome.generated_probes = len(written)
                chosen += written
            for count, (point, probe) in enumerate(chosen, 1):
                full = None
                if tokens(transcript(point.history)) <= run.replayed.window:
                    full = await model.grade(
                        probe, await model.answer(point.history, probe.question)
                    )
                kept = await model.grade(probe, await model.answer(point.forwarded, probe.question))
                outcome.asked.append(Asked(probe.kind, full, kept))
                if count % 10 == 0 or count == len(chosen):
                    print(f"  asked {count}/{len(chosen)} probes", file=sys.stderr)
    # The proxies started litellm's import in a thread; a process that finalizes while it
    # runs never exits (``lazy_litellm.settle``): a quick run on a busy host did just that.
    await lazy_litellm.loaded()
    return runs


def _print_dry(outcome: PolicyRun, chosen: Sequence[tuple[Point, Probe]], written: int) -> None:
    # A probe the model writes costs the call that writes it and, like a decision, two
    # askings and two gradings.
    calls = sum(2 if probe.exact else 4 for _, probe in chosen) + 5 * written
    context = sum(
        tokens(transcript(point.history)) + tokens(transcript(point.forwarded))
        for point, _ in chosen
    )
    print(
        f"policy {outcome.name!r}: {outcome.change_points} change points, {len(chosen)} probes;"
        f" would make {outcome.summary_calls} summary calls and {calls} probe calls, about"
        f" {context:,} input tokens of probes"
        + (f", with {written} probes the model writes" if written else "")
    )


def starting_route(args: argparse.Namespace) -> Replayed:
    """What every policy starts from: the route the proxy's configuration (``--config``, else
    as ``serve`` finds it) gives ``--model``: its policy (the route's and the model's overrides
    on the defaults), its window unless ``--window`` names one, its prices unless
    ``--preset`` names others."""
    configured = load_settings(Path(args.config) if args.config else config_path_from_env())
    family = ApiFamily.ANTHROPIC if args.api == "anthropic" else ApiFamily.OPENAI
    route = family_route_for(configured, args.model, family)
    window = args.window or configured_window(route, args.model) or DEFAULT_WINDOW
    prices = PRESETS[args.preset] if args.preset else None
    policy = resolve_policy(configured, route, args.model)
    return Replayed(policy, window, family, prices, args.model)


def run_eval(args: argparse.Namespace) -> int:
    """``compaction-proxy eval``: read the command line, evaluate, report."""
    use_bundled_tokenizers()
    policies = dict(DEFAULT_POLICIES)
    if args.policies:
        policies = json.loads(Path(args.policies).read_text())
    for given in args.policy or []:
        name, _, overrides = given.partition("=")
        policies[name] = json.loads(overrides or "{}")
    cache = None if args.no_cache else Path(args.cache_dir).expanduser()
    key = os.environ.get(args.api_key_env, "")
    model = Model(args.base_url, key, args.model, cache)
    model.anthropic = args.api == "anthropic"
    if args.conversation_id:
        found = asyncio.run(conversation_in_store(args.store_url, args.conversation_id))
        messages = found
    elif args.conversation:
        messages = conversation_of(Path(args.conversation))
    else:
        raise ConfigError("name a conversation: a JSON file, or --conversation-id")
    replayed = starting_route(args)
    print(
        f"starting from the route for {args.model!r}: window {replayed.window:,} tokens",
        file=sys.stderr,
    )
    asked = Evaluation(
        messages, policies, model, replayed, args.probes, args.dry_run, args.model_probes
    )
    runs = asyncio.run(evaluate(asked))
    print(table(runs))
    if args.json:
        Path(args.json).write_text(json.dumps(as_json(runs), indent=2))
    if args.html:
        title = f"Compaction and what the agent kept: {args.conversation}"
        Path(args.html).write_text(chart_html(runs, title))
    return 0


def add_parser(commands: Any) -> None:
    """``eval``, under the CLI's commands."""
    parser = commands.add_parser(
        "eval", help="is compaction hurting my agent? (probes a recorded conversation)"
    )
    parser.add_argument(
        "conversation",
        nargs="?",
        help="a recorded conversation: chat, Responses or Messages JSON",
    )
    parser.add_argument(
        "--conversation-id", help="or a conversation the proxy logged (with log_content)"
    )
    parser.add_argument(
        "--store-url",
        default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
        help="the store holding it (default: $REDIS_URL)",
    )
    parser.add_argument(
        "--base-url", required=True, help="the model to ask: an OpenAI-compatible /v1 URL"
    )
    parser.add_argument(
        "--api",
        choices=("openai", "anthropic"),
        default="openai",
        help="what the model speaks: OpenAI's chat completions or Anthropic's Messages API",
    )
    parser.add_argument(
        "--api-key-env", default="OPENAI_API_KEY", help="the environment variable holding its key"
    )
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument(
        "--config",
        help="the proxy's configuration: the route for --model gives every policy its start, "
        "the window and the prices (default: $COMPACTION_PROXY_CONFIG or config/proxy.yaml "
        "when present, as for serve)",
    )
    parser.add_argument(
        "--window",
        type=int,
        help=f"the context window (default: the route's, else {DEFAULT_WINDOW:,})",
    )
    parser.add_argument(
        "--policy", action="append", metavar="NAME=JSON", help="a policy: a name and its overrides"
    )
    parser.add_argument("--policies", help="a JSON file of policies: {name: overrides}")
    parser.add_argument("--probes", type=int, default=40, help="probes asked per policy, at most")
    parser.add_argument(
        "--model-probes",
        type=int,
        default=0,
        metavar="N",
        help="and N more probes, written by the model about what a policy removed (one at each "
        "of N change points; graded by the model)",
    )
    parser.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="bill on this provider's cache prices (default: each policy's pricing on the "
        "route, its preset auto meaning --api's provider)",
    )
    parser.add_argument(
        "--cache-dir", default="~/.cache/compaction-proxy/eval", help="answers kept here"
    )
    parser.add_argument(
        "--no-cache", action="store_true", help="ask again whatever was asked before"
    )
    parser.add_argument("--json", help="write the report as JSON here")
    parser.add_argument("--html", help="write a chart of retention against cost here")
    parser.add_argument(
        "--dry-run", action="store_true", help="print the calls it would make, make none"
    )
    parser.set_defaults(run=run_eval)
