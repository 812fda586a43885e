"""The OpenAI-compatible HTTP server: FastAPI routes over one shared `AsyncLLMEngine`.

Contract: `build_app(llm, ...)` returns a FastAPI app whose lifespan starts the engine thread
and, on shutdown, aborts whatever still runs (every KV block freed).  Routes:

    POST /v1/completions, /v1/chat/completions   (stream: true -> server-sent events)
    GET  /v1/models                              the served names, with root and max_model_len
    POST /tokenize, /detokenize; GET /tokenizer_info   vLLM's tokenizer routes
    GET  /version, /health (503 once the engine thread died), /metrics (Prometheus)

Every error is {"error": {"message", "type", "param", "code"}} with a 4xx status (5xx only for
the server's own failures); a bad request never reaches the engine, and a client that
disconnects has its requests aborted at once.  With `api_key`, every route but /health needs
"Authorization: Bearer <key>".  With a `rate_limiter`, a generating request is admitted for
prompt + max_tokens tokens or answered 429 before the engine sees it, and settled to the
tokens it used when it ends (rate_limit.py); with a keys file, an unknown key is a 401.
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

from minilm_engine.entrypoints import DEFAULT_HOST
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine
from minilm_engine.entrypoints.chat_template import chat_format_for
from minilm_engine.entrypoints.llm import LLM
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
from minilm_engine.entrypoints.rate_limit import RateLimiter, RateLimitExceeded, Reservation


@dataclass(frozen=True)
class CORSOptions:
    """Who may call the API from a browser page of another origin (vLLM's --allowed-* flags)."""

    allowed_origins: list[str] = field(default_factory=lambda: ["*"])
    allowed_methods: list[str] = field(default_factory=lambda: ["*"])
    allowed_headers: list[str] = field(default_factory=lambda: ["*"])
    allow_credentials: bool = False


def build_app(llm: LLM, served_model_names: list[str] | None = None, api_key: str | None = None,
              rate_limiter: RateLimiter | None = None, cors: CORSOptions | None = None) -> FastAPI:
    """`served_model_names`: the names requests may use (default: the model as given)."""
    keys_file = rate_limiter is not None and rate_limiter.keys is not None
    if api_key is not None and keys_file:
        raise ValueError("give api_key or a keys file (rate_limiter.keys), not both")
    names = list(served_model_names or [llm.model_name])
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

    def card(name: str) -> ModelCard:
        return ModelCard(id=name, root=llm.model_name, max_model_len=engine.max_model_len)

    @app.get("/v1/models")
    async def models():
        return ModelList(data=[card(n) for n in names]).model_dump()

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str):  # a hub id holds a slash: the rest of the path is the id
        serving.check_model(model_id)
        return card(model_id).model_dump()

    @app.get("/version")
    async def version():
        return {"version": package_version()}

    @app.post("/tokenize")
    async def tokenize_route(raw: Request):
        return tokenize(serving, await _parse(raw, TokenizeRequest))

    @app.post("/detokenize")
    async def detokenize_route(raw: Request):
        return detokenize(serving, await _parse(raw, DetokenizeRequest))

    @app.get("/tokenizer_info")  # what lm-evaluation-harness reads to tokenize through the server
    async def tokenizer_info_route():
        return tokenizer_info(serving)

    @app.post("/v1/completions")
    async def completions(raw: Request):
        return await _generate(raw, await _parse(raw, CompletionRequest))

    @app.post("/v1/chat/completions")
    async def chat_completions(raw: Request):
        return await _generate(raw, await _parse(raw, ChatCompletionRequest))

    return app


async def _parse(raw: Request, model):
    try:
        payload = json.loads(await raw.body())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise APIError(400, f"The body is not valid JSON: {e}.", None, "invalid_json") from None
    return parse_body(payload, model)


def bearer_key(authorization: str) -> str:
    """The KEY of "Bearer KEY" ("" when the header is missing or has no bearer token)."""
    scheme, _, key = authorization.partition(" ")
    return key.strip() if scheme.lower() == "bearer" else ""


def admit(limiter: RateLimiter | None, raw: Request, prepared: Prepared) -> Reservation | None:
    """Reserve prompt + max_tokens of every engine request, or a 429 (nothing reserved)."""
    if limiter is None or not limiter.is_enabled:
        return None
    cost = sum(r.num_prompt_tokens + r.max_new_tokens for r in prepared.requests)
    try:
        return limiter.admit(bearer_key(raw.headers.get("authorization", "")), cost)
    except RateLimitExceeded as e:
        raw.app.state.metrics.observe_rate_limited(e.kind)
        raise APIError(429, e.message, None, "rate_limit_exceeded", type=e.kind, headers=e.headers()) from None


async def _generate(raw: Request, body: CompletionRequest | ChatCompletionRequest):
    serving: OpenAIServing = raw.app.state.serving
    limiter: RateLimiter | None = raw.app.state.rate_limiter
    prepared = serving.prepare(body)
    reservation = admit(limiter, raw, prepared)

    def close(failed: bool) -> None:  # the reservation: refunded if nothing ran, else settled
        if reservation is None:
            return
        if failed:
            limiter.refund(reservation)
        else:
            used = sum(r.num_prompt_tokens + len(r.output_token_ids) for r in prepared.requests)
            limiter.settle(reservation, used)

    try:
        request_streams = await serving.submit(prepared)
    except BaseException:
        close(failed=True)
        raise
    headers = {"X-Request-Id": prepared.response_id}
    if reservation is not None:
        headers.update(reservation.status.headers())

    def abort_all() -> None:  # finished requests: ignored; the others: freed at once
        for request_id in prepared.request_ids:
            serving.engine.abort(request_id)

    if body.stream:
        async def events():
            failed = False
            try:
                async for line in serving.stream(prepared, request_streams):
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
    answer = asyncio.ensure_future(serving.response(prepared, request_streams))
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
