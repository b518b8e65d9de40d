"""``compaction-proxy conversations …``: the admin API from a terminal.

Talks to a running proxy (``--url``, default ``$COMPACTION_PROXY_ADMIN_URL`` or
http://127.0.0.1:8080) with its admin token (``--token`` or ``$COMPACTION_PROXY_ADMIN_TOKEN``).
Human-readable tables by default; ``--json`` prints the API's own JSON for scripts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote

DEFAULT_URL = "http://127.0.0.1:8080"


CONVERSATION_HELP = "a conversation id, or a session name as `list` shows it"


class AdminError(Exception):
    pass


def _call(args: argparse.Namespace, method: str, path: str, body: Any = None) -> Any:
    """The API's JSON answer; raises AdminError (one line to print) on any error answer except
    a compaction's refusal, which is an answer (``outcome`` and ``reason``)."""
    token = args.token or os.environ.get("COMPACTION_PROXY_ADMIN_TOKEN")
    if not token:
        raise AdminError("no admin token: pass --token or set COMPACTION_PROXY_ADMIN_TOKEN")
    url = (args.url or os.environ.get("COMPACTION_PROXY_ADMIN_URL") or DEFAULT_URL).rstrip("/")
    url = url.removesuffix("/v1")  # the admin API is at the root, beside /v1
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    upstream_key = getattr(args, "upstream_key", None)
    if upstream_key:
        headers["X-Upstream-Authorization"] = f"Bearer {upstream_key}"
    upstream_query = getattr(args, "upstream_query", None)
    if upstream_query:
        headers["X-Upstream-Query"] = upstream_query
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(
        f"{url}/admin{path}", data=data, method=method, headers=headers
    )
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            return json.loads(response.read() or b"null")
    except urllib.error.HTTPError as error:
        try:
            detail = json.loads(error.read())
        except ValueError:
            detail = {}
        if method == "POST" and isinstance(detail, dict) and "outcome" in detail:
            return detail  # a refused compaction is an answer, not a transport failure
        reason = None
        if isinstance(detail, dict):
            nested = detail.get("error")
            reason = detail.get("reason") or (
                nested.get("message") if isinstance(nested, dict) else None
            )
        raise AdminError(f"HTTP {error.code}: {reason or error.reason}") from error
    except urllib.error.URLError as error:
        raise AdminError(f"cannot reach {url}: {error.reason}") from error


def _conversation(args: argparse.Namespace) -> str:
    """The conversation id an argument names, path-quoted: the id itself, or a session name as
    ``list`` shows it (``X-Session-Id``), when exactly one of the newest conversations the
    admin API searches has that name."""
    named = args.conversation
    found = _call(args, "GET", f"/conversations?limit=1000&q={quote(named, safe='')}")
    listed = found["conversations"]
    if any(c["conversation"] == named for c in listed):
        return quote(named, safe="")
    sessions = [c["conversation"] for c in listed if c.get("session") == named]
    if len(sessions) > 1:
        raise AdminError(
            f"{len(sessions)} conversations have the session name {named!r} (one per tenant): "
            f"name one by its id: {', '.join(sessions[:5])}"
        )
    return quote(sessions[0] if sessions else named, safe="")


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=False)]
    lines = [
        "  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
        for row in [header, *rows]
    ]
    return "\n".join(lines)


def _ago(timestamp: float | None) -> str:
    if not timestamp:
        return "-"
    seconds = max(0, int(time.time() - timestamp))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


def _when(timestamp: Any) -> str:
    if not isinstance(timestamp, int | float):
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(timestamp))


def _preview(message: dict[str, Any], width: int = 60) -> str:
    """The message's text, then its tool calls (``→ name(arguments)``), on one line."""
    content = message.get("content")
    text = " ".join(str(content if content is not None else "").split())
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        named = []
        for call in calls:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict):
                arguments = " ".join(str(function.get("arguments") or "").split())
                named.append(f"{function.get('name')}({arguments})")
        text = " ".join(filter(None, [text, "→ " + ", ".join(named)]))
    return text if len(text) <= width else text[: width - 1] + "…"


def _list(args: argparse.Namespace) -> str:
    data = _call(args, "GET", f"/conversations?limit={args.limit}")
    if args.json:
        return json.dumps(data, indent=2)
    rows = [
        [
            c["conversation"],
            c.get("session") or "-",
            (c["tenant"] or "-")[:12],
            c["model"] or "-",
            _ago(c["last_seen"]),
            str(c["generation"]),
            f"{c['last_pressure']:.0%}" if c["last_pressure"] is not None else "-",
        ]
        for c in data["conversations"]
    ]
    header = ["CONVERSATION", "SESSION", "TENANT", "MODEL", "LAST SEEN", "GEN", "PRESSURE"]
    return _table(rows, header)


def _show(args: argparse.Namespace) -> str:
    data = _call(args, "GET", f"/conversations/{_conversation(args)}")
    if args.json:
        return json.dumps(data, indent=2)
    anchor = data["anchor"]
    pressure = data.get("last_pressure")
    stopped = data.get("proactive_compaction_stopped")
    lines = [
        f"conversation  {data['conversation']}",
        f"session       {data.get('session') or '-'}",
        f"model         {data.get('model') or '-'}",
        f"tenant        {data.get('tenant') or '-'}",
        f"last seen     {_when(data.get('last_seen'))} UTC ({_ago(data.get('last_seen'))})",
        f"pressure      {f'{pressure:.0%}' if pressure is not None else '-'}",
        "compaction    "
        + ("STOPPED (the client keeps missing its checkpoints)" if stopped else "on"),
        f"generation    {data['generation']}",
        f"lease         {data['lease_owner'] or 'free'}",
        f"in flight     {data['in_flight']}",
        f"anchor        {anchor['prompt_tokens']} tokens up to body position {anchor['tip']}"
        if anchor
        else "anchor        none",
    ]
    rows = [
        [
            r["kind"],
            f"{r['start']}..{r['end']}" if r["kind"] == "checkpoint" else str(r["position"]),
            f"{r['shadowed_tokens']} → {r['tokens']} tokens"
            if r["kind"] == "checkpoint"
            else f"{r['chars_before']} → {r['chars_after']} chars",
        ]
        for r in data["records"]
    ]
    if rows:
        lines += ["", _table(rows, ["RECORD", "POSITIONS", "SIZE"])]
    return "\n".join(lines)


def _log(args: argparse.Namespace) -> str:
    query = f"?limit={args.limit}" + (f"&after={args.after}" if args.after else "")
    data = _call(args, "GET", f"/conversations/{_conversation(args)}/log{query}")
    if args.json:
        return json.dumps(data, indent=2)
    rows = []
    for event in data["events"]:
        detail = {
            k: v
            for k, v in event.items()
            if k
            in (
                "position",
                "role",
                "status",
                "generation",
                "prompt_tokens",
                "cache_read_tokens",
                "cache_written_tokens",
                "outcome",
                "error",
                "trigger",
                "kind",
                "start",
                "end",
            )
        }
        rows.append(
            [
                event["id"],
                _when(event.get("ts")),
                event["type"],
                " ".join(f"{k}={v}" for k, v in detail.items()),
            ]
        )
    text = _table(rows, ["ID", "TIME (UTC)", "EVENT", "DETAIL"])
    if data["next"]:
        text += f"\n(more: --after {data['next']})"
    return text


def _surface(args: argparse.Namespace) -> str:
    data = _call(args, "GET", f"/conversations/{_conversation(args)}/surface")
    if args.json:
        return json.dumps(data, indent=2)
    rows = []
    for index, (node, message) in enumerate(zip(data["nodes"], data["messages"], strict=True)):
        positions = (
            "-"
            if node["start"] is None
            else (
                str(node["start"])
                if node["start"] == node["end"]
                else f"{node['start']}..{node['end']}"
            )
        )
        rows.append(
            [
                str(index),
                node["kind"],
                positions,
                str(message.get("role")),
                str(node.get("tokens", "-")),
                _preview(message),
            ]
        )
    total = sum(n.get("tokens") or 0 for n in data["nodes"])
    table = _table(rows, ["#", "KIND", "BODY", "ROLE", "TOKENS", "CONTENT"])
    return f"{table}\n{len(rows)} messages, about {total} tokens"


def _compact(args: argparse.Namespace) -> str:
    if (args.start is None) != (args.end is None):
        raise AdminError("give both --start and --end for a region, or neither")
    if args.start is not None and args.start > args.end:
        raise AdminError(f"--start ({args.start}) is after --end ({args.end})")
    conversation = _conversation(args)
    if args.start is None:
        data = _call(args, "POST", f"/conversations/{conversation}/compact")
    else:
        data = _call(
            args,
            "POST",
            f"/conversations/{conversation}/compact-region",
            {"start": args.start, "end": args.end},
        )
    args.failed = data.get("outcome") != "committed"
    if args.json:
        return json.dumps(data, indent=2)
    if args.failed:
        return f"{data['outcome']}: {data.get('reason') or 'nothing was compacted'}"
    line = f"{data['outcome']}: {data.get('tokens_shadowed', 0)} tokens shadowed"
    if "generation" in data:
        line += f", generation {data['generation']}"
    return line


def add_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "conversations",
        help="inspect and compact conversations through a running proxy's admin API",
    )
    _common_options(parser, with_defaults=True)
    # The same options after the action too (`list --json`); given there, they win.
    common = argparse.ArgumentParser(add_help=False)
    _common_options(common, with_defaults=False)
    actions = parser.add_subparsers(dest="action", required=True)

    def action(name: str, text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = actions.add_parser(name, help=text, parents=[common])
        return sub

    listing = action("list", "recently active conversations")
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(show=_list)

    for name, func, text in (
        ("show", _show, "state and replacement records"),
        ("surface", _surface, "what the latest request would be sent"),
    ):
        sub = action(name, text)
        sub.add_argument("conversation", help=CONVERSATION_HELP)
        sub.set_defaults(show=func)

    log = action("log", "the session log, a page at a time")
    log.add_argument("conversation", help=CONVERSATION_HELP)
    log.add_argument("--after", help="cursor from the previous page")
    log.add_argument("--limit", type=int, default=100)
    log.set_defaults(show=_log)

    compact = action(
        "compact",
        "summarize an idle conversation now (everything but the last message, or a region)",
    )
    compact.add_argument("conversation", help=CONVERSATION_HELP)
    compact.add_argument("--start", type=int, help="first body position of a region")
    compact.add_argument("--end", type=int, help="last body position of a region (inclusive)")
    compact.add_argument(
        "--upstream-key", help="API key for the summary call when the route has none of its own"
    )
    compact.add_argument(
        "--upstream-query",
        help="query string for the summary call, as clients send it (e.g. api-version=2024-10-21)",
    )
    compact.set_defaults(show=_compact)
    parser.set_defaults(run=run)


def _common_options(parser: argparse.ArgumentParser, *, with_defaults: bool) -> None:
    """``--url --token --json --timeout``; without defaults (after the action) an option not
    given leaves the value from before the action alone."""

    def default(value: Any) -> Any:
        return value if with_defaults else argparse.SUPPRESS

    parser.add_argument(
        "--url",
        default=default(None),
        help=f"proxy base URL (default $COMPACTION_PROXY_ADMIN_URL or {DEFAULT_URL})",
    )
    parser.add_argument(
        "--token", default=default(None), help="admin token (default $COMPACTION_PROXY_ADMIN_TOKEN)"
    )
    parser.add_argument(
        "--json", action="store_true", default=default(False), help="print the API's JSON"
    )
    parser.add_argument(
        "--timeout", type=float, default=default(300.0), help="seconds (default 300)"
    )


def run(args: argparse.Namespace) -> int:
    try:
        print(args.show(args))
    except AdminError as error:
        print(f"compaction-proxy: {error}", file=sys.stderr)
        return 1
    return 1 if getattr(args, "failed", False) else 0
