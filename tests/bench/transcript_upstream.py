"""An upstream that answers a transcript's Responses requests with the transcript's own turns.

Run: ``python -m tests.bench.transcript_upstream --port N --transcript NAME``. For the benches
whose client continues the last response (a frame naming it carries only what is new): what the
proxy rebuilds from the answer must be the history the transcript goes on with, so each
``POST /v1/responses`` is answered, streamed, with the items of the assistant turn that followed
the request of that length in the transcript. Instant, no token counting.
"""

from __future__ import annotations

import argparse
import itertools
from typing import Any

import orjson
from aiohttp import web

from tests.transcripts import as_responses_body, replay_requests, transcript_named

MODEL = "bench-model"


def answers_by_length(name: str) -> dict[int, list[dict[str, Any]]]:
    """For each request of the transcript, by its number of input items, the items of the
    assistant turn that answered it."""
    messages = transcript_named(name).messages
    answers = {}
    for history in replay_requests(messages):
        sent = as_responses_body(MODEL, history)["input"]
        answered = as_responses_body(MODEL, messages[: len(history) + 1])["input"]
        answers[len(sent)] = answered[len(sent) :]
    return answers


def app(answers: dict[int, list[dict[str, Any]]]) -> web.Application:
    ids = itertools.count()

    async def create(request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await request.read())
        output = answers.get(len(body["input"]), [])
        response: dict[str, Any] = {
            "id": f"resp_{next(ids)}",
            "object": "response",
            "status": "completed",
            "model": body.get("model"),
            "output": output,
            "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
        }
        stream = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await stream.prepare(request)
        events: list[dict[str, Any]] = [
            {"type": "response.created", "response": {**response, "output": []}}
        ]
        for index, item in enumerate(output):
            events.append(
                {"type": "response.output_item.done", "output_index": index, "item": item}
            )
        events.append({"type": "response.completed", "response": response})
        for event in events:
            await stream.write(
                b"event: %s\ndata: %s\n\n" % (event["type"].encode(), orjson.dumps(event))
            )
        await stream.write_eof()
        return stream

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    application = web.Application(client_max_size=256 * 1024 * 1024)
    application.add_routes([web.post("/v1/responses", create), web.get("/v1/models", models)])
    return application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--transcript", default="django-13265")
    args = parser.parse_args()
    web.run_app(
        app(answers_by_length(args.transcript)), port=args.port, print=None, access_log=None
    )


if __name__ == "__main__":
    main()
