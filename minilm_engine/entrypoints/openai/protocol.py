"""The OpenAI wire format: pydantic models of the requests we accept and the bodies we return.

Contract, as vLLM parses its requests: a request model that validates carries only values the
engine can take.  Numbers are parsed as leniently as vLLM parses them ("0.5" is a temperature,
16.0 a max_tokens), everything else strictly ("yes" is not a bool, 5.5 is not an int), and
`null` means "the default" for every field, nested ones too.  Three kinds of fields:

    implemented      temperature, top_p, top_k, seed, stop, max_tokens, n,    -> SamplingParams
                     penalties, min_p, min_tokens, logit_bias, logprobs, echo,
                     response_format, structured_outputs, guided_* ...
    known, not       tools, best_of, bad_words,                               -> accepted only at
    implemented      suffix, ... (`NOT_IMPLEMENTED`)                            a value that leaves
                                                                                  the output as it
                                                                                  is; else a 400
                                                                                  naming the field
    unknown          anything else (metadata, store, a client's own extras)   -> ignored, with one
                                                                                  warning per field
                                                                                  name in the log

so a client that sends more than we know still works, and one that asks for something we would
silently not do gets told.  `to_sampling_params()` maps a request onto `SamplingParams`, whose
own checks give the remaining errors.  Field names, defaults and response shapes follow OpenAI's
API reference (max_tokens defaults to 16 for completions, to the rest of the context for chat);
`top_k`, `ignore_eos`, `stop_token_ids` and `/tokenize`'s bodies are vLLM's extensions.

Structured outputs come in three spellings, mapped to one `StructuredOutputsParams` as vLLM maps
them: OpenAI's `response_format` ({"type": "json_object"}, or "json_schema" with
`json_schema.schema`; `strict` accepted, the output is always constrained), vLLM's
`structured_outputs` body field (json, json_object, regex, choice, grammar,
disable_any_whitespace), and vLLM's older `guided_json` / `guided_regex` / `guided_choice` /
`guided_grammar`.  One grammar per request; errors name the wire field.  Chat `tools` with
`tool_choice` "required" or a named function are a grammar too (`tool_calls.py`: the output
is constrained to the call's JSON and returned as `message.tool_calls`); "auto" lets the model write calls in the template's format (read back if it does), "none"
answers in words.  `role: "tool"` messages and an assistant's `tool_calls` are rendered by the
chat template.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, field_validator, model_validator

from minilm_engine.core.sampling_params import SamplingParams, StructuredOutputsParams
from minilm_engine.entrypoints.openai.tool_calls import forced_call_schema, named_function

logger = logging.getLogger(__name__)


# Numbers are parsed as vLLM parses them (pydantic's lax mode): "0.5" is a temperature, 16.0 a
# max_tokens, true a 1; everything else stays strict ("yes" is not a bool, 5.5 is not an int).
LaxInt = Annotated[int, Field(strict=False)]
LaxFloat = Annotated[float, Field(strict=False)]


class _Lenient(BaseModel):
    """Strict types; `null` dropped before validation (so the field's default applies); unknown
    fields kept aside in `model_extra`, for `ignored_fields()` to report."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if v is not None}
        return data

    def ignored_fields(self, prefix: str = "") -> list[str]:
        """Dotted names of the unknown fields, nested models included ("stream_options.x",
        "messages[].x")."""
        names = [prefix + name for name in self.model_extra or {}]
        for name in type(self).model_fields:
            value = getattr(self, name)
            if isinstance(value, _Lenient):
                names += value.ignored_fields(f"{prefix}{name}.")
            elif isinstance(value, list):
                for item in value:
                    if isinstance(item, _Lenient):
                        names += item.ignored_fields(f"{prefix}{name}[].")
        return sorted(set(names))


# One warning per ignored field name for the whole process: the log is the process's too, and a
# client that sends `metadata` on every request should not fill it with the same line.
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


@dataclass(frozen=True)
class NotImplementedField:
    """A field this server knows but does not implement: accepted only where its value leaves
    the output as it would be without it (`is_neutral`); `allowed` says which values those are."""

    name: str
    is_neutral: Callable[[Any], bool]
    allowed: str

    def problem(self, value: Any) -> str | None:
        if value is None or self.is_neutral(value):
            return None
        return f"{self.name} is not supported by this server (only {self.allowed} or null), got {value!r}"


def _is(*neutral) -> Callable[[Any], bool]:
    """A check: the value equals one of `neutral`, and is a bool only where that is a bool
    (Python's `True == 1` would let `true` pass as a penalty of 1)."""
    def check(value: Any) -> bool:
        return any(isinstance(value, bool) == isinstance(n, bool) and value == n for n in neutral)
    return check


def _empty(value: Any) -> bool:
    return value in ({}, [], "")


# Sampling extensions (OpenAI's and vLLM's) the engine has no code for.
SAMPLING_NOT_IMPLEMENTED = (
    NotImplementedField("best_of", _is(1), "1"),
    NotImplementedField("use_beam_search", _is(False), "false"),
    NotImplementedField("length_penalty", _is(1), "1"),
    NotImplementedField("skip_special_tokens", _is(True), "true"),
    NotImplementedField("bad_words", _empty, "[]"),
    NotImplementedField("allowed_token_ids", lambda v: False, "null"),
    NotImplementedField("truncate_prompt_tokens", lambda v: False, "null"),
)
COMPLETION_NOT_IMPLEMENTED = (
    NotImplementedField("suffix", _empty, '""'),
)
CHAT_NOT_IMPLEMENTED = (
    NotImplementedField("echo", _is(False), "false"),
    NotImplementedField("add_generation_prompt", _is(True), "true"),
    NotImplementedField("continue_final_message", _is(False), "false"),
    NotImplementedField("chat_template", lambda v: False, "null (the model's own template is used)"),
)


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
    # Service tiers: vLLM's `priority` (lower first; needs --scheduling-policy priority unless 0)
    # and OpenAI's `service_tier` ("auto", "default", "flex"); serving.py maps them to a priority.
    priority: LaxInt | None = None
    service_tier: str | None = None
    # Known, not implemented: see SAMPLING_NOT_IMPLEMENTED (any type: the check says what is allowed).
    best_of: Any = None
    use_beam_search: Any = None
    length_penalty: Any = None
    skip_special_tokens: Any = None
    bad_words: Any = None
    allowed_token_ids: Any = None
    truncate_prompt_tokens: Any = None
    # Structured outputs (see the module docstring): one grammar, in any of three spellings.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputsBody | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None

    # The endpoint's own known-but-not-implemented fields, checked after SAMPLING_NOT_IMPLEMENTED.
    not_implemented: ClassVar[tuple[NotImplementedField, ...]] = ()

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a value the engine cannot honour, or None."""
        for field in (*SAMPLING_NOT_IMPLEMENTED, *self.not_implemented):
            message = field.problem(getattr(self, field.name))
            if message is not None:
                return field.name, message
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None

    def to_sampling_params(
        self, max_tokens: int | None, extra_stop: tuple[str, ...] = (), defaults: dict[str, Any] | None = None
    ) -> SamplingParams:
        """`defaults`: the checkpoint's generation_config values, for fields the request left
        unset (vLLM's default_sampling_params); then vLLM's own defaults."""
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

    def structured_outputs_params(self) -> StructuredOutputsParams | None:
        """response_format / structured_outputs / guided_* -> one StructuredOutputsParams (None:
        unconstrained); ValueError naming the wire field when it is wrong."""
        given: dict[str, tuple[str, Any]] = {}  # StructuredOutputsParams field -> (wire name, value)
        options = self.structured_outputs
        if options is not None:
            for name, value in (("json", options.json_), ("json_object", options.json_object),
                                ("regex", options.regex), ("choice", options.choice), ("grammar", options.grammar)):
                if value is not None:
                    given[name] = (f"structured_outputs.{name}", value)
        for name in ("json", "regex", "choice", "grammar"):
            value = getattr(self, f"guided_{name}")
            if value is not None:
                given[name] = (f"guided_{name}", value)
        fmt = self.response_format
        if fmt is not None and fmt.type == "json_object":
            given["json_object"] = ("response_format", True)
        elif fmt is not None and fmt.type == "json_schema":
            if fmt.json_schema is None:
                raise ValueError('response_format: type "json_schema" needs json_schema: {"name": ..., "schema": {...}}')
            given["json"] = ("response_format.json_schema.schema", fmt.json_schema.json_schema)
        if not given:
            if options is not None:
                raise ValueError("structured_outputs needs one of json, json_object, regex, choice, grammar")
            return None
        if len(given) > 1:
            raise ValueError(f"{sorted(wire for wire, _ in given.values())[0]}: one grammar per request, got "
                             f"{', '.join(sorted(wire for wire, _ in given.values()))}")
        ((name, (wire, value)),) = given.items()
        try:
            return StructuredOutputsParams(
                **{name: value}, disable_any_whitespace=options.disable_any_whitespace if options else False)
        except (ValueError, TypeError) as e:
            raise type(e)(str(e).replace(f"structured_outputs.{name}", wire, 1)) from None

    @property
    def constrained(self) -> bool:
        """Whether the request asks for a grammar (the grammar, not a stop string, ends its turn)."""
        fmt = self.response_format
        return (fmt is not None and fmt.type != "text") or self.structured_outputs is not None or any(
            getattr(self, f"guided_{name}") is not None for name in ("json", "regex", "choice", "grammar"))

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
        """Usage on every chunk: vLLM's continuous_usage_stats, which needs include_usage too."""
        return self.include_usage and self.stream_options.continuous_usage_stats


def _token_id_keys(logit_bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's logit_bias has token ids as strings ("50256": -100) -> SamplingParams' ints."""
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
        """The prompts as the engine takes them: text, or {"prompt_token_ids": [...]}; one per choice."""
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
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": content}
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


def _no_tools(tools: Any, choice: Any, tools_name: str, choice_name: str) -> tuple[str, str] | None:
    """Tools are accepted only when the model may not call them: no tool calling here."""
    if not tools:
        if choice in (None, "none", "auto"):
            return None
        return choice_name, f"{choice_name}={choice!r} needs tool calling, which this server does not support"
    if choice == "none":
        return None
    return tools_name, (f"{tools_name} with {choice_name}={'auto (the default)' if choice is None else repr(choice)} "
                        f"needs tool calling, which this server does not support (only {choice_name}: \"none\")")


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: LaxInt | None = None
    max_completion_tokens: LaxInt | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # extra variables for the template, as vLLM's
    tools: list[ToolDefinition] | None = None
    tool_choice: Any = None  # "none", "auto", "required" or {"type": "function", "function": {"name": ...}}
    parallel_tool_calls: bool = True  # OpenAI's: False -> "required" makes exactly one call
    functions: Any = None  # OpenAI's older spelling of tools
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
        problem = _no_tools(self.functions, self.function_call, "functions", "function_call")
        if problem is not None:
            return problem
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
        options = self.structured_outputs
        others = (self.response_format is not None and self.response_format.type != "text") or any(
            getattr(self, f"guided_{name}") is not None for name in ("json", "regex", "choice", "grammar")) or (
            options is not None and any(getattr(options, name) is not None
                                        for name in ("json_", "json_object", "regex", "choice", "grammar")))
        if others:
            raise ValueError("tool_choice: a forced tool call is the request's grammar; drop response_format "
                             "/ structured_outputs, or use tool_choice \"none\"")
        schema = forced_call_schema([tool.model_dump() for tool in self.tools], self.tool_choice,
                                    self.parallel_tool_calls)
        try:
            return StructuredOutputsParams(
                json=schema, disable_any_whitespace=options.disable_any_whitespace if options else False)
        except (ValueError, TypeError) as e:
            raise type(e)(str(e).replace("structured_outputs.json", "tools: a function's parameters", 1)) from None

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


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, num_prompt_tokens: int, num_output_tokens: int) -> Usage:
        return cls(
            prompt_tokens=num_prompt_tokens,
            completion_tokens=num_output_tokens,
            total_tokens=num_prompt_tokens + num_output_tokens,
        )


class CompletionLogprobs(BaseModel):
    """OpenAI's completions logprobs: per token its text, logprob (None for a prompt's first
    token), the top ones {text: logprob}, and where its text starts in the choice's text."""

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
    created: int = Field(default_factory=lambda: int(time.time()))
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
    created: int = Field(default_factory=lambda: int(time.time()))
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
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    """An entry of /v1/models, with vLLM's fields: `root` is the model as the server was given
    it, `parent` the base model of an adapter (None: this is no adapter)."""

    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
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
