"""The OpenAI wire format: pydantic models of the requests we accept and the bodies we return.

Contract: a request model that validates carries only values the engine can take (types are
strict: "0.5" is not a temperature, `true` is not a max_tokens; unknown fields are refused, so
a typo such as "temprature" is an error, not silently ignored); `to_sampling_params()` maps it
onto `SamplingParams`, whose own checks give the remaining errors.  Field names, defaults and
response shapes follow OpenAI's API reference (max_tokens defaults to 16 for completions, to the
rest of the context for chat); `top_k`, `ignore_eos` and `stop_token_ids` are vLLM's extensions.
"""

from __future__ import annotations

import time
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ...sampling_params import SamplingParams


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class StreamOptions(_Strict):
    include_usage: bool = False


class _SamplingFields(_Strict):
    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted at their neutral values only (the engine has no penalties or logprobs).
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logprobs: bool | int | None = None

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a value the engine cannot honour, or None."""
        if self.n != 1:
            return "n", f"n must be 1 (one completion per request), got {self.n}"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0, 0.0):
                return name, f"{name} is not supported by this server (only 0 or null)"
        if self.logprobs not in (None, False, 0):
            return "logprobs", "logprobs are not supported by this server"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream: true"
        return None

    def to_sampling_params(self, max_tokens: int | None, extra_stop: tuple[str, ...] = ()) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return SamplingParams(
            temperature=1.0 if self.temperature is None else self.temperature,
            top_p=1.0 if self.top_p is None else self.top_p,
            top_k=0 if self.top_k is None else self.top_k,
            max_tokens=max_tokens,
            seed=self.seed,
            stop=stop + [s for s in extra_stop if s not in stop] or None,
            stop_token_ids=self.stop_token_ids,
            ignore_eos=self.ignore_eos,
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str]
    max_tokens: int | None = 16
    echo: bool = False
    suffix: str | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if isinstance(self.prompt, list) and self.prompt and isinstance(self.prompt[0], str):
            if len(self.prompt) != 1:
                return "prompt", f"one prompt per request, got a list of {len(self.prompt)}"
        if self.echo:
            return "echo", "echo is not supported by this server"
        if self.suffix:
            return "suffix", "suffix is not supported by this server"
        return super().unsupported()

    def engine_prompt(self) -> str | dict:
        """The prompt as the engine takes it: text, or {"prompt_token_ids": [...]}."""
        if isinstance(self.prompt, str):
            return self.prompt
        if self.prompt and isinstance(self.prompt[0], str):
            return self.prompt[0]
        return {"prompt_token_ids": list(self.prompt)}


class TextContent(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextContent]
    name: str | None = None

    def as_template_input(self) -> dict:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        role = "system" if self.role == "developer" else self.role
        message = {"role": role, "content": content}
        if self.name:
            message["name"] = self.name
        return message


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None

    def unsupported(self) -> tuple[str, str] | None:
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            return "max_tokens", "give max_tokens or max_completion_tokens, not both"
        return super().unsupported()

    @property
    def max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


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


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: None = None
    finish_reason: str | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ChatResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str


class ChatChoice(BaseModel):
    index: int = 0
    message: ChatResponseMessage
    logprobs: None = None
    finish_reason: str | None = None


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


class ChatChunkChoice(BaseModel):
    index: int = 0
    delta: ChatDelta
    logprobs: None = None
    finish_reason: str | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minilm-engine"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorInfo(BaseModel):
    message: str
    type: str = "invalid_request_error"
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorInfo
