"""Command line: ``compaction-proxy serve | check-config | client-key | conversations | eval``."""

from __future__ import annotations

import argparse
import faulthandler
import gc
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from compaction_proxy import __version__
from compaction_proxy.config.policy import configured_window, resolve_policy
from compaction_proxy.config.settings import (
    ConfigError,
    Settings,
    config_path_from_env,
    load_settings,
    redacted_url,
    unknown_environment,
    unversioned_upstreams,
)
from compaction_proxy.metering import lazy_litellm
from compaction_proxy.metering.tokenizers import use_bundled_tokenizers
from compaction_proxy.metrics import serve_metrics_port
from compaction_proxy.ops import admin_cli, evaluate
from compaction_proxy.ops.access_log import AccessLine
from compaction_proxy.ops.workers import READY_LINE, exit_with_the_supervisor, run_workers
from compaction_proxy.security.client_keys import digest_of, new_key
from compaction_proxy.security.credentials import credential_problems, key_source
from compaction_proxy.security.self_forwarding import self_loop_problems


class OneLineFormatter(logging.Formatter):
    """A record's message on one line: a line break in it (client text that reached a log
    message: a model name, a path) is written escaped, so no client can start a log line of
    its own. A traceback, which follows the message, keeps its lines."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return super().formatMessage(record).replace("\r", "\\r").replace("\n", "\\n")


def _load(path: str | None, **overrides: Any) -> Settings:
    return load_settings(Path(path) if path else config_path_from_env(), **overrides)


def _serve(args: argparse.Namespace) -> int:
    from compaction_proxy.ops.app import create_app

    overrides: dict[str, Any] = {}
    if args.host:
        overrides["host"] = args.host
    if args.port is not None:
        overrides["port"] = args.port
    if args.workers is not None:
        overrides["workers"] = args.workers
    if args.reuse_port:
        overrides["workers"] = 1  # one of a supervisor's workers
    settings = _load(args.config, **overrides)
    handler = logging.StreamHandler()
    handler.setFormatter(OneLineFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=settings.log_level.upper(), handlers=[handler])
    # The format shows none of where, in which thread or process a record was made: every
    # record (an access line a request) is spared looking them up (the logging HOWTO's
    # "Optimization").
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    # A big request's parsing, hashing and pricing run in worker threads. With the default
    # 5 ms switch interval each of the event loop's wake-ups can wait that long for the
    # interpreter while one runs: a small request takes several wake-ups. 1 ms keeps other
    # clients' latency close to what it is without the big request, for little throughput.
    sys.setswitchinterval(0.001)
    # ``kill -USR1 <pid>`` prints every thread's stack to stderr: what a process that does not
    # stop (or start) is waiting on, without stopping it.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    log = logging.getLogger("compaction_proxy")
    for warning in start_up_warnings(settings):
        log.warning("%s", warning)
    if not args.reuse_port:  # a supervisor's worker: the supervisor said it
        log.info("%s", start_up_line(settings, args.config or config_path_from_env()))
    if settings.workers > 1:
        return run_workers(settings, _worker_args(args))
    if args.reuse_port:
        # Reloads are the supervisor's (a terminal's hang-up reaches the whole process group).
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        exit_with_the_supervisor()
    app = create_app(settings)
    gc.set_threshold(*GC_THRESHOLDS)

    def listening(message: str) -> None:
        # aiohttp's two lines ("Running on ...", "(Press CTRL+C to quit)") as one log line.
        log.info("%s", " ".join(line.strip() for line in message.strip().splitlines()))
        if args.reuse_port:  # tell the supervisor
            sys.stdout.buffer.write(READY_LINE)
            sys.stdout.flush()

    try:
        if settings.metrics_port is not None and not args.reuse_port:
            serve_metrics_port(settings.host, settings.metrics_port)
        web.run_app(
            app,
            host=settings.host,
            port=settings.port,
            reuse_port=args.reuse_port,
            handler_cancellation=True,
            shutdown_timeout=settings.shutdown_timeout,
            access_log_class=AccessLine,
            print=listening,
        )
    except OSError as exc:  # the port in use, or an address this host does not have
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        address = f"{settings.host}:{settings.port}"
        print(f"compaction-proxy: cannot listen on {address}: {reason}", file=sys.stderr)
        exit_after_an_import_under_way(status=1)  # the import started before the bind failed
        return 1
    except Exception:
        # Anything else that ends the app (a failure at start-up, say) is said in full; then,
        # as on every way out, no finalizing while the import runs.
        if not lazy_litellm.settle(0.0):
            traceback.print_exc()
            exit_after_an_import_under_way(status=1)
        raise
    exit_after_an_import_under_way()
    return 0


def exit_after_an_import_under_way(timeout: float = 0.0, status: int = 0) -> None:
    """Once the app has shut down (records written, store closed): if litellm's import,
    started in the background, is still under way ``timeout`` seconds on, leave at once with
    ``status`` without finalizing the interpreter, which could wait on that import forever
    (``lazy_litellm.settle``); logs and standard streams are flushed first. Nothing is left
    to do by then: waiting for the import (seconds, on a busy host) only delayed a stop in a
    process's first seconds, and a supervisor's restart or an orchestrator's rollout with it."""
    if lazy_litellm.settle(timeout):
        return
    logging.getLogger("compaction_proxy").info(
        "litellm's import still under way at exit: leaving without finalizing the interpreter"
    )
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


