"""Completions and chat completions: validated request -> engine requests -> JSON or SSE chunks.

Contract: `OpenAIServing.prepare_*` turn a parsed request into a `Prepared` (one engine
`Request` per prompt and sample: a chat has n, a completion n per prompt of its list) or raise
`APIError` (status, message, param, code) before anything reaches the engine; `submit` adds them
all or none; `stream_*` yield the server-sent-event lines of a streamed answer ("data: {...}\\n\\n",
then "data: [DONE]\\n\\n"); `*_response` wait for the whole answer.  Neither knows about HTTP
connections: the routes in `api_server.py` abort the requests when their client goes away.

Choices are indexed as OpenAI indexes them: with P prompts and n samples each, prompt i's
sample j is choice i * n + j (the engine requests are made in that order).  A streamed chat
sends the assistant's role in the chunk of each choice's first token, not before the prompt is
processed, so a client's time to first token is the engine's.  Logprobs go out in OpenAI's two
shapes (`logprobs_format.py`); `echo` puts the prompt (and, with logprobs, its logprobs) before
a completion's text.  Usage counts each prompt once, however many samples it has (vLLM's).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
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
# slower, cheaper, served from what interactive requests leave (--scheduling-policy priority).
SERVICE_TIER_PRIORITY = {"auto": 0, "default": 0, "flex": 1000}


class APIError(Exception):
    """An error answered to the client as {"error": {message, type, param, code}}, with
    `headers` added to the answer (a 429's Retry-After and x-ratelimit-*)."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 type: str = "invalid_request_error", headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.type = status, message, param, code, type
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


@dataclass
class Prepared:
    """One HTTP request, ready for the engine: its engine requests, one per choice (prompt i's
    sample j at position i * n + j)."""

    response_id: str
    requests: list[Request]
    model: str
    include_usage: bool  # a last chunk with the usage of the whole answer
    continuous_usage: bool  # usage on every chunk too (vLLM's continuous_usage_stats)
    echo: bool = False  # completions: each choice's text starts with its prompt
    tokenizer: object = None  # for the tokens' text in logprobs
    # chat with tools: "auto" (calls read from the text if the model wrote any), "required" or a
    # function's name (a forced call: the text is the call); None: no tool calls
    tool_mode: str | None = None

    @property
    def request_ids(self) -> list[str]:
        return [r.request_id for r in self.requests]

    def num_prompt_tokens(self) -> int:
        """Each prompt once, not once per sample."""
        return sum(r.num_prompt_tokens for r in self.requests if r.index == 0)

    def usage(self, num_output_tokens: int) -> Usage:
        return Usage.of(self.num_prompt_tokens(), num_output_tokens)

    def prompt_text(self, request: Request) -> str:
        return request.prompt if request.prompt is not None else self.tokenizer.decode(request.prompt_token_ids)

    @staticmethod
    def prompt_logprobs(request: Request) -> list[PositionLogprobs | None] | None:
        """A prompt's logprobs: sample 0 computes them for all n samples of its prompt."""
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


def parse_body(payload: Any, model: type[BaseModel]):
    """A decoded JSON body -> the request `model`, or a 400 naming the first field that is wrong
    (the HTTP routes and run-batch parse through this one function)."""
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

    def model_name(self, model: str | None) -> str:
        """The name an answer carries: the request's, else the first served name (vLLM's rule
        for a request that names no model)."""
        return model if model is not None else self.served_model_names[0]

    def _check_common(self, body: _SamplingFields) -> None:
        self.check_model(body.model)
        problem = body.unsupported()
        if problem is not None:
            param, message = problem
            raise APIError(400, message, param, "invalid_value" if param in ("n", "prompt") else "unsupported_value")
        warn_ignored(body.ignored_fields())

    def priority_of(self, body: _SamplingFields) -> int:
        """The engine priority of a request: its `priority` if given, else its tier's (under
        fcfs every tier is served in arrival order, and a priority other than 0 is a 400)."""
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
        request = requests[0]
        if max_tokens is not None and request.num_prompt_tokens + max_tokens > self.max_model_len:
            raise APIError(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you "
                f"requested {request.num_prompt_tokens + max_tokens} tokens ({request.num_prompt_tokens} "
                f"in the prompt, {max_tokens} for the completion{self.engine.llm.input_processor.context_note()}). "
                f"Reduce the prompt or max_tokens.",
                "max_tokens", "context_length_exceeded",
            )
        return requests

    def prepare_completion(self, body: CompletionRequest) -> Prepared:
        self._check_common(body)
        response_id = self.engine.new_request_id("cmpl")
        prompts = body.engine_prompts()
        # One engine request per prompt, all made (and so all checked) before any is submitted.
        ids = [response_id] if len(prompts) == 1 else [f"{response_id}-{i}" for i in range(len(prompts))]
        requests = [r for rid, prompt in zip(ids, prompts) for r in self._make(rid, prompt, body, body.max_tokens)]
        return Prepared(response_id, requests, self.model_name(body.model), body.include_usage, body.continuous_usage,
                        echo=body.echo, tokenizer=self.engine.llm.tokenizer)

    def prepare_chat(self, body: ChatCompletionRequest) -> Prepared:
        self._check_common(body)
        tools = body.template_tools()
        prompt = self.render(body.messages, {**(body.chat_template_kwargs or {}), **({"tools": tools} if tools else {})})
        response_id = self.engine.new_request_id("chatcmpl")
        # The template's stop strings end the assistant's turn, as an end-of-turn token does in
        # a chat model's generation_config; vLLM's ignore_eos ignores those too (guidellm and
        # `bench serve` ask for exactly max_tokens with ignore_eos and no stop).
        # A grammar ends its own turn (it allows EOS only once complete), and its text may hold
        # the template's stop strings (a newline in JSON's whitespace): no turn-end stops then.
        turn_end = () if body.ignore_eos or body.constrained else self.chat_format.default_stop
        requests = self._make(response_id, prompt, body, body.max_new_tokens, turn_end)
        return Prepared(response_id, requests, self.model_name(body.model), body.include_usage, body.continuous_usage,
                        tokenizer=self.engine.llm.tokenizer, tool_mode=body.tool_mode)

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
        """Add every request of `prepared` to the engine, or none: if one is refused, those
        already added are aborted before the error is raised."""
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

    # -- answering --------------------------------------------------------------------------

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

    async def completion_response(self, prepared: Prepared, streams: list[RequestStream]) -> dict:
        answers = await asyncio.gather(*(self.collect(s) for s in streams))
        choices = [self._completion_choice(prepared, i, request, answer)
                   for i, (request, answer) in enumerate(zip(prepared.requests, answers))]
        return CompletionResponse(
            id=prepared.response_id, model=prepared.model, choices=choices,
            usage=prepared.usage(sum(a.num_output_tokens for a in answers)),
        ).model_dump()

    def _completion_choice(self, prepared: Prepared, index: int, request: Request, answer: Answer) -> CompletionChoice:
        text, token_ids, logprobs = answer.text, answer.token_ids, answer.logprobs
        if prepared.echo:
            text = prepared.prompt_text(request) + text
            if logprobs is not None:
                # the prompt's positions first (its first token has no logprob)
                token_ids = list(request.prompt_token_ids) + token_ids
                logprobs = list(prepared.prompt_logprobs(request)) + logprobs
        return CompletionChoice(
            index=index, text=text, finish_reason=answer.finish_reason, stop_reason=answer.stop_reason,
            logprobs=None if logprobs is None else completion_logprobs(token_ids, logprobs, prepared.tokenizer),
            prompt_logprobs=_prompt_logprobs_json(prepared.prompt_logprobs(request)),
        )

    async def chat_response(self, prepared: Prepared, streams: list[RequestStream]) -> dict:
        answers = await asyncio.gather(*(self.collect(s) for s in streams))
        messages = [_chat_message(a, prepared.tool_mode) for a in answers]
        choices = [
            ChatChoice(
                index=i, message=m, finish_reason="tool_calls" if m.tool_calls else a.finish_reason,
                stop_reason=a.stop_reason,
                logprobs=None if a.logprobs is None else chat_logprobs(
                    a.token_ids, a.logprobs, r.sampling_params.logprobs, prepared.tokenizer),
            )
            for i, (r, a, m) in enumerate(zip(prepared.requests, answers, messages))
        ]
        return ChatCompletionResponse(
            id=prepared.response_id, model=prepared.model, choices=choices,
            usage=prepared.usage(sum(a.num_output_tokens for a in answers)),
        ).model_dump()

    async def stream_completion(self, prepared: Prepared, streams: list[RequestStream]) -> AsyncIterator[str]:
        last: dict[int, StreamDelta] = {}
        pending: dict[int, tuple[list[int], list]] = {}  # tokens whose text is held back, per choice
        offsets: dict[int, int] = {}  # text_offset of the next token, per choice
        async for index, delta in merge_streams(streams):
            request = prepared.requests[index]
            first = index not in last
            last[index] = delta
            ids, lps = pending.setdefault(index, ([], []))
            ids += delta.token_ids
            if delta.logprobs is not None:
                lps += delta.logprobs
            text = delta.text
            if first and prepared.echo:
                text = prepared.prompt_text(request) + text
                if request.logprobs is not None:
                    ids[:0], lps[:0] = list(request.prompt_token_ids), list(prepared.prompt_logprobs(request))
            if not text and not delta.finished:
                continue  # text held back (a possible stop string): nothing to show yet
            logprobs = None
            if request.logprobs is not None:
                logprobs = completion_logprobs(ids, lps, prepared.tokenizer, offsets.get(index, 0))
                offsets[index] = (logprobs.text_offset[-1] + len(logprobs.tokens[-1])) if ids else offsets.get(index, 0)
            pending[index] = ([], [])
            chunk = CompletionResponse(
                id=prepared.response_id, model=prepared.model,
                choices=[CompletionChoice(index=index, text=text, finish_reason=delta.finish_reason,
                                          stop_reason=delta.stop_reason if delta.finished else None,
                                          logprobs=logprobs)],
                usage=self._usage_so_far(prepared, last) if prepared.continuous_usage else None,
            )
            yield sse(chunk.model_dump(exclude=None if prepared.continuous_usage else {"usage"}))
        if prepared.include_usage and last:
            yield _usage_event(CompletionResponse, prepared, last)
        yield sse("[DONE]")

    async def stream_chat(self, prepared: Prepared, streams: list[RequestStream]) -> AsyncIterator[str]:
        last: dict[int, StreamDelta] = {}
        role_sent: set[int] = set()
        pending: dict[int, tuple[list[int], list]] = {}

        def chunk(index: int, delta: ChatDelta, finish_reason: str | None = None, logprobs=None) -> str:
            body = ChatCompletionChunk(
                id=prepared.response_id, model=prepared.model,
                choices=[ChatChunkChoice(index=index, delta=delta, finish_reason=finish_reason, logprobs=logprobs)],
                usage=self._usage_so_far(prepared, last) if prepared.continuous_usage else None,
            )
            return sse(body.model_dump(exclude=None if prepared.continuous_usage else {"usage"}))

        held: dict[int, str] = {}  # forced tool calls: the text, sent as tool_calls once finished
        async for index, delta in merge_streams(streams):
            last[index] = delta
            request = prepared.requests[index]
            if prepared.tool_mode is not None:
                held[index] = held.get(index, "") + delta.text
                if delta.finished:
                    for line in self._tool_call_chunks(chunk, index, held[index], delta, prepared.tool_mode):
                        yield line
                continue
            ids, lps = pending.setdefault(index, ([], []))
            ids += delta.token_ids
            if delta.logprobs is not None:
                lps += delta.logprobs
            # The role rides on the first text (or on the end of an answer with none), so the
            # first chunk a client sees comes after the prompt was processed.  Logprobs of
            # tokens whose text was held back go out with the next text, or at the end.
            if delta.text or (delta.finished and (index not in role_sent or (ids and request.logprobs is not None))):
                logprobs = None
                if request.logprobs is not None:
                    logprobs = chat_logprobs(ids, lps, request.sampling_params.logprobs, prepared.tokenizer)
                    pending[index] = ([], [])
                role = None if index in role_sent else "assistant"
                yield chunk(index, ChatDelta(role=role, content=delta.text), logprobs=logprobs)
                role_sent.add(index)
            if delta.finished:
                yield chunk(index, ChatDelta(), delta.finish_reason)
        if prepared.include_usage and last:
            yield _usage_event(ChatCompletionChunk, prepared, last)
        yield sse("[DONE]")

    @staticmethod
    def _tool_call_chunks(chunk, index: int, text: str, delta: StreamDelta, tool_mode: str):
        """A finished answer that may hold tool calls, streamed once done (its text is held back
        until then): any text first, the calls in one delta (each call's arguments whole, one
        fragment), then the end."""
        answer = Answer(text, delta.finish_reason, delta.stop_reason, delta.num_output_tokens, [], None)
        message = _chat_message(answer, tool_mode)
        if message.content or not message.tool_calls:
            yield chunk(index, ChatDelta(role="assistant", content=message.content or ""))
        if not message.tool_calls:
            yield chunk(index, ChatDelta(), delta.finish_reason)
            return
        tool_calls = [ToolCallDelta(index=k, **call.model_dump()) for k, call in enumerate(message.tool_calls)]
        yield chunk(index, ChatToolCallsDelta(role=None if message.content else "assistant", tool_calls=tool_calls))
        yield chunk(index, ChatDelta(), "tool_calls")

    @staticmethod
    def _usage_so_far(prepared: Prepared, last: dict[int, StreamDelta]) -> Usage:
        return prepared.usage(sum(d.num_output_tokens for d in last.values()))


async def merge_streams(streams: list[RequestStream]) -> AsyncIterator[tuple[int, StreamDelta]]:
    """(index, delta) of several request streams, in the order the deltas arrive; ends when all
    have ended, raises the first error any of them raises."""
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


def _usage_event(chunk_class, prepared: Prepared, last: dict[int, StreamDelta]) -> str:
    """The last event of a stream asked with stream_options.include_usage: no choices, usage."""
    usage = prepared.usage(sum(d.num_output_tokens for d in last.values()))
    return sse(chunk_class(id=prepared.response_id, model=prepared.model, choices=[], usage=usage).model_dump())


def _prompt_logprobs_json(rows: list[PositionLogprobs | None] | None) -> list[dict | None] | None:
    """vLLM's `prompt_logprobs` field: per prompt token {id: {logprob, rank, decoded_token}}."""
    if rows is None:
        return None
    return [None if row is None else {
        token_id: {"logprob": max(lp.logprob, -9999.0), "rank": lp.rank, "decoded_token": lp.decoded_token}
        for token_id, lp in row.items()} for row in rows]


def _read_calls(answer: Answer, tool_mode: str | None) -> tuple[str | None, list[dict]] | None:
    """(the text before the calls, the calls) of a finished answer, or None: no tools, no call
    written (auto), or cut short."""
    if tool_mode is None or answer.finish_reason != "stop":
        return None
    if tool_mode == "auto":
        return read_tagged_tool_calls(answer.text)
    calls = read_tool_calls(answer.text, None if tool_mode == "required" else tool_mode)
    return None if calls is None else (None, calls)


def _chat_message(answer: Answer, tool_mode: str | None) -> ChatResponseMessage:
    found = _read_calls(answer, tool_mode)
    if found is None:
        return ChatResponseMessage(content=answer.text)
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
