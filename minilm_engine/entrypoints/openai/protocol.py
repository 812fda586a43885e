"""The OpenAI wire format: pydantic models of the requests we accept and the bodies we return.

Contract, as vLLM parses requests: numbers are lax ("0.5" is a temperature, 16.0 a max_tokens),
everything else strict ("yes" is not a bool), and `null` means the default, nested fields too.

    implemented      temperature, top_p, top_k, seed, stop, max_tokens,  -> SamplingParams
                     n, penalties, logit_bias, logprobs, echo, tools, ...
    known, not       best_of, bad_words, suffix, ...                  -> a 400 naming the field,
    implemented      (`*_NOT_IMPLEMENTED`)                               unless it is neutral
    unknown          metadata, store, a client's own extras           -> ignored, warned once

A grammar comes as OpenAI's `response_format`, vLLM's `structured_outputs` body field or its
older `guided_*` fields, one per request; errors name the wire field.  Chat `tools` with
`tool_choice` "required" or a named function are a grammar too (`tool_calls.py`); "auto" lets
the model write calls in the template's format, "none" answers in words.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from minilm_engine.core.sampling_params import SamplingParams, StructuredOutputsParams
from minilm_engine.entrypoints.openai.tool_calls import forced_call_schema, named_function

logger = logging.getLogger(__name__)

LaxInt = Annotated[int, Field(strict=False)]
LaxFloat = Annotated[float, Field(strict=False)]
GRAMMARS = ("json", "json_object", "regex", "choice", "grammar")  # StructuredOutputsParams' fields


class _Lenient(BaseModel):
    """Strict types; `null` dropped before validation (the default applies); unknown fields
    kept in `model_extra` for `ignored_fields()`."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def ignored_fields(self, prefix: str = "") -> list[str]:
        """Dotted names of the unknown fields, nested ones included ("messages[].x")."""
        names = [prefix + name for name in self.model_extra or {}]
        for name in type(self).model_fields:
            value = getattr(self, name)
            items = value if isinstance(value, list) else [value]
            suffix = "[]." if isinstance(value, list) else "."
            for item in items:
                if isinstance(item, _Lenient):
                    names += item.ignored_fields(f"{prefix}{name}{suffix}")
        return sorted(set(names))


# One warning per field name for the whole process: a client that sends `metadata` on every
# request should not fill the log with the same line.
_warned_fields: set[str] = set()
_warned_lock = threading.Lock()


def warn_ignored(names: Iterable[str]) -> list[str]:
    """Log each name not warned about before; returns the ones logged now."""
    with _warned_lock:
        new = [name for name in names if name not in _warned_fields]
        _warned_fields.update(new)
    for name in new:
        logger.warning("request field %r is not known to this server and is ignored "
                       "(warned once per field name)", name)
    return new


# Known fields the engine does not implement: name -> (the values that leave the output as it is,
# how an error names them).  Any other value but null is a 400 naming the field.
SAMPLING_NOT_IMPLEMENTED = {
    "best_of": ((1,), "1"),
    "use_beam_search": ((False,), "false"),
    "length_penalty": ((1,), "1"),
    "skip_special_tokens": ((True,), "true"),
    "bad_words": (({}, [], ""), "[]"),
    "allowed_token_ids": ((), "null"),
    "truncate_prompt_tokens": ((), "null"),
}
COMPLETION_NOT_IMPLEMENTED = {"suffix": (({}, [], ""), '""')}
CHAT_NOT_IMPLEMENTED = {
    "echo": ((False,), "false"),
    "add_generation_prompt": ((True,), "true"),
    "continue_final_message": ((False,), "false"),
    "chat_template": ((), "null (the model's own template is used)"),
}


def _is_neutral(value: Any, neutral: tuple) -> bool:
    """`value` is null or one of `neutral`, and a bool only where that is one (`True == 1`)."""
    return value is None or any(isinstance(value, bool) == isinstance(n, bool) and value == n
                                for n in neutral)


class StreamOptions(_Lenient):
    include_usage: bool = False
    continuous_usage_stats: bool = False  # vLLM's: usage on every chunk (with include_usage)


class JsonSchemaFormat(_Lenient):
    name: str | None = None
    description: str | None = None
    json_schema: dict[str, Any] = Field(alias="schema")
    strict: bool | None = None  # accepted; the output is constrained either way (vLLM's rule)


