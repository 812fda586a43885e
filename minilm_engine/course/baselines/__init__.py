"""The baselines the chapters compare the engine against, each a small file: who runs when, and
where the keys and values live.

    no_cache.py       recompute the whole sequence for every token
    kv_cache.py       one request at a time, with a contiguous KV cache
    static_batch.py   pad a batch, run it until its longest request ends
    contiguous_cache.py  the contiguous cache they use (one slab per request)

`BaselineLLM(model, strategy=NAME)` is an `LLM` whose requests run through baseline NAME
instead of the engine (same model, tokenizer, validation and outputs), so a chapter can time
both behind one API; strategy="continuous" is the engine itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from minilm_engine.core.config import EngineConfig
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.baselines.base import Strategy
from minilm_engine.course.baselines.kv_cache import KVCacheStrategy
from minilm_engine.course.baselines.no_cache import NoCacheStrategy
from minilm_engine.course.baselines.static_batch import StaticBatchStrategy
from minilm_engine.entrypoints.llm import LLM

STRATEGIES: dict[str, type[Strategy] | None] = {
    "no_cache": NoCacheStrategy,
    "kv_cache": KVCacheStrategy,
    "static_batch": StaticBatchStrategy,
    "continuous": None,  # the engine (`LLMEngine`), not a baseline
}


class BaselineLLM(LLM):
    """`LLM` with `strategy=`: "continuous" (the engine), or a baseline "no_cache", "kv_cache",
    "static_batch" that serves the same requests its own way."""

    def __init__(self, model: Any = None, *, strategy: str = "continuous", **kwargs: Any):
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy must be one of {sorted(STRATEGIES)}, got {strategy!r}")
        self.strategy_name = strategy
        super().__init__(model, **kwargs)

    def _check_engine_config(self, engine_config: EngineConfig) -> None:
        if self.strategy_name == "continuous":
            return
        if engine_config.speculative_config is not None:
            raise ValueError(
                f"speculative decoding runs in the continuous engine; strategy={self.strategy_name!r} cannot use it"
            )
        if engine_config.scheduling_policy != "fcfs":
            raise ValueError(
                f"scheduling_policy={engine_config.scheduling_policy!r} runs in the continuous engine; "
                f"strategy={self.strategy_name!r} serves in its own order"
            )

    def _start_engine(self, engine_config: EngineConfig) -> None:
        if self.strategy_name == "continuous":
            super()._start_engine(engine_config)
            return
        baseline = STRATEGIES[self.strategy_name]
        self.strategy = baseline(self.model, self.tokenizer, engine_config, self.input_processor)

    def run_steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        if self.strategy_name == "continuous":
            return super().run_steps(requests)
        return self.strategy.steps(requests)

    def _check_params(self, params_list: list[SamplingParams]) -> None:
        if self.strategy_name != "continuous" and any(p.prompt_logprobs is not None for p in params_list):
            raise ValueError(
                f"prompt_logprobs need the continuous engine (strategy={self.strategy_name!r} "
                "computes no logits at prompt positions)"
            )

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: a baseline has no step-wise engine.
        if name in ("engine", "kv_budget"):
            raise AttributeError(
                f"strategy {self.strategy_name!r} has no step-wise engine; use 'continuous'"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __repr__(self) -> str:
        return super().__repr__().replace("(model=", f"(strategy={self.strategy_name!r}, model=", 1)


__all__ = ["STRATEGIES", "BaselineLLM", "KVCacheStrategy", "NoCacheStrategy", "StaticBatchStrategy", "Strategy"]
