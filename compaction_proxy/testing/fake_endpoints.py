"""The fake provider's endpoints besides chat: embeddings, models, files, speech, realtime.

Enough of each for clients to work against (the openai SDK's own calls), and every request's
exact bytes kept, so tests can check that what a client sent arrived byte for byte.
"""

from __future__ import annotations

import asyncio
import email.policy
import hashlib
import itertools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from email.parser import BytesParser
from typing import Any

import orjson
from aiohttp import WSMsgType, web

from compaction_proxy.frozen import frozen

SPEECH_CHUNKS = 5


@frozen
class RawRequest:
    method: str
    path: str  # with the query, as sent
    headers: dict[str, str]
    body: bytes


@dataclass
class FakeEndpoints:
    """State of the endpoints; ``routes()`` serves them."""

    requests: list[RawRequest] = field(default_factory=list)
    files: dict[str, tuple[str, bytes]] = field(default_factory=dict)  # id: (name, bytes)
    batches: dict[str, str] = field(default_factory=dict)  # id: its output file's id
    vector_stores: dict[str, list[str]] = field(default_factory=dict)  # id: its files' ids
    sent: list[bytes] = field(default_factory=list)  # every body answered, in order
    # Set by a test: speech waits on it after its first chunk (to see a stream relayed live).
    speech_gate: asyncio.Event | None = None
    realtime_closes: list[int | None] = field(default_factory=list)  # codes clients closed with
    realtime_pings: int = 0  # pings received on Realtime sessions
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def routes(self) -> list[web.RouteDef]:
        return [
            web.post("/v1/embeddings", _refusing_junk(self._embeddings)),
            web.get("/v1/models/{model}", _refusing_junk(self._model)),
            web.post("/v1/files", _refusing_junk(self._upload)),
            web.get("/v1/files", _refusing_junk(self._list_files)),
            web.get("/v1/files/{file}", _refusing_junk(self._file)),
            web.post("/v1/batches", _refusing_junk(self._create_batch)),
            web.get("/v1/batches/{batch}", _refusing_junk(self._batch)),
            web.get("/v1/files/{file}/content", _refusing_junk(self._file_content)),
            web.delete("/v1/files/{file}", _refusing_junk(self._delete_file)),
            web.post("/v1/vector_stores", _refusing_junk(self._create_vector_store)),
            web.get(
                "/v1/vector_stores/{store}/files/{file}/content",
                _refusing_junk(self._vector_store_file_content),
            ),
            web.post("/v1/responses/compact", _refusing_junk(self._compact)),
            web.post("/v1/responses/input_tokens", _refusing_junk(self._input_tokens)),
            web.post("/v1/audio/speech", _refusing_junk(self._speech)),
            web.get("/v1/realtime", _refusing_junk(self._realtime)),
        ]

    async def _keep(self, request: web.Request) -> bytes:
        body = await request.read()
        self.requests.append(
            RawRequest(request.method, request.raw_path, dict(request.headers), body)
        )
        return body

    def _answer(self, data: Any, status: int = 200) -> web.Response:
        body = orjson.dumps(data)
        self.sent.append(body)
        return web.Response(body=body, status=status, content_type="application/json")

    async def _embeddings(self, request: web.Request) -> web.Response:
        body = orjson.loads(await self._keep(request))
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = []
        for index, text in enumerate(inputs):
            digest = hashlib.sha256(str(text).encode()).digest()
            vector = [round(b / 255 - 0.5, 6) for b in digest[:8]]
            data.append({"object": "embedding", "index": index, "embedding": vector})
        tokens = sum(len(str(t).split()) for t in inputs)
        return self._answer(
            {
                "object": "list",
                "data": data,
                "model": body["model"],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            }
        )

    async def _model(self, request: web.Request) -> web.Response:
        await self._keep(request)
        model = request.match_info["model"]
        if model.startswith("missing"):
            missing = _error(f"The model '{model}' does not exist", "model_not_found")
            return self._answer(missing, 404)
        return self._answer({"id": model, "object": "model", "created": 0, "owned_by": "fake"})

    async def _upload(self, request: web.Request) -> web.Response:
        raw = await self._keep(request)
        fields = _form_fields(raw, request.headers["Content-Type"])
        file_id = f"file-{next(self._ids)}"
        name, content = fields["file"]
        self.files[file_id] = (name, content)
        return self._answer(
            {
                "id": file_id,
                "object": "file",
                "bytes": len(content),
                "created_at": 0,
                "filename": name,
                "purpose": fields["purpose"][1].decode(),
                "status": "processed",
            }
        )

    def _file_object(self, file_id: str) -> dict[str, Any]:
        name, content = self.files[file_id]
        return {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": 0,
            "filename": name,
            "purpose": "batch",
            "status": "processed",
        }

    async def _list_files(self, request: web.Request) -> web.Response:
        await self._keep(request)
        data = [self._file_object(file_id) for file_id in self.files]
        first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
        listed = {"object": "list", "data": data, "first_id": first, "last_id": last}
        return self._answer({**listed, "has_more": False})

    async def _file(self, request: web.Request) -> web.Response:
        await self._keep(request)
        file_id = request.match_info["file"]
        if file_id not in self.files:
            return self._answer(_error("No such file", "file_not_found"), 404)
        return self._answer(self._file_object(file_id))

    async def _create_batch(self, request: web.Request) -> web.Response:
        await self._keep(request)
        batch_id = f"batch_{next(self._ids)}"
        # Done at once: its output is a file of the account's, as the API's would be.
        output_id = f"file-out-{next(self._ids)}"
        self.files[output_id] = ("batch_output.jsonl", b'{"id": "batch_req_1"}\n')
        self.batches[batch_id] = output_id
        return self._answer(self._batch_object(batch_id, None))

    async def _batch(self, request: web.Request) -> web.Response:
        await self._keep(request)
        batch_id = request.match_info["batch"]
        if batch_id not in self.batches:
            return self._answer(_error("No such batch", "batch_not_found"), 404)
        return self._answer(self._batch_object(batch_id, self.batches[batch_id]))

    def _batch_object(self, batch_id: str, output_file_id: str | None) -> dict[str, Any]:
        status = "completed" if output_file_id else "validating"
        return {
            "id": batch_id,
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "input_file_id": "file-input",
            "completion_window": "24h",
            "status": status,
            "output_file_id": output_file_id,
            "error_file_id": None,
            "created_at": 0,
        }

    async def _file_content(self, request: web.Request) -> web.Response:
        await self._keep(request)
        found = self.files.get(request.match_info["file"])
        if found is None:
            return self._answer(_error("No such file", "file_not_found"), 404)
        self.sent.append(found[1])
        return web.Response(body=found[1], content_type="application/octet-stream")

    async def _delete_file(self, request: web.Request) -> web.Response:
        await self._keep(request)
        file_id = request.match_info["file"]
        deleted = self.files.pop(file_id, None) is not None
        return self._answer({"id": file_id, "object": "file", "deleted": deleted})

    async def _create_vector_store(self, request: web.Request) -> web.Response:
        body = orjson.loads(await self._keep(request))
        store_id = f"vs_{next(self._ids)}"
        file_ids = [f for f in body.get("file_ids", []) if f in self.files]
        self.vector_stores[store_id] = file_ids
        counts = {"completed": len(file_ids), "total": len(file_ids)}
        return self._answer(
            {"id": store_id, "object": "vector_store", "created_at": 0, "file_counts": counts}
        )

    async def _vector_store_file_content(self, request: web.Request) -> web.Response:
        """A file of the store's, as the API serves it: to whoever names the store."""
        await self._keep(request)
        store, file_id = request.match_info["store"], request.match_info["file"]
        if file_id not in self.vector_stores.get(store, []):
            return self._answer(_error("No such file", "file_not_found"), 404)
        text = self.files[file_id][1].decode(errors="replace")
        data = [{"type": "text", "text": text}]
        return self._answer({"file_id": file_id, "filename": self.files[file_id][0], "data": data})

    async def _compact(self, request: web.Request) -> web.Response:
        body = orjson.loads(await self._keep(request))
        built_on = body.get("previous_response_id") or "the input"
        summary = {"type": "message", "role": "user", "content": f"compacted {built_on}"}
        return self._answer(
            {"id": f"resp_c{next(self._ids)}", "object": "response.compaction", "output": [summary]}
        )

    async def _input_tokens(self, request: web.Request) -> web.Response:
        body = orjson.loads(await self._keep(request))
        return self._answer({"object": "response.input_tokens", "input_tokens": len(str(body))})

    async def _speech(self, request: web.Request) -> web.StreamResponse:
        body = orjson.loads(await self._keep(request))
        audio = hashlib.sha256(str(body["input"]).encode()).digest() * 2_000
        self.sent.append(audio)
        response = web.StreamResponse(headers={"Content-Type": "audio/mpeg"})
        await response.prepare(request)
        size = len(audio) // SPEECH_CHUNKS + 1
        for start in range(0, len(audio), size):
            await response.write(audio[start : start + size])
            if start == 0 and self.speech_gate is not None:
                await self.speech_gate.wait()
            await asyncio.sleep(0.01)  # a stream, not one piece
        await response.write_eof()
        return response

    async def _realtime(self, request: web.Request) -> web.StreamResponse:
        """The Realtime API as far as a relay can tell: ``session.created`` first, then each
        client event echoed (binary frames too); ``{"type": "fake.close", "code": N}`` makes
        the provider close with ``N``, ``{"type": "fake.mute"}`` makes it stop answering pings
        (a provider gone silent on an open connection). It speaks the ``realtime`` subprotocol
        when offered."""
        await self._keep(request)
        model = request.query.get("model", "")
        if model.startswith("missing"):
            return self._answer(
                _error(f"The model '{model}' does not exist", "model_not_found"), 404
            )
        ws = web.WebSocketResponse(protocols=("realtime",), autoping=False)
        await ws.prepare(request)
        await ws.send_json({"type": "session.created", "event_id": "event_0", "model": model})
        muted = False
        async for message in ws:
            if message.type is WSMsgType.PING:
                self.realtime_pings += 1
                if not muted:
                    await ws.pong(message.data)
                continue
            if message.type is WSMsgType.BINARY:
                await ws.send_bytes(message.data)
                continue
            event = orjson.loads(message.data)
            if event.get("type") == "fake.close":
                await ws.close(code=event["code"])
                break
            if event.get("type") == "fake.mute":
                muted = True
                continue
            echo = {"type": "fake.echo", "event_id": f"event_{next(self._ids)}", "echo": event}
            await ws.send_json(echo)
        self.realtime_closes.append(ws.close_code)
        return ws


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _refusing_junk(handler: Handler) -> Handler:
    """Like a real provider, a body it cannot make sense of gets a 400, never a crash."""

    async def refusing(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            invalid = _error(f"Invalid request: {type(exc).__name__}", "invalid_request")
            return web.json_response(invalid, status=400)

    return refusing


def _error(message: str, code: str) -> dict[str, Any]:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    return {"error": error}


def _form_fields(raw: bytes, content_type: str) -> dict[str, tuple[str, bytes]]:
    """A multipart/form-data body's fields: name → (file name or "", bytes)."""
    message = BytesParser(policy=email.policy.default).parsebytes(
        b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + raw
    )
    fields: dict[str, tuple[str, bytes]] = {}
    for part in message.iter_parts():
        name = part.get_param("name", header="content-disposition")
        payload = part.get_payload(decode=True)
        content = payload if isinstance(payload, bytes) else b""
        fields[str(name)] = (part.get_filename() or "", content)
    return fields
