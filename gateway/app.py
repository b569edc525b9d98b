"""The ASGI app (FastAPI): routes, bearer auth, request size limit, and protocol-shaped errors.

Routes:

* ``POST /v1/chat/completions`` — :mod:`gateway.openai_chat`
* ``POST /v1/responses``, ``POST /v1/responses/input_tokens`` — :mod:`gateway.openai_responses`
* ``POST /v1/messages``, ``POST /v1/messages/count_tokens`` — :mod:`gateway.anthropic_messages`
* ``GET /v1/models``, ``GET /v1/models/{id}`` (alias ``default``); Anthropic shape when the
  request has an ``anthropic-version`` header
* ``GET /health`` — 200 when the engine's gRPC health says SERVING, else 503

Errors are rendered in the protocol of the path (Anthropic for ``/v1/messages*``, OpenAI
otherwise): 400 for invalid bodies (as both APIs and vLLM do), 401 bad/missing key,
404 unknown route or model, 405 wrong method, 413 body over the limit, 503 engine down.
"""
from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from . import anthropic_messages, openai_chat, openai_responses
from .engine import EngineClient
from .errors import ApiError

log = logging.getLogger("ninfer.gateway")

#: Default request body limit in bytes (the engine accepts 8 MiB gRPC messages).
DEFAULT_MAX_REQUEST_BYTES = 8 << 20


@dataclass
class GatewayConfig:
    """Gateway settings.

    Attributes:
        engine_target: ``host:port`` of the engine's public gRPC API.
        model_name: the served model's name in ``/v1/models`` and responses.
        api_key: bearer token required on ``/v1/*`` (None = no auth).
        engine_api_key: bearer token sent to the engine's gRPC API (its ``--api-key``; None = none).
        max_request_bytes: request body limit in bytes (413 above it).
    """

    engine_target: str
    model_name: str = "SmolLM2-135M-Instruct"
    api_key: str | None = None
    engine_api_key: str | None = None
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES


def _is_anthropic(path: str) -> bool:
    return path.startswith("/v1/messages")


def error_response(path: str, err: ApiError) -> JSONResponse:
    """Renders ``err`` in the protocol that owns ``path``."""
    body = err.anthropic_body() if _is_anthropic(path) else err.openai_body()
    headers = {"WWW-Authenticate": "Bearer"} if err.status == 401 else None
    return JSONResponse(body, status_code=err.status, headers=headers)


class Guard:
    """Pure ASGI middleware (no per-chunk overhead on SSE streams, unlike ``BaseHTTPMiddleware``):

    * bearer auth on ``/v1/*`` when ``api_key`` is set — ``Authorization: Bearer KEY`` (OpenAI
      SDK, vLLM's ``--api-key``) or ``x-api-key: KEY`` (Anthropic SDK); 401 otherwise;
    * 413 when the body exceeds ``limit`` bytes — by ``Content-Length`` before reading, or,
      for chunked bodies, while reading. The body is read here (every route reads it whole
      anyway) and replayed to the app.
    """

    def __init__(self, app: Any, limit: int, api_key: str | None = None) -> None:
        self.app, self.limit, self.api_key = app, limit, api_key

    def _authorized(self, headers: dict[bytes, bytes]) -> bool:
        given = headers.get(b"authorization", b"")
        token = given[7:] if given[:7].lower() == b"bearer " else headers.get(b"x-api-key", b"")
        return hmac.compare_digest(token, self.api_key.encode())

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope.get("headers", ()))
        if self.api_key and scope["path"].startswith("/v1/") and not self._authorized(headers):
            deny = error_response(scope["path"], ApiError(401, "invalid or missing API key", None,
                                                          "invalid_api_key"))
            return await deny(scope, receive, send)
        too_big = error_response(scope["path"], ApiError(
            413, f"request body exceeds the limit of {self.limit} bytes", None, "RequestTooLarge"))
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.limit:
                return await too_big(scope, receive, send)
        chunks: list[bytes] = []
        size = 0
        while True:
            msg = await receive()
            if msg["type"] != "http.request":  # client went away
                return
            size += len(msg.get("body", b""))
            if size > self.limit:
                return await too_big(scope, receive, send)
            chunks.append(msg.get("body", b""))
            if not msg.get("more_body", False):
                break
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()  # http.disconnect when the client leaves (SSE cancellation)

        await self.app(scope, replay, send)


