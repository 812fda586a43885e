"""Completions and chat completions: validated request -> engine requests -> JSON or SSE chunks.

Contract: `OpenAIServing.prepare(body)` turns a parsed request into a `Prepared` (one engine
`Request` per prompt and sample) or raises `APIError` before anything reaches the engine;
`submit` adds them all or none; `stream` yields the server-sent events of the answer ("data:
{...}\\n\\n", then "data: [DONE]\\n\\n"), `response` waits for the whole answer.  Neither knows
about HTTP: the routes in `api_server.py` abort the requests when their client goes away.

With P prompts and n samples each, prompt i's sample j is choice i * n + j (OpenAI's order).
A streamed chat sends the role with each choice's first text, so a client's time to first token
is the engine's.  Usage counts each prompt once, however many samples it has (vLLM's rule).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ValidationError

from minilm_engine.core.outputs import PositionLogprobs
from minilm_engine.core.request import Request
from minilm_engine.entrypoints.async_engine import AsyncLLMEngine, RequestStream, StreamDelta
from minilm_engine.entrypoints.chat_template import ChatFormat, render_chat
from minilm_engine.entrypoints.openai.protocol import (
    ChatChoice,
    ChatChunkChoice,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    ChatDelta,
    ChatResponseMessage,
    ChatToolCallsDelta,
    CompletionChoice,
    CompletionRequest,
    CompletionResponse,
    ToolCallDelta,
    Usage,
    _SamplingFields,
    warn_ignored,
)
from minilm_engine.entrypoints.openai.logprobs_format import chat_logprobs, completion_logprobs
from minilm_engine.entrypoints.openai.tool_calls import read_tagged_tool_calls, read_tool_calls


# OpenAI's service tiers -> the engine's priority (lower first).  "flex" is the batch tier:
# served from what interactive requests leave (--scheduling-policy priority).
SERVICE_TIER_PRIORITY = {"auto": 0, "default": 0, "flex": 1000}


class APIError(Exception):
    """Answered as {"error": {message, type, param, code}}, with `headers` (a 429's Retry-After)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Prepared:
    """One HTTP request, ready for the engine: one engine request per choice."""

    response_id: str
    requests: list[Request]
    model: str
    chat: bool
    include_usage: bool  # a last chunk with the usage of the whole answer
    continuous_usage: bool  # usage on every chunk too (vLLM's continuous_usage_stats)
    tokenizer: object  # for the tokens' text in logprobs
    echo: bool = False  # completions: each choice's text starts with its prompt
    # chat with tools: "auto" (calls read from the text if the model wrote any), "required" or a
    # function's name (a forced call: the text is the call); None: no tool calls
    tool_mode: str | None = None

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]

    def usage(self, num_output_tokens: int) -> Usage:
        """Each prompt counted once, not once per sample."""
        num_prompt_tokens = sum(r.num_prompt_tokens for r in self.requests if r.index == 0)
        return Usage.of(num_prompt_tokens, num_output_tokens)

    def prompt_text(self, request: Request) -> str:
        return request.prompt if request.prompt is not None else self.tokenizer.decode(request.prompt_token_ids)

    @staticmethod
    def prompt_logprobs(request: Request) -> list[PositionLogprobs | None] | None:
        """Sample 0 computes the prompt's logprobs for all n samples of its prompt."""
        return (request.prefix_source or request).prompt_logprobs


@dataclass
class Answer:
    """One choice, collected to its end."""

    text: str
    finish_reason: str | None
    stop_reason: int | str | None
    num_output_tokens: int
    token_ids: list[int]
    logprobs: list[PositionLogprobs] | None


@dataclass
class _Unsent:
    """A streamed choice: what it has not sent yet, and where it stands."""

    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)
    started: bool = False  # its first chunk went out (chat: with the role)
    text_offset: int = 0  # completions: the text_offset of the next token
    held: str = ""  # chat with tools: the text, sent once finished

    def take(self) -> tuple[list[int], list]:
        out, self.token_ids, self.logprobs = (self.token_ids, self.logprobs), [], []
        return out