class ResponseFormat(_Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputsBody(_Lenient):
    """vLLM's `structured_outputs` body field: StructuredOutputsParams' fields on the wire."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False


class _SamplingFields(_Lenient):
    model: str | None = None  # optional, as in vLLM: the server's first served name
    temperature: LaxFloat | None = None
    top_p: LaxFloat | None = None
    top_k: LaxInt | None = None
    seed: LaxInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: LaxInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    presence_penalty: LaxFloat = 0.0
    frequency_penalty: LaxFloat = 0.0
    repetition_penalty: LaxFloat | None = None  # None: the checkpoint's generation_config, else 1
    min_p: LaxFloat | None = None
    min_tokens: LaxInt = 0
    logit_bias: dict[str, float] | None = None  # OpenAI's: token id (as a string) -> bias
    prompt_logprobs: LaxInt | None = None
    include_stop_str_in_output: bool = False
    # vLLM's `priority` (lower first) and OpenAI's `service_tier`: serving.py maps both.
    priority: LaxInt | None = None
    service_tier: str | None = None
    # Known, not implemented: SAMPLING_NOT_IMPLEMENTED.
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    skip_special_tokens: Any = None
    bad_words: Any = None
    allowed_token_ids: Any = None
    truncate_prompt_tokens: Any = None
    # A grammar, in any of three spellings.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    not_implemented: ClassVar[dict[str, tuple[tuple, str]]] = {}  # the endpoint's own

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a value the engine cannot honour, or None."""
        known = {**SAMPLING_NOT_IMPLEMENTED, **self.not_implemented}
        for name, (neutral, allowed) in known.items():
            value = getattr(self, name)
            if not _is_neutral(value, neutral):
                return name, (f"{name} is not supported by this server (only {allowed} or null), "
                              f"got {value!r}")
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None

    def to_sampling_params(
        self, max_tokens: int | None, extra_stop: tuple[str, ...] = (), defaults: dict[str, Any] | None = None
    ) -> SamplingParams:
        """`defaults`: the checkpoint's generation_config, for fields the request left unset."""
        defaults = defaults or {}

        def pick(name: str, fallback: Any) -> Any:
            value = getattr(self, name)
            return value if value is not None else defaults.get(name, fallback)

        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=pick("temperature", 1.0),
            top_p=pick("top_p", 1.0),
            top_k=pick("top_k", 0),
            min_p=pick("min_p", 0.0),
            repetition_penalty=pick("repetition_penalty", 1.0),
            max_tokens=max_tokens,
            seed=self.seed,
            stop=stop + [s for s in extra_stop if s not in stop] or None,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
            n=self.n,
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            min_tokens=self.min_tokens,
            logit_bias=_token_id_keys(self.logit_bias),
            logprobs=self.sample_logprobs(),
            prompt_logprobs=self.prompt_logprobs_wanted(),
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured_outputs_params(),
        )

    def _grammars(self) -> dict[str, tuple[str, Any]]:
        """The grammars given: StructuredOutputsParams field -> (wire name, value)."""
        given: dict[str, tuple[str, Any]] = {}
        if self.structured_outputs is not None:
            for name in GRAMMARS:
                value = getattr(self.structured_outputs, "json_" if name == "json" else name)
                if value is not None:
                    given[name] = (f"structured_outputs.{name}", value)
        for name in ("json", "regex", "choice", "grammar"):
            if getattr(self, f"guided_{name}") is not None:
                given[name] = (f"guided_{name}", getattr(self, f"guided_{name}"))
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            given["json_object"] = ("response_format", True)
        elif fmt is not None and fmt.type == "json_schema":
            schema = None if fmt.json_schema is None else fmt.json_schema.json_schema
            given["json"] = ("response_format.json_schema.schema", schema)
        return given

    def _structured(self, name: str, wire: str, value: Any) -> StructuredOutputsParams:
        """StructuredOutputsParams(name=value), its errors naming the wire field."""
        options = self.structured_outputs
        try:
            return StructuredOutputsParams(
                **{name: value}, disable_any_whitespace=options.disable_any_whitespace if options else False)
        except (ValueError, TypeError) as e:
            raise type(e)(str(e).replace(f"structured_outputs.{name}", wire, 1)) from None

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """The request's one grammar (None: unconstrained); ValueError naming the wire field."""
        given = self._grammars()
        if not given:
            if self.structured_outputs is not None:
                raise ValueError("structured_outputs needs one of json, json_object, regex, choice, grammar")
            return None
        wires = sorted(wire for wire, _ in given.values())
        if len(given) > 1:
            raise ValueError(f"{wires[0]}: one grammar per request, got {', '.join(wires)}")
        ((name, (wire, value)),) = given.items()
        if value is None:
            raise ValueError('response_format: type "json_schema" needs json_schema: {"name": ..., "schema": {...}}')
        return self._structured(name, wire, value)

    @property
    def constrained(self) -> bool:
        """Whether a grammar (not a stop string) ends the turn."""
        return bool(self._grammars()) or self.structured_outputs is not None

    def sample_logprobs(self) -> int | None:
        """How many top logprobs per sampled token (None: none asked)."""
        return None

    def prompt_logprobs_wanted(self) -> int | None:
        return self.prompt_logprobs

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def continuous_usage(self) -> bool:
        """vLLM's continuous_usage_stats, which needs include_usage too."""
        return self.include_usage and self.stream_options.continuous_usage_stats