def create_app(config: GatewayConfig) -> FastAPI:
    """Builds the FastAPI app; the engine channel opens on start-up and closes on shutdown."""
    state: dict[str, EngineClient] = {}
    model = config.model_name

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI):
        state["engine"] = EngineClient(config.engine_target, api_key=config.engine_api_key)  # connects lazily
        try:
            yield
        finally:
            await state["engine"].close()

    app = FastAPI(title="NInfer gateway", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)

    def engine() -> EngineClient:
        return state["engine"]

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, err: ApiError):
        return error_response(request.url.path, err)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, err: StarletteHTTPException):
        message = {404: f"no route {request.url.path}",
                   405: f"method {request.method} is not allowed on {request.url.path}"}.get(err.status_code,
                                                                                             str(err.detail))
        resp = error_response(request.url.path, ApiError(err.status_code, message, None, None))
        if err.headers:
            resp.headers.update(err.headers)
        return resp

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, err: Exception):
        log.exception("unexpected gateway error on %s", request.url.path)
        return error_response(request.url.path, ApiError(500, f"internal gateway error: {type(err).__name__}",
                                                         None, "InternalError"))

    async def body_of(request: Request) -> dict:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not valid JSON: {e}", None, "InvalidJSON") from None
        except RecursionError:
            raise ApiError(400, "the request body nests too deeply", None, "InvalidJSON") from None
        if not isinstance(body, dict):
            raise ApiError(400, f"the request body must be a JSON object, got {type(body).__name__}", None,
                           "InvalidRequest")
        return body

    async def until_disconnect(request: Request, work) -> Response:
        """Runs a non-streaming generation, cancelling it (and so the engine request: the gRPC
        call is cancelled and its lane freed) when the HTTP client goes away first."""
        task = asyncio.ensure_future(work)

        async def gone() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        watcher = asyncio.ensure_future(gone())
        try:
            await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError):
                await task
            log.info("client disconnected from %s; generation cancelled", request.url.path)
            return Response(status_code=499)  # nginx's "client closed request"; nobody reads it
        return JSONResponse(task.result())

    def sse(events) -> EventSourceResponse:
        return EventSourceResponse(events, sep="\n", ping=15)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        cr = openai_chat.parse(await body_of(request), model)
        if cr.stream:
            return sse(await openai_chat.stream(engine(), cr, model))
        return await until_disconnect(request, openai_chat.complete(engine(), cr, model))

    @app.post("/v1/responses")
    async def responses(request: Request):
        rr = openai_responses.parse(await body_of(request), model)
        if rr.stream:
            return sse(await openai_responses.stream(engine(), rr, model))
        return await until_disconnect(request, openai_responses.complete(engine(), rr, model))

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens(request: Request):
        req = openai_responses.count_request(await body_of(request), model)
        resp = await engine().count_tokens(req)
        return {"object": "response.input_tokens", "input_tokens": resp.num_tokens}

    @app.post("/v1/messages")
    async def messages(request: Request):
        mr = anthropic_messages.parse(await body_of(request), model)
        if mr.stream:
            return sse(await anthropic_messages.stream(engine(), mr, model))
        return await until_disconnect(request, anthropic_messages.complete(engine(), mr, model))

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens(request: Request):
        req = anthropic_messages.count_request(await body_of(request), model)
        resp = await engine().count_tokens(req)
        return {"input_tokens": resp.num_tokens}

    def model_card(anthropic: bool) -> dict:
        if anthropic:
            return {"type": "model", "id": model, "display_name": model, "created_at": "1970-01-01T00:00:00Z"}
        return {"id": model, "object": "model", "created": 0, "owned_by": "ninfer"}

    @app.get("/v1/models")
    async def models(request: Request):
        anthropic = "anthropic-version" in request.headers
        if anthropic:
            return {"data": [model_card(True)], "has_more": False, "first_id": model, "last_id": model}
        return {"object": "list", "data": [model_card(False)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_info(model_id: str, request: Request):
        if model_id not in (model, "default"):
            raise ApiError(404, f"The model `{model_id}` does not exist.", "model", "model_not_found")
        return model_card("anthropic-version" in request.headers)

    @app.get("/health")
    async def health():
        if await engine().healthy():
            return {"status": "ok", "engine": config.engine_target}
        return JSONResponse({"status": "unavailable", "engine": config.engine_target}, status_code=503)

    return app


def wrap(app: FastAPI, config: GatewayConfig) -> Any:
    """The ASGI callable to serve: ``app`` behind :class:`Guard` (auth, body-size limit)."""
    return Guard(app, config.max_request_bytes, config.api_key)
