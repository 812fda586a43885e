"""Completions and chat completions: validated request -> engine request -> JSON or SSE chunks.

Contract: `OpenAIServing.prepare_*` turn a parsed request into an engine `Request` or raise
`APIError` (status, message, param, code) before anything reaches the engine; `stream_*` yield
the server-sent-event lines of a streamed answer ("data: {...}\\n\\n", then "data: [DONE]\\n\\n");
`collect` waits for the whole answer.  Neither knows about HTTP connections: the routes in
`api_server.py` abort the request when its client goes away.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass

from ...request import Request
from ..async_engine import AsyncLLMEngine, RequestStream, StreamDelta
from ..chat_template import ChatFormat, render_chat
from .protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    Usage,
    _SamplingFields,
)


class APIError(Exception):
    """An error answered to the client as {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Prepared:
    request: Request
    model: str
    include_usage: bool


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], chat_format: ChatFormat | None):
        self.engine = engine
        self.served_model_names = served_model_names
        self.chat_format = chat_format
        self.max_model_len = engine.max_model_len

    # -- preparing --------------------------------------------------------------------------

    def _check_common(self, body: _SamplingFields) -> None:
        if body.model not in self.served_model_names:
            raise APIError(404, f"The model `{body.model}` does not exist; this server serves "
                           f"{self.served_model_names}.", "model", "model_not_found")
        problem = body.unsupported()
        if problem is not None:
            raise APIError(400, problem[1], problem[0], "unsupported_value" if problem[0] != "n" else "invalid_value")

    def _make(self, request_id: str, prompt, body: _SamplingFields, max_tokens: int | None,
              extra_stop: tuple[str, ...] = ()) -> Request:
        try:
            params = body.to_sampling_params(max_tokens, extra_stop)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), _param_named_in(str(e)), "invalid_value") from None
        try:
            request = self.engine.make_request(request_id, prompt, params)
        except (ValueError, TypeError) as e:
            message = str(e)
            code = "context_length_exceeded" if "context" in message else "invalid_value"
            raise APIError(400, message, "prompt" if isinstance(body, CompletionRequest) else "messages", code) from None
        if max_tokens is not None and request.num_prompt_tokens + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {request.num_prompt_tokens + max_tokens} tokens ({request.num_prompt_tokens} "
                f"in the prompt, {max_tokens} for the completion). Reduce the prompt or max_tokens.",
                "max_tokens", "context_length_exceeded",
            )
        return request

    def prepare_completion(self, body: CompletionRequest) -> Prepared:
        self._check_common(body)
        request_id = self.engine.new_request_id("cmpl")
        request = self._make(request_id, body.engine_prompt(), body, body.max_tokens)
        return Prepared(request, body.model, body.include_usage)

    def prepare_chat(self, body: ChatCompletionRequest) -> Prepared:
        self._check_common(body)
        if self.chat_format is None:
            raise APIError(400, "This model has no chat template (its tokenizer defines none); "
                           "use /v1/completions with a prompt instead.", "messages", "no_chat_template")
        try:
            prompt = render_chat(self.engine.llm.tokenizer, self.chat_format,
                                 [m.as_template_input() for m in body.messages])
        except Exception as e:  # a template may raise on roles it does not support
            raise APIError(400, f"the chat template could not render these messages: {e}", "messages") from None
        request_id = self.engine.new_request_id("chatcmpl")
        request = self._make(request_id, prompt, body, body.max_new_tokens, self.chat_format.default_stop)
        return Prepared(request, body.model, body.include_usage)

    async def submit(self, prepared: Prepared) -> RequestStream:
        try:
            return await self.engine.add_request(prepared.request)
        except (ValueError, TypeError) as e:  # e.g. could not fit the KV pool even alone
            raise APIError(400, str(e), "max_tokens", "invalid_value") from None
        except RuntimeError as e:
            raise APIError(503, str(e), None, "shutting_down", type="server_error") from None

    # -- answering --------------------------------------------------------------------------

    @staticmethod
    async def collect(stream: RequestStream) -> tuple[str, str | None, int, int]:
        """(text, finish_reason, prompt tokens, output tokens) once the request ends."""
        pieces, last = [], None
        async for delta in stream:
            pieces.append(delta.text)
            last = delta
        return "".join(pieces), last.finish_reason, last.num_prompt_tokens, last.num_output_tokens

    async def completion_response(self, prepared: Prepared, stream: RequestStream) -> dict:
        text, reason, num_prompt, num_output = await self.collect(stream)
        return CompletionResponse(
            id=prepared.request.request_id, model=prepared.model,
            choices=[CompletionChoice(text=text, finish_reason=reason)],
            usage=Usage.of(num_prompt, num_output),
        ).model_dump()

    async def chat_response(self, prepared: Prepared, stream: RequestStream) -> dict:
        text, reason, num_prompt, num_output = await self.collect(stream)
        return ChatCompletionResponse(
            id=prepared.request.request_id, model=prepared.model,
            choices=[ChatChoice(message=ChatResponseMessage(content=text), finish_reason=reason)],
            usage=Usage.of(num_prompt, num_output),
        ).model_dump()

    async def stream_completion(self, prepared: Prepared, stream: RequestStream) -> AsyncIterator[str]:
        request_id, model = prepared.request.request_id, prepared.model
        last = None
        async for delta in stream:
            last = delta
            if not delta.text and not delta.finished:
                continue  # text held back (a possible stop string): nothing to show yet
            chunk = CompletionResponse(
                id=request_id, model=model,
                choices=[CompletionChoice(text=delta.text, finish_reason=delta.finish_reason)],
            ).model_dump(exclude={"usage"})
            yield sse(chunk)
        if prepared.include_usage and last is not None:
            yield _usage_event(CompletionResponse, request_id, model, last)
        yield sse("[DONE]")

    async def stream_chat(self, prepared: Prepared, stream: RequestStream) -> AsyncIterator[str]:
        request_id, model = prepared.request.request_id, prepared.model

        def chunk(delta: ChatDelta, finish_reason: str | None = None) -> str:
            return sse(ChatCompletionChunk(
                id=request_id, model=model,
                choices=[ChatChunkChoice(delta=delta, finish_reason=finish_reason)],
            ).model_dump(exclude={"usage"}, exclude_none=False))

        yield chunk(ChatDelta(role="assistant", content=""))
        last = None
        async for delta in stream:
            last = delta
            if delta.text:
                yield chunk(ChatDelta(content=delta.text))
            if delta.finished:
                yield chunk(ChatDelta(), delta.finish_reason)
        if prepared.include_usage and last is not None:
            yield _usage_event(ChatCompletionChunk, request_id, model, last)
        yield sse("[DONE]")


def _usage_event(chunk_class, request_id: str, model: str, last: StreamDelta) -> str:
    """The last event of a stream asked with stream_options.include_usage: no choices, usage."""
    return sse(chunk_class(id=request_id, model=model, choices=[],
                           usage=Usage.of(last.num_prompt_tokens, last.num_output_tokens)).model_dump())


def _param_named_in(message: str) -> str | None:
    """The sampling field an error message starts with ("top_p must be ..." -> "top_p")."""
    first = message.split(" ", 1)[0]
    return first if first.isidentifier() else None
