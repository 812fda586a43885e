"""Prompts in, `Request`s out: tokenization and validation at the engine's boundary.

Contract: `make_request` returns a `Request` ready to schedule or raises ValueError/TypeError
naming the problem, before any engine state changes.  `make_requests` fans `n` > 1 out into n
samples (vLLM's parent / child requests): ids "{i}_{request_id}", `params.for_sample(i)`, one
tokenization; samples 1..n-1 read sample 0's prompt KV from the prefix cache.  A request with
`structured_outputs` gets its own grammar matcher (`core/structured_output/`).
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.structured_output import StructuredOutputManager, StructuredOutputsConfig

PromptType = str | dict[str, Any]
SET_BY_CALLER = "set by the caller"  # a max_model_len_reason: the engine keeps it as it is


class InputProcessor:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        max_model_len: int,
        eos_token_ids: tuple[int, ...],
        device: torch.device,
        seed: int = 0,
        max_model_len_reason: str | None = SET_BY_CALLER,
        max_logprobs: int = 20,
        max_n: int = 128,
        structured_outputs_config: StructuredOutputsConfig | None = None,
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        # Where max_model_len comes from, for errors (None: the architecture's, may still be cut).
        self.max_model_len_reason = max_model_len_reason
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.seed = seed
        self.max_logprobs = max_logprobs  # vLLM's max_logprobs: most top tokens per position
        self.max_n = max_n  # most samples per prompt
        self.structured_outputs = StructuredOutputManager(tokenizer, vocab_size, eos_token_ids,
                                                          structured_outputs_config)

    def make_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> Request:
        """One request (n must be 1: see `make_requests`)."""
        if isinstance(params, SamplingParams) and params.n != 1:
            raise ValueError(f"n={params.n}: a request with n > 1 is made with make_requests (n samples)")
        (request,) = self.make_requests(request_id, prompt, params, priority)
        return request

    def make_requests(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> list[Request]:
        """The n samples of one prompt, as requests (one when n = 1, with the id given)."""
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {params!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            # Any int, negative ones too (vLLM's rule): lower is served first.
            raise TypeError(f"priority must be an int (lower is served first), got {priority!r}")
        self.check_limits(params)
        text, ids = self.tokenize(prompt)
        if params.n == 1:
            return [self._request(request_id, text, ids, params, priority)]
        samples = [self._request(f"{i}_{request_id}", text, ids, params.for_sample(i), priority)
                   for i in range(params.n)]
        for i, sample in enumerate(samples):
            sample.index = i
            sample.prefix_source = samples[0] if i else None
        return samples

    def check_limits(self, params: SamplingParams) -> None:
        """What SamplingParams cannot know alone: the engine's caps and the vocabulary."""
        if params.n > self.max_n:
            raise ValueError(f"n must be <= {self.max_n} (this engine's max_n), got {params.n}")
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(params, name)
            if value is not None and value > self.max_logprobs:
                raise ValueError(
                    f"{name} must be <= {self.max_logprobs} (this engine's max_logprobs), got {value}"
                )
        bad = [t for t in params.logit_bias or {} if t >= self.vocab_size]
        if bad:
            raise ValueError(f"logit_bias keys must be token ids in [0, {self.vocab_size}), got {bad[:5]}")

    def tokenize(self, prompt: PromptType) -> tuple[str | None, list[int]]:
        """A prompt -> (its text, or None when given as ids; its token ids), checked."""
        if isinstance(prompt, dict) and "prompt_token_ids" not in prompt and isinstance(prompt.get("prompt"), str):
            prompt = prompt["prompt"]  # {"prompt": "..."}: vLLM's TextPrompt
        if isinstance(prompt, str):
            # verbose=False: a prompt longer than the tokenizer's model_max_length gets our own
            # error below, which names max_model_len, instead of a warning from transformers.
            text, ids = prompt, self.tokenizer.encode(prompt, add_special_tokens=True, verbose=False)
        elif isinstance(prompt, dict) and "prompt_token_ids" in prompt:
            text, ids = prompt.get("prompt"), list(prompt["prompt_token_ids"])
            bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < self.vocab_size]
            if bad:
                raise ValueError(
                    f"prompt_token_ids must be ints in [0, {self.vocab_size}), got {bad[:5]}"
                )
        else:
            raise TypeError(
                f"a prompt must be a str or a dict with 'prompt' (text) or 'prompt_token_ids', got {prompt!r}"
            )
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, but the model's context holds "
                f"{self.max_model_len} (prompt + output{self.context_note()}); shorten the prompt"
            )
        return text, ids

    def _request(
        self, request_id: str, text: str | None, ids: list[int], params: SamplingParams, priority: int = 0
    ) -> Request:
        seed = params.seed if params.seed is not None else self.default_seed(request_id)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device).manual_seed(seed)
        return Request(
            request_id=request_id,
            prompt=text,
            prompt_token_ids=ids,
            sampling_params=params,
            eos_token_ids=self.eos_token_ids,
            max_model_len=self.max_model_len,
            generator=generator,
            priority=priority,
            grammar=self.structured_outputs.new_grammar(params),
        )

    def context_note(self) -> str:
        """The "; max_model_len derived from the KV cache: ..." of an error, when the pool set it."""
        reason = self.max_model_len_reason
        return "" if reason in (None, SET_BY_CALLER) else f"; max_model_len {reason}"

    def default_seed(self, request_id: str) -> int:
        """The seed of a request whose SamplingParams have none: a function of the engine's seed
        and the request id only, so that no other request can change it."""
        digest = hashlib.sha256(f"{self.seed}|{request_id}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 2  # in [0, 2**62)
