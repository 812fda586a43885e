"""The OpenAI-compatible HTTP server: FastAPI routes over one shared `AsyncLLMEngine`.

Contract: `build_app(llm, ...)` returns a FastAPI app whose lifespan starts the engine thread
and, on shutdown, aborts whatever is still running (every KV block freed).  Routes:

    POST /v1/completions        prompt(s) -> text (stream: true -> server-sent events)
    POST /v1/chat/completions   messages -> text  (the chat template, see entrypoints/chat_template.py)
    GET  /v1/models             the served model name(s), with root and max_model_len
    POST /tokenize, /detokenize text or messages <-> token ids (vLLM's routes)
    GET  /tokenizer_info        the tokenizer's configuration and chat template (vLLM's)
    GET  /version               this package's version
    GET  /health                200 while the engine thread is alive, 503 otherwise
    GET  /metrics               Prometheus text format (metrics.py)

The served name is the model as the caller gave it (`serve Qwen/Qwen3-0.6B` serves
"Qwen/Qwen3-0.6B", as vLLM does), unless `served_model_names` lists others; a request may
name any of them.

Every error is an OpenAI-style body {"error": {"message", "type", "param", "code"}} with a
4xx status (5xx only for the server's own failures); a bad request never reaches the engine.
A client that disconnects has its request aborted at once, streamed or not.  With `api_key`
set, every route but /health needs "Authorization: Bearer <key>".

With a `rate_limiter` (rate_limit.py), the two generating routes are limited per API key: a
request is tokenized and validated, then admitted for prompt + max_tokens tokens, or answered
429 with Retry-After and x-ratelimit-* headers before the engine sees it; when it ends, the
reservation is settled to the tokens it really used (an abort: what was computed so far; a
failure of the server's own: all refunded).  Every answer of those routes carries the key's
x-ratelimit-* headers.  With a keys file, a key not in it is a 401.

`serve(llm, host, port)` runs it in the foreground (the CLI); the course's `ServerThread`
(`course/experiments/server_thread.py`) runs it in a background thread (tests, notebooks).
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager

from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minilm_engine.entrypoints.llm import LLM
from minilm_engine.entrypoints import DEFAULT_HOST
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimitExceeded, Reservation
from minilm_engine.entrypoints.chat_template import chat_format_for
from minilm_engine.entrypoints.metrics import ServerMetrics
from minilm_engine.entrypoints.openai.protocol import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    ModelCard,
    ModelList,
    TokenizeRequest,
)
from minilm_engine.entrypoints.openai.serving import APIError, OpenAIServing, Prepared, parse_body, sse
from minilm_engine.entrypoints.openai.serving_tokenization import detokenize, tokenize, tokenizer_info


def model_root(llm: LLM) -> str:
    """The model as the caller named it (a shipped name, a hub id, a folder); the resolved
    folder's name when none was given (`LLM()` loads the default)."""
    return llm.model_name if llm.model_name != "None" else llm.model_path.name