def parse_body(payload: Any, model: type[BaseModel]):
    """A decoded JSON body -> the request `model`, or a 400 naming the first wrong field (the
    HTTP routes and run-batch parse through this one function)."""
    if not isinstance(payload, dict):
        raise APIError(400, f"The body must be a JSON object, got {type(payload).__name__}.", None, "invalid_json")
    try:
        return model.model_validate(payload)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        detail = first["msg"]
        if first["type"] == "missing":
            detail = "this field is required"
        else:
            given = repr(first.get("input"))
            detail += f" (got {given if len(given) <= 200 else given[:200] + '...'})"
        raise APIError(400, f"Invalid request: {where}: {detail}.", str(first["loc"][0]) if first["loc"] else None,
                       "invalid_value") from None


def sse(payload: dict | str) -> str:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    return f"data: {data}\n\n"


class OpenAIServing:
    def __init__(self, engine: AsyncLLMEngine, served_model_names: list[str], chat_format: ChatFormat | None):
        self.engine = engine
        self.served_model_names = served_model_names
        self.chat_format = chat_format
        self.max_model_len = engine.max_model_len
        self.scheduling_policy = engine.engine.config.scheduling_policy

    # -- preparing --------------------------------------------------------------------------

    def check_model(self, model: str | None) -> None:
        """404 for a model this server does not serve (None: the request named none, fine)."""
        if model is not None and model not in self.served_model_names:
            raise APIError(404, f"The model `{model}` does not exist; this server serves "
                           f"{self.served_model_names}.", "model", "model_not_found")

    def priority_of(self, body: _SamplingFields) -> int:
        """Its `priority` if given, else its tier's (under fcfs all are 0; another is a 400)."""
        tier = body.service_tier
        if tier is not None and tier not in SERVICE_TIER_PRIORITY:
            raise APIError(400, f"service_tier must be one of {sorted(SERVICE_TIER_PRIORITY)}, got {tier!r}",
                           "service_tier", "invalid_value")
        if body.priority is not None:
            if body.priority != 0 and self.scheduling_policy != "priority":
                raise APIError(400, f"priority {body.priority} needs priority scheduling, which this server "
                               "does not run (start it with --scheduling-policy priority); send 0 or null",
                               "priority", "invalid_value")
            return body.priority
        if self.scheduling_policy != "priority":
            return 0
        return SERVICE_TIER_PRIORITY[tier or "auto"]

    def _make(self, request_id: str, prompt, body: _SamplingFields, max_tokens: int | None,
              extra_stop: tuple[str, ...] = ()) -> list[Request]:
        """The n engine requests of one prompt (samples 0..n-1), or a 400 naming the field."""
        try:
            params = body.to_sampling_params(max_tokens, extra_stop, self.engine.llm.generation_config)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), _param_named_in(str(e), body), "invalid_value") from None
        priority = self.priority_of(body)
        try:
            requests = self.engine.make_requests(request_id, prompt, params, priority)
        except (ValueError, TypeError) as e:
            message = str(e)
            param = _param_named_in(message, body)
            if param is None:
                param = "prompt" if isinstance(body, CompletionRequest) else "messages"
            code = "context_length_exceeded" if "context" in message else "invalid_value"
            raise APIError(400, message, param, code) from None
        num_prompt_tokens = requests[0].num_prompt_tokens
        if max_tokens is not None and num_prompt_tokens + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {num_prompt_tokens + max_tokens} tokens ({num_prompt_tokens} "
                f"in the prompt, {max_tokens} for the completion{self.engine.llm.input_processor.context_note()}). "
                f"Reduce the prompt or max_tokens.",
                "max_tokens", "context_length_exceeded",
            )
        return requests

    def prepare(self, body: CompletionRequest | ChatCompletionRequest) -> Prepared:
        self.check_model(body.model)
        problem = body.unsupported()
        if problem is not None:
            param, message = problem
            code = "invalid_value" if param in ("n", "prompt") else "unsupported_value"
            raise APIError(400, message, param, code)
        warn_ignored(body.ignored_fields())
        chat = isinstance(body, ChatCompletionRequest)
        response_id = self.engine.new_request_id("chatcmpl" if chat else "cmpl")
        if chat:
            tools = body.template_tools()
            template_kwargs = dict(body.chat_template_kwargs or {})
            if tools:
                template_kwargs["tools"] = tools
            prompt = self.render(body.messages, template_kwargs)
            # The template's stop strings end the assistant's turn; ignore_eos ignores them too
            # (guidellm and `bench serve` ask for exactly max_tokens that way), and a grammar
            # ends its own turn (its JSON may hold a newline).
            turn_end = () if body.ignore_eos or body.constrained else self.chat_format.default_stop
            requests = self._make(response_id, prompt, body, body.max_new_tokens, turn_end)
        else:
            prompts = body.engine_prompts()
            # One engine request per prompt, all made (and so all checked) before any is submitted.
            ids = [response_id] if len(prompts) == 1 else [f"{response_id}-{i}" for i in range(len(prompts))]
            requests = [r for rid, prompt in zip(ids, prompts)
                        for r in self._make(rid, prompt, body, body.max_tokens)]
        model = self.served_model_names[0] if body.model is None else body.model  # vLLM's default
        return Prepared(response_id, requests, model, chat, body.include_usage,
                        body.continuous_usage, self.engine.llm.tokenizer,
                        echo=not chat and body.echo, tool_mode=body.tool_mode if chat else None)

    def render(self, messages, template_kwargs: dict | None = None) -> str:
        """Chat messages -> the prompt text (the chat template), or a 400 saying why not."""
        if self.chat_format is None:
            raise APIError(400, "This model has no chat template (its tokenizer defines none); "
                           "use /v1/completions with a prompt instead.", "messages", "no_chat_template")
        try:
            return render_chat(self.engine.llm.tokenizer, self.chat_format,
                               [m.as_template_input() for m in messages], template_kwargs)
        except Exception as e:  # a template may raise on roles it does not support
            raise APIError(400, f"the chat template could not render these messages: {e}", "messages") from None

    async def submit(self, prepared: Prepared) -> list[RequestStream]:
        """Add every request of `prepared` to the engine, or none (those added are aborted)."""
        streams: list[RequestStream] = []
        try:
            for request in prepared.requests:
                streams.append(await self.engine.add_request(request))
        except BaseException as e:
            for request_id in prepared.request_ids:
                self.engine.abort(request_id)
            if isinstance(e, (ValueError, TypeError)):  # e.g. could not fit the KV pool even alone
                param = _param_named_in(str(e)) or "max_tokens"  # (or an option speculation refuses)
                raise APIError(400, str(e), param, "invalid_value") from None
            if isinstance(e, RuntimeError):
                raise APIError(503, str(e), None, "shutting_down", type="server_error") from None
            raise
        return streams

    # -- whole answers ----------------------------------------------------------------------

    @staticmethod
    async def collect(stream: RequestStream) -> Answer:
        """A choice's text, tokens and logprobs once its request ends."""
        pieces, token_ids, logprobs, last = [], [], [], None
        async for delta in stream:
            pieces.append(delta.text)
            token_ids += delta.token_ids
            if delta.logprobs is not None:
                logprobs += delta.logprobs
            last = delta
        return Answer("".join(pieces), last.finish_reason, last.stop_reason, last.num_output_tokens, token_ids,
                      logprobs if last.logprobs is not None else None)

    async def response(self, prepared: Prepared, streams: list[RequestStream]) -> dict:
        answers = await asyncio.gather(*(self.collect(s) for s in streams))
        choose = self._chat_choice if prepared.chat else self._completion_choice
        response = ChatCompletionResponse if prepared.chat else CompletionResponse
        return response(
            id=prepared.response_id, model=prepared.model,
            choices=[choose(prepared, i, answer) for i, answer in enumerate(answers)],
            usage=prepared.usage(sum(a.num_output_tokens for a in answers)),
        ).model_dump()

    @staticmethod
    def _completion_choice(prepared: Prepared, index: int, answer: Answer) -> CompletionChoice:
        request = prepared.requests[index]
        text, token_ids, logprobs = answer.text, answer.token_ids, answer.logprobs
        if prepared.echo:
            text = prepared.prompt_text(request) + text
            if logprobs is not None:  # the prompt's positions first (its first token has none)
                token_ids = list(request.prompt_token_ids) + token_ids
                logprobs = list(prepared.prompt_logprobs(request)) + logprobs
        return CompletionChoice(
            index=index, text=text, finish_reason=answer.finish_reason, stop_reason=answer.stop_reason,
            logprobs=None if logprobs is None else completion_logprobs(token_ids, logprobs, prepared.tokenizer),
            prompt_logprobs=_prompt_logprobs_json(prepared.prompt_logprobs(request)),
        )

    @staticmethod
    def _chat_choice(prepared: Prepared, index: int, answer: Answer) -> ChatChoice:
        message = _chat_message(answer.text, answer.finish_reason, prepared.tool_mode)
        num_top = prepared.requests[index].sampling_params.logprobs
        return ChatChoice(
            index=index, message=message, stop_reason=answer.stop_reason,
            finish_reason="tool_calls" if message.tool_calls else answer.finish_reason,
            logprobs=None if answer.logprobs is None else chat_logprobs(
                answer.token_ids, answer.logprobs, num_top, prepared.tokenizer),
        )

    # -- streamed answers -------------------------------------------------------------------

    async def stream(self, prepared: Prepared, streams: list[RequestStream]) -> AsyncIterator[str]:
        last: dict[int, StreamDelta] = {}
        unsent: dict[int, _Unsent] = {}
        chunk_type = ChatCompletionChunk if prepared.chat else CompletionResponse
        choices = self._chat_chunks if prepared.chat else self._completion_chunks
        async for index, delta in merge_streams(streams):
            last[index] = delta
            state = unsent.setdefault(index, _Unsent())
            state.token_ids += delta.token_ids
            if delta.logprobs is not None:
                state.logprobs += delta.logprobs
            for choice in choices(prepared, index, delta, state):
                usage = prepared.usage(sum(d.num_output_tokens for d in last.values()))
                chunk = chunk_type(id=prepared.response_id, model=prepared.model, choices=[choice],
                                   usage=usage)
                yield sse(chunk.model_dump(exclude=None if prepared.continuous_usage else {"usage"}))
        if prepared.include_usage and last:  # a last event with no choices, only the usage
            usage = prepared.usage(sum(d.num_output_tokens for d in last.values()))
            chunk = chunk_type(id=prepared.response_id, model=prepared.model, choices=[],
                               usage=usage)
            yield sse(chunk.model_dump())
        yield sse("[DONE]")

    @staticmethod
    def _completion_chunks(prepared: Prepared, index: int, delta: StreamDelta,
                           state: _Unsent) -> list[CompletionChoice]:
        request = prepared.requests[index]
        text = delta.text
        if not state.started and prepared.echo:
            text = prepared.prompt_text(request) + text
            if request.logprobs is not None:
                state.token_ids[:0] = request.prompt_token_ids
                state.logprobs[:0] = prepared.prompt_logprobs(request)
        state.started = True
        if not text and not delta.finished:
            return []  # text held back (a possible stop string): nothing to show yet
        token_ids, rows = state.take()
        logprobs = None
        if request.logprobs is not None:
            logprobs = completion_logprobs(token_ids, rows, prepared.tokenizer, state.text_offset)
            if token_ids:
                state.text_offset = logprobs.text_offset[-1] + len(logprobs.tokens[-1])
        stop_reason = delta.stop_reason if delta.finished else None
        return [CompletionChoice(index=index, text=text, finish_reason=delta.finish_reason,
                                 stop_reason=stop_reason, logprobs=logprobs)]

    @staticmethod
    def _chat_chunks(prepared: Prepared, index: int, delta: StreamDelta,
                     state: _Unsent) -> list[ChatChunkChoice]:
        if prepared.tool_mode is not None:  # the text may be calls: sent once finished
            state.held += delta.text
            if not delta.finished:
                return []
            return _tool_call_chunks(index, state.held, delta, prepared.tool_mode)
        request = prepared.requests[index]
        out = []
        # The role rides on the first text (or on the end of an answer with none).  Logprobs of
        # tokens whose text was held back go out with the next text, or at the end.
        with_logprobs = request.logprobs is not None
        unsent_logprobs = bool(state.token_ids) and with_logprobs
        if delta.text or (delta.finished and (not state.started or unsent_logprobs)):
            token_ids, rows = state.take()
            logprobs = None
            if with_logprobs:
                num_top = request.sampling_params.logprobs
                logprobs = chat_logprobs(token_ids, rows, num_top, prepared.tokenizer)
            message = ChatDelta(role=None if state.started else "assistant", content=delta.text)
            out.append(ChatChunkChoice(index=index, delta=message, logprobs=logprobs))
            state.started = True
        if delta.finished:
            end = ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=delta.finish_reason)
            out.append(end)
        return out


