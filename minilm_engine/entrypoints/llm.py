"""The front door: `LLM(model).generate(prompts, sampling_params)`, shaped like vLLM's offline API.

Contract: `LLM` loads the weights and tokenizer and owns one `LLMEngine`; `generate` returns one
`RequestOutput` per prompt, in prompt order (n samples of a prompt in one output); `chat`
renders messages with the server's chat template first.  `sampling_params=None` means the
checkpoint's `generation_config.json` (vLLM's generation_config="auto"), then vLLM's defaults.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from minilm_engine.entrypoints.chat_template import chat_format_for, render_chat
from minilm_engine.core.config import EngineConfig
from minilm_engine.entrypoints.llm_engine import LLMEngine, check_priority
from minilm_engine.model.device import resolve_device, resolve_dtype
from minilm_engine.entrypoints.input_processor import SET_BY_CALLER, InputProcessor, PromptType
from minilm_engine.entrypoints.output_processor import streamable_len
from minilm_engine.model import load_model, resolve_model_path
from minilm_engine.model.loader import DEFAULT_MODEL
from minilm_engine.model.fused import apply_model_backend, fused_weight_bytes, resolve_model_backend
from minilm_engine.core.outputs import RequestOutput
from minilm_engine.model.quantization import weight_bytes
from minilm_engine.model.quantization.setup import setup_quantization
from minilm_engine.core.request import Request, merge_samples
from minilm_engine.core.sampling_params import SamplingParams


class LLM:
    """An engine for offline generation.

    Args:
        model: a folder, a shipped name ("noodle-chef", "noodle-apprentice"), a hub id, or None
            for the shipped default.
        dtype: "auto" (fp32 on CPU, bf16 or fp16 on GPU), a dtype name, or a torch.dtype.
        device: "cpu", "cuda" or None (CUDA when available).
        seed: seeds the requests whose SamplingParams have no seed.
        max_model_len: context length (default: max_position_embeddings, cut to what one
            request alone can hold in the KV pool; `llm.kv_budget.describe()` shows why).
        quantization: None, "int8" or "int4" (`model/quantization/`), with its
            `quantization_config` (group_size, method "rtn" or "awq", calibration_texts, kernel).
        model_backend: "reference" (`model/decoder.py`) or "fused" (`model/fused.py`: on a CPU
            the micro-kernel's, on a CUDA GPU Triton's small ops; it falls back to the
            reference where it cannot run).  Default: `$MINILM_MODEL_BACKEND`, else "fused"
            on a CPU and the reference on a GPU (its fused path not yet run on a card).
        **engine_args: `EngineConfig` fields (max_num_seqs, block_size, num_kv_blocks,
            enable_prefix_caching, scheduling_policy, speculative_config, ...).
    """

    def __init__(
        self,
        model: str | Path | None = None,
        *,
        tokenizer: str | Path | None = None,
        dtype: str | torch.dtype = "auto",
        device: str | torch.device | None = None,
        seed: int = 0,
        max_model_len: int | None = None,
        quantization: str | None = None,
        quantization_config: dict[str, Any] | None = None,
        model_backend: str | None = None,
        **engine_args: Any,
    ):
        known = set(EngineConfig.__dataclass_fields__)
        unknown = sorted(set(engine_args) - known)
        if unknown:
            raise TypeError(f"unknown LLM arguments {unknown}; engine arguments are {sorted(known)}")
        engine_config = EngineConfig(**engine_args)
        self._check_engine_config(engine_config)
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.device = resolve_device(device)
        self.dtype = resolve_dtype(dtype, self.device)
        self.model_name = DEFAULT_MODEL if model is None else str(model)
        self.model_path = resolve_model_path(model)
        self.model = load_model(self.model_path, dtype=self.dtype, device=self.device)
        self.config = self.model.config
        self.tokenizer = _load_tokenizer(tokenizer or self.model_path)
        self.quantization = setup_quantization(self.model, self.tokenizer, quantization, quantization_config)
        backend, explicit = resolve_model_backend(model_backend)
        self.model_backend = apply_model_backend(self.model, backend, explicit)
        limit = self.config.max_position_embeddings
        if max_model_len is not None and not (isinstance(max_model_len, int) and 1 < max_model_len <= limit):
            raise ValueError(f"max_model_len must be an int in [2, {limit}], got {max_model_len!r}")
        self.max_model_len = max_model_len or limit
        generation_config = _read_generation_config(self.model_path)
        self.eos_token_ids = _eos_token_ids(self.config.eos_token_ids, self.tokenizer,
                                            generation_config)
        self.engine_config = engine_config
        self.input_processor = InputProcessor(
            self.tokenizer, self.config.vocab_size, self.max_model_len, self.eos_token_ids, self.device, seed,
            max_model_len_reason=None if max_model_len is None else SET_BY_CALLER,
            max_logprobs=engine_config.max_logprobs, max_n=engine_config.max_n,
            structured_outputs_config=engine_config.structured_outputs_config,
        )
        self.generation_config = generation_defaults(generation_config)
        self._num_requests = 0  # ids "0", "1", ... of requests accepted so far
        self._start_engine(engine_config)
        self.max_model_len = self.input_processor.max_model_len

    def _check_engine_config(self, engine_config: EngineConfig) -> None:
        """Refuse engine options this front door cannot honour (a subclass may narrow them)."""

    def _start_engine(self, engine_config: EngineConfig) -> None:
        """Build the `LLMEngine` (add_request / step / abort_request) that serves the requests."""
        self.engine = LLMEngine(self.model, self.tokenizer, self.input_processor, engine_config)

    def run_steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        """Run prepared requests to completion, yielding after each step those that got a token."""
        pending = {r.request_id for r in requests}
        try:
            for request in requests:
                self.engine.add_prepared_request(request)
            while any(not r.finished for r in requests):
                advanced = self.engine.step_requests()
                yield [r for r in advanced if r.request_id in pending]
        finally:
            # A caller that stops early (or an error) must not leave blocks held.
            for r in requests:
                if not r.finished:
                    self.engine.abort_request(r.request_id)

    @property
    def kv_budget(self):
        """The KV pool's arithmetic (`core.kv_cache_sizing.KVCacheBudget`)."""
        return self.engine.kv_budget

    def max_context_len(self, concurrency: int = 1) -> int:
        """The longest context each of `concurrency` requests can get at once from the KV pool."""
        return self.kv_budget.max_context_len(concurrency)

    @property
    def num_parameters(self) -> int:
        # From the shapes: a quantized layer keeps its weight as buffers, not parameters.
        return self.config.num_parameters()

    @property
    def weight_bytes(self) -> int:
        """Bytes the weights take on the device (quantized codes, scales and offsets included)."""
        return weight_bytes(self.model) + fused_weight_bytes(self.model)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model_name!r}, "
            f"device={self.device}, dtype={self.dtype}, parameters={self.num_parameters:,}"
            + (f", quantization={self.quantization.describe()}" if self.quantization else "")
            + ")"
        )

    def get_tokenizer(self):
        return self.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """vLLM's: SamplingParams with the checkpoint's generation_config.json values."""
        return SamplingParams(**self.generation_config)

    # -- requests ---------------------------------------------------------------------------

    def make_requests(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        priority: Sequence[int] | None = None,
    ) -> list[Request]:
        """Tokenize and validate prompts into `Request`s (n per prompt, in prompt order)."""
        return [r for group in self._make_groups(prompts, sampling_params, priority) for r in group]

    def _make_groups(self, prompts: PromptType | Sequence[PromptType],
                     sampling_params: SamplingParams | Sequence[SamplingParams] | None,
                     priority: Sequence[int] | None = None) -> list[list[Request]]:
        """Per prompt, its n sample requests."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        if not isinstance(prompts, Sequence) or isinstance(prompts, bytes):
            raise TypeError("prompts must be a string, a {'prompt_token_ids': [...]} dict, "
                            "or a list of them")
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        if isinstance(sampling_params, SamplingParams):
            params_list = [sampling_params] * len(prompts)
        else:
            params_list = list(sampling_params)
            if len(params_list) != len(prompts):
                raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} "
                                 "prompts; pass one for all or exactly one per prompt")
            if not all(isinstance(p, SamplingParams) for p in params_list):
                raise TypeError("sampling_params must be SamplingParams or a list of them")
        self._check_params(params_list)
        priorities = self._priorities(priority, len(prompts))
        return [self._make_group(p, sp, pr) for p, sp, pr in zip(prompts, params_list, priorities)]

    def _check_params(self, params_list: list[SamplingParams]) -> None:
        """Refuse sampling options this front door cannot honour (a subclass may narrow them)."""

    def _priorities(self, priority: Sequence[int] | None, num_prompts: int) -> list[int]:
        """One priority per prompt (vLLM's `generate(..., priority=[...])`), checked up front."""
        if priority is None:
            return [0] * num_prompts
        if isinstance(priority, (int, str, bytes)) or not isinstance(priority, Sequence):
            raise TypeError(f"priority must be a list of ints, one per prompt, got {priority!r}")
        if len(priority) != num_prompts:
            raise ValueError(f"got {len(priority)} priorities for {num_prompts} prompts; pass one per prompt")
        policy = self.engine_config.scheduling_policy
        for p in priority:
            if isinstance(p, bool) or not isinstance(p, int):
                raise TypeError(f"priority must be a list of ints (lower is served first), got {p!r} in it")
            check_priority(p, policy)
        return list(priority)

    def _make_group(self, prompt: PromptType, params: SamplingParams, priority: int = 0) -> list[Request]:
        # The id is taken only once the request is valid: a refused prompt must not shift
        # the ids (and so the default seeds) of the requests after it.
        group = self.input_processor.make_requests(str(self._num_requests), prompt, params, priority)
        self._num_requests += 1
        return group

    # -- generation -------------------------------------------------------------------------

    def generate(
        self,
        prompts: PromptType | Sequence[PromptType],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Completions of every prompt, in prompt order.  `priority`: one int per prompt, lower
        served first (scheduling_policy="priority")."""
        groups = self._make_groups(prompts, sampling_params, priority)
        requests = [r for group in groups for r in group]
        for request in requests:
            request.incremental_text = False  # only finished texts are returned: decode once
        progress = _progress_bar(len(requests), enabled=use_tqdm)
        for _ in self.run_steps(requests):
            if progress is not None:
                progress.update(sum(r.finished for r in requests) - progress.n)
        if progress is not None:
            progress.close()
        return [
            group[0].to_output() if len(group) == 1 else merge_samples(group, group[0].request_id.split("_", 1)[1])
            for group in groups
        ]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template_kwargs: dict[str, Any] | None = None,
    ) -> list[RequestOutput]:
        """The assistant's reply to a conversation ({"role", "content"} dicts) or to each of a list
        of them, rendered with the server's chat template (and its stop strings)."""
        fmt = chat_format_for(self.tokenizer, self.model_path)
        if fmt is None:
            raise ValueError("this model has no chat template (its tokenizer defines none); use generate()")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [render_chat(self.tokenizer, fmt, list(c), chat_template_kwargs) for c in conversations]
        if sampling_params is None:
            sampling_params = self.get_default_sampling_params()
        params = [sampling_params] * len(prompts) if isinstance(sampling_params, SamplingParams) else list(sampling_params)
        if fmt.default_stop:  # the end of the turn; ignore_eos ignores it too, as the server does
            params = [p if p.ignore_eos else with_stop_strings(p, fmt.default_stop) for p in params]
        return self.generate(prompts, params, use_tqdm=use_tqdm)

    def stream(self, prompt: PromptType,
               sampling_params: SamplingParams | None = None) -> Iterator[str]:
        """Yield the text of one completion piece by piece as tokens are produced."""
        (request,) = self.make_requests(prompt, sampling_params)
        yield from self.stream_request(request)

    def stream_request(self, request: Request) -> Iterator[str]:
        """Run one prepared request, yielding new text after each token."""
        shown = 0
        for _ in self.run_steps([request]):
            text = request.output_text
            # Hold back text that may still become a stop string or a multi-byte character.
            safe = len(text) if request.finished else streamable_len(text, request.sampling_params)
            if safe > shown:
                yield text[shown:safe]
                shown = safe


# vLLM's generation_config="auto": these keys of generation_config.json become defaults.
_GENERATION_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                    "repetition_penalty": "repetition_penalty", "max_new_tokens": "max_tokens"}


def _read_generation_config(folder: Path) -> dict[str, Any]:
    path = Path(folder) / "generation_config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def generation_defaults(config: dict[str, Any]) -> dict[str, Any]:
    """SamplingParams fields from a checkpoint's generation_config (vLLM's subset)."""
    defaults = {ours: config[key] for key, ours in _GENERATION_KEYS.items() if config.get(key) is not None}
    SamplingParams(**defaults)  # a bad file is an error now, not at the first generate
    return defaults


def with_stop_strings(params: SamplingParams, stops: tuple[str, ...]) -> SamplingParams:
    """`params` with `stops` added to its stop strings (the chat format's)."""
    merged = params.stop_strings + [s for s in stops if s not in params.stop_strings]
    return replace(params, stop=merged)


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="Generating", unit="req", leave=False, delay=2)


def _load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as e:
        raise ValueError(f"could not load a tokenizer from {path}: {e}") from e


def _eos_token_ids(config_eos: tuple[int, ...], tokenizer,
                   generation_config: dict) -> tuple[int, ...]:
    """EOS ids from generation_config.json, config.json and the tokenizer, merged."""
    ids = set(config_eos)
    eos = generation_config.get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else ([] if eos is None else [eos]))
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return tuple(sorted(ids))