@dataclass(frozen=True)
class CORSOptions:
    """Who may call the API from a browser page of another origin (vLLM's --allowed-* flags)."""

    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def build_app(llm: LLM, served_model_names: list[str] | None = None, api_key: str | None = None,
              rate_limiter: RateLimiter | None = None, cors: CORSOptions | None = None) -> FastAPI:
    if api_key is not None and rate_limiter is not None and rate_limiter.keys is not None:
        raise ValueError("give api_key or a keys file (rate_limiter.keys), not both")
    root = model_root(llm)
    names = list(served_model_names or [root])
    engine = AsyncLLMEngine(llm)
    metrics = ServerMetrics(engine, names[0])
    serving = OpenAIServing(engine, names, chat_format_for(llm.tokenizer, llm.model_path))

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        engine.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            engine.shutdown()  # aborts what is left: its blocks go back to the pool

    app = FastAPI(title="minilm-engine OpenAI-compatible server", lifespan=lifespan)
    cors = cors or CORSOptions()
    app.add_middleware(CORSMiddleware, allow_origins=cors.allowed_origins, allow_methods=cors.allowed_methods,
                       allow_headers=cors.allowed_headers, allow_credentials=cors.allow_credentials)
    app.state.engine, app.state.serving, app.state.metrics = engine, serving, metrics
    app.state.rate_limiter = rate_limiter
    keys_file = rate_limiter is not None and rate_limiter.keys is not None

    @app.middleware("http")
    async def check_api_key(request: Request, call_next):
        # A browser's CORS preflight carries no credentials: the CORS layer inside answers it.
        if request.url.path != "/health" and request.method != "OPTIONS":
            given = request.headers.get("authorization", "")
            if api_key is not None:
                allowed = hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode())
            else:
                allowed = not keys_file or rate_limiter.knows(bearer_key(given))
            if not allowed:
                return _error(APIError(401, "Incorrect or missing API key: send the header "
                                       "'Authorization: Bearer <key>'.", None, "invalid_api_key"))
        return await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(_: Request, e: APIError):
        return _error(e)

    @app.exception_handler(RuntimeError)
    async def engine_error(_: Request, e: RuntimeError):  # a failed engine step (the server lives on)
        return _error(APIError(500, str(e), None, "engine_error", type="server_error"))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException):
        message = {404: f"No route {request.method} {request.url.path}; see /docs for the routes.",
                   405: f"Method {request.method} is not allowed on {request.url.path}."}
        return _error(APIError(e.status_code, message.get(e.status_code, str(e.detail)), None,
                               "not_found" if e.status_code == 404 else "method_not_allowed"))

    @app.get("/health")
    async def health():
        if not engine.is_running:
            return _error(APIError(503, "the engine loop is not running", None, "unhealthy", "server_error"))
        return {"status": "ok"}

    @app.get("/metrics")
    async def prometheus_metrics():
        return Response(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[ModelCard(id=n, root=root, max_model_len=engine.max_model_len)
                               for n in names]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):  # a hub id holds a slash: the rest of the path is the id
        serving.check_model(model_id)
        return ModelCard(id=model_id, root=root, max_model_len=engine.max_model_len).model_dump()

    @app.get("/version")
    async def version():
        return {"version": package_version()}

    @app.post("/tokenize")
    async def tokenize_route(raw: Request):
        return tokenize(serving, await _parse(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize_route(raw: Request):
        return detokenize(serving, await _parse(raw, DetokenizeRequest))

    # vLLM serves this only with --enable-tokenizer-info-endpoint; here it holds nothing that
    # /tokenize and the checkpoint's own tokenizer_config.json do not already show.
    @app.get("/tokenizer_info")
    async def tokenizer_info_route():
        return tokenizer_info(serving)

    @app.post("/v1/completions")
    async def completions(raw: Request):
        body = await _parse(raw, CompletionRequest)
        prepared = serving.prepare_completion(body)
        return await _answer(raw, serving, prepared, body.stream, serving.stream_completion,
                             serving.completion_response, admit(rate_limiter, raw, prepared))

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        body = await _parse(raw, ChatCompletionRequest)
        prepared = serving.prepare_chat(body)
        return await _answer(raw, serving, prepared, body.stream, serving.stream_chat, serving.chat_response,
                             admit(rate_limiter, raw, prepared))

    return app


async def _parse(raw: Request, model):
    data = await raw.body()
    try:
        payload = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"The body is not valid JSON: {e}.", None, "invalid_json") from None
    return parse_body(payload, model)


def bearer_key(authorization: str) -> str:
    """The KEY of "Bearer KEY" ("" when the header is missing or has no bearer token)."""
    scheme, _, key = authorization.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def admit(limiter: RateLimiter | None, raw: Request, prepared: Prepared) -> Reservation | None:
    """Reserve prompt + max_tokens of every prompt of the request, or a 429 (nothing reserved,
    nothing sent to the engine)."""
    if limiter is None or not limiter.is_enabled:
        return None
    cost = sum(r.num_prompt_tokens + r.max_new_tokens for r in prepared.requests)
    try:
        return limiter.admit(bearer_key(raw.headers.get("authorization", "")), cost)
    except RateLimitExceeded as e:
        raw.app.state.metrics.observe_rate_limited(e.kind)
        raise APIError(429, e.message, None, "rate_limit_exceeded", type=e.kind, headers=e.headers()) from None


def _tokens_used(prepared: Prepared) -> int:
    return sum(r.num_prompt_tokens + len(r.output_token_ids) for r in prepared.requests)


async def _answer(raw: Request, serving: OpenAIServing, prepared, stream: bool, streamer, collector,
                  reservation: Reservation | None = None):
    limiter: RateLimiter | None = raw.app.state.rate_limiter

    def close(failed: bool) -> None:  # the reservation: refunded if nothing ran, else settled
        if reservation is not None:
            if failed:
                limiter.refund(reservation)
            else:
                limiter.settle(reservation, _tokens_used(prepared))

    try:
        request_streams = await serving.submit(prepared)
    except BaseException:
        close(failed=True)
        raise
    response_id = prepared.response_id
    headers = {"X-Request-Id": response_id, **({} if reservation is None else reservation.status.headers())}

    def abort_all() -> None:  # finished requests: ignored; the others: freed at once
        for request_id in prepared.request_ids:
            serving.engine.abort(request_id)

    if stream:
        async def events():
            failed = False
            try:
                async for line in streamer(prepared, request_streams):
                    yield line
            except RuntimeError as e:  # the engine step failed: say so in the stream, then end it
                failed = True
                yield sse(APIError(500, str(e), None, "engine_error", type="server_error").body())
                yield sse("[DONE]")  # as vLLM ends a stream after an error event: clients stop reading
            finally:  # finished, or the client left (cancelled here)
                abort_all()
                close(failed)

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **headers})
    # Not streamed: still abort when the client goes away before the answer is ready.
    answer = asyncio.ensure_future(collector(prepared, request_streams))
    gone = asyncio.ensure_future(_disconnected(raw))
    try:
        await asyncio.wait({answer, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not answer.done():
            answer.cancel()
            abort_all()
        close(failed=answer.done() and not answer.cancelled() and answer.exception() is not None)
    if answer.cancelled():
        return Response(status_code=499)  # nobody reads it: the client is gone
    return JSONResponse(answer.result(), headers=headers)


async def _disconnected(raw: Request) -> None:
    while True:
        message = await raw.receive()
        if message["type"] == "http.disconnect":
            return


def _error(e: APIError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


# -- running it ---------------------------------------------------------------------------------


def serve(llm: LLM, host: str = DEFAULT_HOST, port: int = 8000, served_model_names: list[str] | None = None,
          api_key: str | None = None, shutdown_timeout: float = 5.0, log_level: str = "info",
          rate_limiter: RateLimiter | None = None, cors: CORSOptions | None = None) -> None:
    """Serve until Ctrl-C: in-flight requests get `shutdown_timeout` s to finish, then are aborted."""
    app = build_app(llm, served_model_names, api_key, rate_limiter, cors)
    uvicorn.run(app, host=host, port=port, log_level=log_level, timeout_graceful_shutdown=shutdown_timeout)


def package_version() -> str:
    """The installed minilm-engine's version (GET /version), as pip recorded it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("minilm-engine")
    except PackageNotFoundError:  # run from a checkout on PYTHONPATH, not installed
        return "unknown"