def _token_id_keys(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias keys are token ids as strings ("50256": -100)."""
    if not logit_bias:
        return None
    bad = [key for key in logit_bias if not key.strip().isdigit()]
    if bad:
        raise ValueError(f"logit_bias keys must be token ids (strings of digits), got {bad[:5]}")
    return {int(key): bias for key, bias in logit_bias.items()}


class CompletionRequest(_SamplingFields):
    # One prompt or several: text, token ids, a list of texts, a list of token-id lists.
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: LaxInt = 16
    logprobs: LaxInt | None = None  # top logprobs per token (the sampled one always included)
    echo: bool = False  # the prompt before the completion (with its logprobs, if asked)
    suffix: Any = None

    not_implemented = COMPLETION_NOT_IMPLEMENTED

    def sample_logprobs(self) -> int | None:
        return self.logprobs

    def prompt_logprobs_wanted(self) -> int | None:
        # echo with logprobs reports the prompt's too (vLLM: prompt_logprobs = logprobs).
        if self.prompt_logprobs is None and self.echo and self.logprobs is not None:
            return self.logprobs
        return self.prompt_logprobs

    def unsupported(self) -> tuple[str, str] | None:
        if isinstance(self.prompt, list) and not self.prompt:
            return "prompt", "the prompt is empty: give a string, token ids, or a list of either"
        return super().unsupported()

    def engine_prompts(self) -> list[str | dict]:
        """The prompts as the engine takes them: text, or {"prompt_token_ids": [...]}."""
        if isinstance(self.prompt, str):
            return [self.prompt]
        if all(isinstance(p, str) for p in self.prompt):
            return list(self.prompt)
        if all(isinstance(p, int) for p in self.prompt):
            return [{"prompt_token_ids": list(self.prompt)}]
        return [{"prompt_token_ids": list(ids)} for ids in self.prompt]


class TextContent(_Lenient):
    type: Literal["text"]
    text: str


class FunctionCallIn(_Lenient):
    name: str
    arguments: str | dict[str, Any]  # OpenAI sends JSON text


class ToolCallIn(_Lenient):
    """A call in an assistant message of the history (replayed by a client)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextContent] | None = None  # None only for an assistant turn
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @field_validator("content", mode="before")
    @classmethod
    def _only_text_parts(cls, content: Any) -> Any:
        if isinstance(content, list):
            kinds = sorted({str(p.get("type")) for p in content if isinstance(p, dict) and p.get("type") != "text"})
            if kinds:
                raise ValueError(f"content parts of type {kinds} are not supported by this server "
                                 "(only {\"type\": \"text\", \"text\": ...})")
        return content

    @model_validator(mode="after")
    def _content_required(self) -> ChatMessage:
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content: this field is required in a {self.role} message")
        return self

    def as_template_input(self) -> dict:
        if self.content is None or isinstance(self.content, str):
            content = self.content or ""
        else:
            content = "".join(p.text for p in self.content)
        message = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.name:
            message["name"] = self.name
        if self.tool_calls:
            # Templates (Hugging Face's convention) take the arguments as a dict.
            message["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": _as_dict(call.function.arguments)}} for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def _as_dict(arguments: str | dict) -> dict | str:
    """A call's arguments as a dict when they are JSON text of one (else as they are)."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


class FunctionDefinition(_Lenient):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema (None: any object)
    strict: bool | None = None


class ToolDefinition(_Lenient):
    type: Literal["function"]
    function: FunctionDefinition


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: LaxInt | None = None
    max_completion_tokens: LaxInt | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template, as vLLM's
    tools: list[ToolDefinition] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool = True  # OpenAI's: False -> "required" makes exactly one call
    functions: Any = None  # OpenAI's older spelling of tools: not served
    function_call: Any = None
    logprobs: bool = False  # the sampled tokens' logprobs (OpenAI's chat shape)
    top_logprobs: LaxInt | None = None  # and the most likely ones at each position (needs logprobs)
    echo: Any = None
    add_generation_prompt: Any = None
    continue_final_message: Any = None
    chat_template: Any = None

    not_implemented = CHAT_NOT_IMPLEMENTED

    def unsupported(self) -> tuple[str, str] | None:
        # Some clients (guidellm) send both, equal; two different limits are a contradiction.
        if None not in (self.max_tokens, self.max_completion_tokens) and self.max_tokens != self.max_completion_tokens:
            return "max_tokens", (f"max_tokens ({self.max_tokens}) and max_completion_tokens "
                                  f"({self.max_completion_tokens}) differ: give one, or both equal")
        if self.top_logprobs is not None and self.top_logprobs > 0 and not self.logprobs:
            return "top_logprobs", "top_logprobs needs logprobs: true"
        if self.top_logprobs is not None and self.top_logprobs < 0:
            return "top_logprobs", f"top_logprobs must be >= 0, got {self.top_logprobs}"
        if self.tools:  # none, auto, required and a named function are all served
            if self.tool_choice not in (None, "none", "auto", "required") and named_function(self.tool_choice) is None:
                return "tool_choice", (f'tool_choice must be "none", "auto", "required" or {{"type": "function", '
                                       f'"function": {{"name": ...}}}}, got {self.tool_choice!r}')
        elif self.tool_choice not in (None, "none", "auto"):
            return "tool_choice", f"tool_choice={self.tool_choice!r} needs tools: the functions the model may call"
        # OpenAI's older spelling of tools: accepted only where the model may not call them.
        call = self.function_call
        if self.functions and call != "none":
            choice = "auto (the default)" if call is None else repr(call)
            return "functions", (f"functions with function_call={choice} needs tool calling, which "
                                 'this server does not support (only function_call: "none")')
        if not self.functions and call not in (None, "none", "auto"):
            return "function_call", (f"function_call={call!r} needs tool calling, which this "
                                     "server does not support")
        return super().unsupported()

    @property
    def tool_mode(self) -> str | None:
        """How the answer is read for tool calls: None (no tools, or tool_choice "none"), "auto"
        (the model may write calls), "required" or a function's name (a forced call)."""
        if not self.tools or self.tool_choice == "none":
            return None
        return self.forced_tool or "auto"

    def template_tools(self) -> list[dict] | None:
        """The tools the chat template shows the model (None: tool_choice "none", or none given)."""
        return None if self.tool_mode is None else [tool.model_dump() for tool in self.tools]

    @property
    def forced_tool(self) -> str | None:
        """With tools: "required", or the function tool_choice names; else None."""
        if not self.tools:
            return None
        return "required" if self.tool_choice == "required" else named_function(self.tool_choice)

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """A forced tool call is the request's grammar (and then the only one)."""
        if self.forced_tool is None:
            return super().structured_outputs_params()
        if self._grammars():
            raise ValueError("tool_choice: a forced tool call is the request's grammar; drop response_format "
                             "/ structured_outputs, or use tool_choice \"none\"")
        schema = forced_call_schema([tool.model_dump() for tool in self.tools], self.tool_choice,
                                    self.parallel_tool_calls)
        return self._structured("json", "tools: a function's parameters", schema)

    @property
    def constrained(self) -> bool:
        return self.forced_tool is not None or super().constrained

    def sample_logprobs(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class TokenizeRequest(_Lenient):
    """vLLM's /tokenize body: a prompt, or chat messages rendered with the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True  # as the server's own requests are tokenized
    chat_template_kwargs: dict[str, Any] | None = None
    return_token_strs: bool = False


class DetokenizeRequest(_Lenient):
    model: str | None = None
    tokens: list[int]


# -- responses ------------------------------------------------------------------------------


def _now() -> int:
    return int(time.time())


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, num_prompt_tokens: int, num_output_tokens: int) -> Usage:
        return cls(prompt_tokens=num_prompt_tokens, completion_tokens=num_output_tokens,
                   total_tokens=num_prompt_tokens + num_output_tokens)


class CompletionLogprobs(BaseModel):
    """Per token its text, logprob (None for a prompt's first token), the top ones
    {text: logprob}, and where its text starts in the choice's text."""

    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None  # vLLM's: the stop string or token id, None for EOS
    prompt_logprobs: list[dict[int, dict] | None] | None = None  # vLLM's extension


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class FunctionCall(BaseModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ChatTopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(ChatTopLogprob):
    top_logprobs: list[ChatTopLogprob] = Field(default_factory=list)


class ChatLogprobs(BaseModel):
    content: list[ChatTokenLogprob] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChoice]
    usage: Usage


class ChatDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ToolCallDelta(ToolCall):
    index: int  # which call of the message: its fragments (here one, whole) share it


class ChatToolCallsDelta(ChatDelta):
    """A delta with tool calls: sent only for them, so plain chunks keep OpenAI's exact shape."""

    tool_calls: list[ToolCallDelta]


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: SerializeAsAny[ChatDelta]
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=_now)
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """An entry of /v1/models with vLLM's fields: `root` is the model as the server was given
    it, `parent` the base model of an adapter (None: no adapter)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=_now)
    owned_by: str = "minilm-engine"
    root: str
    parent: str | None = None
    max_model_len: int
    permission: list = Field(default_factory=list)


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str