def _tool_call_chunks(index: int, text: str, delta: StreamDelta,
                      tool_mode: str) -> list[ChatChunkChoice]:
    """A finished answer that may hold tool calls: any text first, the calls in one delta (each
    call's arguments whole), then the end."""
    message = _chat_message(text, delta.finish_reason, tool_mode)
    deltas: list[ChatDelta] = []
    if message.content or not message.tool_calls:
        deltas.append(ChatDelta(role="assistant", content=message.content or ""))
    if message.tool_calls:
        calls = [ToolCallDelta(index=k, **call.model_dump())
                 for k, call in enumerate(message.tool_calls)]
        role = None if message.content else "assistant"
        deltas.append(ChatToolCallsDelta(role=role, tool_calls=calls))
    finish_reason = "tool_calls" if message.tool_calls else delta.finish_reason
    return [ChatChunkChoice(index=index, delta=d) for d in deltas] + [
        ChatChunkChoice(index=index, delta=ChatDelta(), finish_reason=finish_reason)]


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, StreamDelta]]:
    """(index, delta) of several request streams, in arrival order; ends when all have ended,
    raises the first error any of them raises."""
    if len(streams) == 1:  # the common case needs no tasks
        async for delta in streams[0]:
            yield 0, delta
        return
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def pump(index: int, stream: RequestStream) -> None:
        try:
            async for delta in stream:
                queue.put_nowait((index, delta))
        except Exception as e:
            queue.put_nowait((index, e))
        finally:
            queue.put_nowait((index, done))

    tasks = [asyncio.ensure_future(pump(i, s)) for i, s in enumerate(streams)]
    try:
        num_open = len(streams)
        while num_open:
            index, item = await queue.get()
            if item is done:
                num_open -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield index, item
    finally:
        for task in tasks:
            task.cancel()


