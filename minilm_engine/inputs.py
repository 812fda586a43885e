"""Prompts in, `Request`s out: tokenization and validation at the engine's boundary.

Contract: `InputProcessor.make_request` either returns a `Request` ready to schedule or raises
`ValueError` / `TypeError` naming the problem, before any engine state changes, so one bad
request never disturbs the others.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from .request import Request
from .sampling_params import SamplingParams

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
    ):
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.max_model_len = max_model_len
        # Where max_model_len comes from, said in errors: None means "the architecture's
        # max_position_embeddings", which the engine may still cut to what its KV pool holds.
        self.max_model_len_reason = max_model_len_reason
        self.eos_token_ids = eos_token_ids
        self.device = device
        self.seed = seed

    def make_request(
        self, request_id: str, prompt: PromptType, params: SamplingParams, priority: int = 0
    ) -> Request:
        if not isinstance(params, SamplingParams):
            raise TypeError(f"sampling_params must be a SamplingParams, got {params!r}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            # Any int, negative ones too (vLLM's rule): lower is served first.
            raise TypeError(f"priority must be an int (lower is served first), got {priority!r}")
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
                f"a prompt must be a str or a dict with 'prompt_token_ids', got {prompt!r}"
            )
        if not ids:
            raise ValueError("the prompt is empty: at least one token is needed")
        if len(ids) >= self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens, but the model's context holds "
                f"{self.max_model_len} (prompt + output{self.context_note()}); shorten the prompt"
            )
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
        )

    def context_note(self) -> str:
        """The "; max_model_len derived from the KV cache: ..." of an error, when the pool set it."""
        reason = self.max_model_len_reason
        return "" if reason in (None, SET_BY_CALLER) else f"; max_model_len {reason}"

    def default_seed(self, request_id: str) -> int:
        """The seed of a request whose SamplingParams have none: a function of the engine's seed
        and the request id only, so it is the same run to run, and no other request (not even
        one refused after tokenization, e.g. for not fitting the KV pool) can change it."""
        digest = hashlib.sha256(f"{self.seed}|{request_id}".encode()).digest()
        return int.from_bytes(digest[:8], "little") >> 2  # in [0, 2**62)