# The cyclic collector's young-generation threshold, raised from 700 allocations: parsing one
# agent request allocates thousands of containers that live until its answer, so at 700 the
# collector ran several times per request and promoted them all to be walked again later
# (docs/perf.md has the measurement).
GC_THRESHOLDS = (10_000, 20, 20)


def _worker_args(args: argparse.Namespace) -> list[str]:
    """What each worker is started with: the supervisor's own options, less ``--workers``."""
    passed = []
    for option in ("config", "host", "port"):
        value = getattr(args, option)
        if value is not None:
            passed += [f"--{option}", str(value)]
    return passed


def start_up_warnings(settings: Settings) -> list[str]:
    """What a start-up (and ``check-config``) warns about: typos, and a forgotten ``/v1``."""
    warnings = [
        f"{name} names no setting: ignored (a typo?)" for name in unknown_environment(os.environ)
    ]
    warnings += [
        f"upstream {url} has no version in its path (like /v1): requests go to "
        f"{url.rstrip('/')}/chat/completions"
        for url in unversioned_upstreams(settings)
    ]
    return warnings


def start_up_line(settings: Settings, path: Path | str | None) -> str:
    """The one line a start-up logs: what this process serves, from where, with what."""
    routes = ", ".join(
        f"{r.model} -> {r.base_url}" + (f" ({r.context_window} tokens)" if r.context_window else "")
        for r in settings.routes
    )
    return (
        f"compaction-proxy {__version__} on http://{settings.host}:{settings.port}: "
        f"config {path or 'defaults and environment'}; upstream {settings.upstream_base_url}; "
        f"Anthropic upstream {settings.anthropic_base_url}; "
        f"routes {routes or 'none'}; store {redacted_url(settings.store_url)}; "
        f"workers {settings.workers}; "
        f"admin API {'on' if settings.admin_token is not None else 'off'}"
    )


def resolved_routes(settings: Settings) -> list[dict[str, Any]]:
    """Every route with its upstream and the policy each of its models resolves to."""
    report: list[dict[str, Any]] = []
    for route in [*settings.routes, settings.default_route]:
        models = {route.model: route.model, **{name: name for name in route.models}}
        entry: dict[str, Any] = {
            "model": route.model,
            "base_url": route.base,
            "api_key_env": route.api_key_env,
            "key_source": key_source(route),
            "policies": {},
        }
        for label, model in models.items():
            resolved = resolve_policy(settings, route, model)
            policy = resolved.model_dump(mode="json")
            # The value in force, not "unset": 0.1 below the threshold unless given.
            policy["precompact_ratio"] = round(resolved.effective_precompact_ratio, 6)
            policy["context_window"] = configured_window(route, model)
            entry["policies"][label] = policy
        report.append(entry)
    return report


def _check_config(args: argparse.Namespace) -> int:
    settings = _load(args.file)
    path = args.file or config_path_from_env()
    report = {
        "config_file": str(path) if path else "(none: defaults and environment)",
        "store_url": redacted_url(settings.store_url),
        "listen": f"{settings.host}:{settings.port}",
        "upstream_base_url": str(settings.upstream_base_url),
        "anthropic_base_url": str(settings.anthropic_base_url),
        "admin_api": "on" if settings.admin_token is not None else "off",
        "routes": resolved_routes(settings),
    }
    print(yaml.safe_dump(report, sort_keys=False), end="")
    problems = [*credential_problems(settings, os.environ), *self_loop_problems(settings)]
    for warning in start_up_warnings(settings):
        print(f"warning: {warning}", file=sys.stderr)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


def _new_client_key(args: argparse.Namespace) -> int:
    key = new_key()
    name = args.name or ""
    print(f"client key (give it to the client; it is not stored): {key}")
    print(f"line for client_keys_file: {digest_of(key)} {name}".rstrip())
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="compaction-proxy",
        description="OpenAI-compatible proxy that compacts long conversations.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument(
        "--config",
        help="YAML file (default: $COMPACTION_PROXY_CONFIG or config/proxy.yaml when present)",
    )
    serve.add_argument("--host", help="address to bind (default from config: 127.0.0.1)")
    serve.add_argument("--port", type=int, help="port to bind (default from config: 8080)")
    serve.add_argument(
        "--workers",
        type=int,
        help="worker processes on the port (default from config: 1; more than 1 needs Redis)",
    )
    serve.add_argument("--reuse-port", action="store_true", help=argparse.SUPPRESS)
    serve.set_defaults(run=_serve)

    check = commands.add_parser(
        "check-config", help="validate a configuration and print the resolved policy per route"
    )
    check.add_argument("file", nargs="?", help="YAML file (default as for serve)")
    check.set_defaults(run=_check_config)

    client_key = commands.add_parser(
        "client-key", help="issue client keys (required once a route holds an upstream key)"
    )
    client_key_actions = client_key.add_subparsers(dest="action", required=True)
    issue = client_key_actions.add_parser("new", help="a fresh key and its digest line")
    issue.add_argument("--name", help="a label for the digest line (who holds the key)")
    issue.set_defaults(run=_new_client_key)

    admin_cli.add_parser(commands)
    evaluate.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    use_bundled_tokenizers()  # on the main thread, before any other runs
    try:
        result: int = args.run(args)
    except ConfigError as error:
        print(f"compaction-proxy: {error}", file=sys.stderr)
        return 2
    return result