def _prompt_logprobs_json(rows: list[PositionLogprobs | None] | None) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs` field: per prompt token {id: {logprob, rank, decoded_token}}."""
    if rows is None:
        return None
    return [None if row is None else {
        token_id: {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": lp.decoded_token}
        for token_id, lp in row.items()} for row in rows]


def _chat_message(text: str, finish_reason: str | None,
                  tool_mode: str | None) -> ChatResponseMessage:
    """The message of a finished answer, with the tool calls it holds (none when cut short)."""
    found = None
    if tool_mode == "auto" and finish_reason == "stop":
        found = read_tagged_tool_calls(text)
    elif tool_mode is not None and finish_reason == "stop":
        calls = read_tool_calls(text, None if tool_mode == "required" else tool_mode)
        found = None if calls is None else (None, calls)
    if found is None:
        return ChatResponseMessage(content=text)
    return ChatResponseMessage(content=found[0], tool_calls=found[1])


def _param_named_in(message: str, body: _SamplingFields | None = None) -> str | None:
    """The request field an error message starts with ("top_p must be ..." -> "top_p"); in a
    chat request, the engine's "logprobs" limit is about top_logprobs."""
    first = message.split(" ", 1)[0].split("[", 1)[0].split(".", 1)[0].rstrip(":")  # "a.b: ..." -> "a"
    if not first.isidentifier():
        return None
    if isinstance(body, ChatCompletionRequest) and first == "logprobs":
        return "top_logprobs"
    if body is not None and first not in type(body).model_fields:
        return None
    return first
