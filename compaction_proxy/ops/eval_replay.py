"""The replay behind ``compaction-proxy eval`` (``ops.evaluate``): a recorded conversation sent,
request by request as the agent sent it, through a proxy started in this process, in front of a
recorder that answers each request with the conversation's own next assistant message and
passes the proxy's summary calls to the model; and the model, asked over HTTP with its answers
cached on disk (an OpenAI-compatible server, or an Anthropic-compatible one).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from compaction_proxy.compaction.cache_prices import PRESETS, CachePrices, cache_prices
from compaction_proxy.compaction.summarize import INSTRUCTION_OPENING
from compaction_proxy.config.api_family import ApiFamily
from compaction_proxy.config.policy import resolve_policy
from compaction_proxy.config.settings import Policy, Settings, load_settings
from compaction_proxy.evaluation.generated_probes import GENERATE
from compaction_proxy.evaluation.grading import matches, verdict
from compaction_proxy.evaluation.probes import RUBRIC, Probe, text_of_message
from compaction_proxy.evaluation.report import PolicyRun, bill_units
from compaction_proxy.frozen import frozen
from compaction_proxy.metering.tokenizers import encoding

Message = dict[str, Any]
ASKED_AS = "You answer questions about the conversation you are shown, from it alone."
ANTHROPIC_VERSION = "2023-06-01"


def requests_of(messages: Sequence[Message]) -> list[int]:
    """Where the agent posted a request: before each assistant message after the first."""
    return [i for i, m in enumerate(messages) if m.get("role") == "assistant" and i > 0]


def tokens(text: str) -> int:
    return len(encoding("o200k_base").encode(text, disallowed_special=()))


def transcript(messages: Sequence[Message]) -> str:
    return "\n\n".join(f"[{m.get('role', 'user')}]\n{text_of_message(m)}" for m in messages)


def _digest(message: Message) -> str:
    return hashlib.sha256(orjson.dumps(message, option=orjson.OPT_SORT_KEYS)).hexdigest()


@dataclass
class Recorder:
    """The upstream of the replay: answers the agent's requests with the conversation's next
    assistant message and records what reached it; passes summary calls to the model."""

    model: Model
    dry_run: bool = False
    prices: CachePrices = PRESETS["none"]  # the route's, once its settings are made
    answer: Message = field(default_factory=dict)
    forwarded: list[list[Message]] = field(default_factory=list)
    summary_calls: int = 0
    summary_units: float = 0.0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        messages = body.get("messages") or []
        last = messages[-1].get("content") if messages else None
        if isinstance(last, str) and last.startswith(INSTRUCTION_OPENING):
            self.summary_calls += 1
            prompt = transcript(messages)
            text = "(a summary, not made: dry run)" if self.dry_run else await self.model.ask(body)
            self.summary_units += tokens(prompt) + self.prices.output * tokens(text)
            return _completion(text, tokens(prompt))
        self.forwarded.append(messages)
        reply = {k: v for k, v in self.answer.items() if k in ("role", "content", "tool_calls")}
        return _completion(reply, tokens(transcript(messages)))


def _completion(answer: str | Message, prompt_tokens: int) -> web.Response:
    message = answer if isinstance(answer, dict) else {"role": "assistant", "content": answer}
    finish = "tool_calls" if message.get("tool_calls") else "stop"
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": 1,
        "total_tokens": prompt_tokens + 1,
    }
    choice = {"index": 0, "message": message, "finish_reason": finish}
    return web.json_response(
        {"id": "chatcmpl-eval", "object": "chat.completion", "choices": [choice], "usage": usage}
    )


@dataclass
class Model:
    """The model asked: an OpenAI-compatible server, with answers cached on disk."""

    base_url: str
    api_key: str
    name: str
    cache: Path | None
    session: aiohttp.ClientSession | None = None
    calls: int = 0
    anthropic: bool = False  # an Anthropic-compatible server (Messages API), not OpenAI's

    async def ask(self, body: dict[str, Any]) -> str:
        """The text the model answers ``body`` (a chat completion request) with: the model
        ``body`` names (a policy's ``summary_model``), else this one."""
        body = {**body, "model": body.get("model") or self.name, "stream": False}
        key = hashlib.sha256(orjson.dumps([self.base_url, body], option=orjson.OPT_SORT_KEYS))
        cached = self.cache / f"{key.hexdigest()}.txt" if self.cache else None
        if cached is not None and cached.exists():
            return cached.read_text()
        assert self.session is not None
        base = self.base_url.rstrip("/")
        if self.anthropic:
            url, sent = f"{base}/messages", as_messages_body(body)
            headers = {"x-api-key": self.api_key, "anthropic-version": ANTHROPIC_VERSION}
        else:
            url, sent = f"{base}/chat/completions", body
            headers = {"Authorization": f"Bearer {self.api_key}"}
        async with self.session.post(url, json=sent, headers=headers) as answer:
            answer.raise_for_status()
            parsed = await answer.json()
        self.calls += 1
        if self.anthropic:
            blocks = parsed.get("content") or []
            text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        else:
            text = parsed["choices"][0]["message"].get("content") or ""
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            cached.write_text(text)
        return str(text)

    async def answer(self, context: Sequence[Message], question: str) -> str:
        prompt = f"<conversation>\n{transcript(context)}\n</conversation>\n\n{question}"
        messages = [{"role": "system", "content": ASKED_AS}, {"role": "user", "content": prompt}]
        return await self.ask({"messages": messages, "max_tokens": 200, "temperature": 0})

    async def write_probes(self, part: Sequence[Message], count: int) -> str:
        """The model's reply to ``generated_probes.GENERATE`` about ``part`` of a conversation."""
        prompt = f"<conversation>\n{transcript(part)}\n</conversation>\n\n"
        ask = prompt + GENERATE.format(count=count)
        body = {"messages": [{"role": "user", "content": ask}], "max_tokens": 300 * count}
        return await self.ask({**body, "temperature": 0})

    async def grade(self, probe: Probe, answer: str) -> bool:
        if probe.exact:
            return matches(probe, answer)
        ask = RUBRIC.format(question=probe.question, expected=probe.answer, answer=answer)
        body = {"messages": [{"role": "user", "content": ask}], "max_tokens": 5, "temperature": 0}
        return verdict(await self.ask(body))


def as_messages_body(body: dict[str, Any]) -> dict[str, Any]:
    """A chat completion request as an Anthropic Messages one: its system messages as
    ``system``, everything before its last message as one transcript, the last after it (a
    summary call's history holds tool calls the Messages API would want as blocks; as text,
    the model reads the same)."""
    messages = [m for m in body.get("messages", []) if m.get("role") != "system"]
    system = "\n\n".join(
        str(m.get("content") or "") for m in body.get("messages", []) if m.get("role") == "system"
    )
    *before, last = messages or [{"role": "user", "content": ""}]
    ask = str(last.get("content") or "")
    prompt = f"<conversation>\n{transcript(before)}\n</conversation>\n\n{ask}" if before else ask
    sent: dict[str, Any] = {
        "model": body["model"],
        "max_tokens": body.get("max_tokens") or body.get("max_completion_tokens") or 1024,
        "messages": [{"role": "user", "content": prompt}],
    }
    if system:
        sent["system"] = system
    return sent


@frozen
class Replayed:
    """How every policy of a run is replayed: the route it starts from (the configured one for
    the model: its policy, its window), and the prices its bill is taken at (None: the
    prices each policy's ``pricing`` names, for ``family``'s provider and ``model``)."""

    policy: Policy
    window: int
    family: ApiFamily
    prices: CachePrices | None = None
    model: str = ""


@frozen
class Point:
    """A request of the replay at which the policy changed what the model sees."""

    history: list[Message]
    forwarded: list[Message]


def replay_settings(
    replayed: Replayed, overrides: dict[str, Any], upstream_url: str
) -> tuple[Settings, CachePrices]:
    """The replay proxy's settings: the starting policy overlaid by ``overrides`` on one route
    to ``upstream_url``; and the prices its bill is taken at."""
    route = {
        "model": "*",
        "base_url": upstream_url,
        "context_window": replayed.window,
        "policy": overrides,
    }
    settings = load_settings(
        None,
        upstream_base_url=upstream_url,
        tenant_secret="eval",
        routes=[route],
        policy=replayed.policy.model_dump(),
    )
    policy = resolve_policy(settings, settings.routes[0], "*")
    return settings, replayed.prices or cache_prices(
        policy.pricing, replayed.family, replayed.model
    )


async def replay(
    messages: list[Message],
    overrides: dict[str, Any],
    model: Model,
    replayed: Replayed,
    dry_run: bool,
) -> tuple[list[Point], PolicyRun]:
    """``messages`` replayed through a proxy with ``overrides`` on the starting policy."""
    from compaction_proxy.http.app_keys import SERVICES
    from compaction_proxy.ops.app import create_app

    recorder = Recorder(model, dry_run)
    upstream = web.Application()
    upstream.router.add_post("/v1/chat/completions", recorder.handle)
    async with _served(upstream) as upstream_url:
        settings, recorder.prices = replay_settings(replayed, overrides, upstream_url)
        app = create_app(settings)
        async with _served(app) as proxy_url, aiohttp.ClientSession() as client:
            points, sent, forwarded = [], [], []
            statuses: dict[str, int] = {}
            positions = requests_of(messages)
            for count, position in enumerate(positions, 1):
                history = messages[:position]
                recorder.answer = messages[position]
                body = {"model": model.name, "messages": history}
                headers = {"Authorization": "Bearer eval", "X-Session-Id": "eval"}
                async with client.post(
                    f"{proxy_url}/chat/completions", json=body, headers=headers
                ) as answer:
                    status = answer.headers.get("X-Compaction-Status", "none")
                    statuses[status] = statuses.get(status, 0) + 1
                    await answer.read()
                shown = recorder.forwarded[-1]
                sent.append([(_digest(m), tokens(text_of_message(m))) for m in history])
                forwarded.append([(_digest(m), tokens(text_of_message(m))) for m in shown])
                if status not in ("none", "precompacting"):
                    points.append(Point(history, shown))
                if count % 20 == 0 or count == len(positions):
                    print(f"  replayed {count}/{len(positions)} requests", file=sys.stderr)
                await app[SERVICES].background.idle()
    prices = recorder.prices
    raw = bill_units(sent, prices.read, prices.write)
    billed = bill_units(forwarded, prices.read, prices.write) + recorder.summary_units
    run = PolicyRun(
        name="",
        raw_tokens=sum(t for request in sent for _, t in request),
        forwarded_tokens=sum(t for request in forwarded for _, t in request),
        billed=billed / raw if raw else 1.0,
        summary_calls=recorder.summary_calls,
        change_points=len(points),
        statuses=statuses,
        prices={"read": prices.read, "write": prices.write, "output": prices.output},
    )
    return points, run


class _served:
    """An app served on a free local port for the ``async with``: its base URL (``/v1``)."""

    def __init__(self, app: web.Application) -> None:
        self.runner = web.AppRunner(app)

    async def __aenter__(self) -> str:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        return f"http://127.0.0.1:{port}/v1"

    async def __aexit__(self, *_: object) -> None:
        await self.runner.cleanup()
