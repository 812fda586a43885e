"""What every serving strategy shares: the model, the tokenizer, and "sample, then record".

Contract: `strategy.steps(requests)` runs the requests to completion one model step at a time
and yields, after each step, the requests that received a token in it (so callers can stream or
draw).  `strategy.run(requests)` just drains it.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator

import torch

from minilm_engine.core.config import EngineConfig
from minilm_engine.entrypoints.input_processor import InputProcessor
from minilm_engine.entrypoints.output_processor import OutputProcessor
from minilm_engine.model import CausalLM
from minilm_engine.core.request import Request, RequestStatus
from minilm_engine.worker.sampler import sample_requests


class Strategy(ABC):
    name: str = ""

    def __init__(
        self, model: CausalLM, tokenizer, config: EngineConfig, input_processor: InputProcessor
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.input_processor = input_processor
        self.output_processor = OutputProcessor(tokenizer)  # text and stop strings, as the engine's

    @abstractmethod
    def steps(self, requests: list[Request]) -> Iterator[list[Request]]:
        """Run `requests` to completion, yielding the requests that got a token each step."""

    def run(self, requests: list[Request]) -> None:
        for _ in self.steps(requests):
            pass

    def sample_and_append(self, requests: list[Request], logits: torch.Tensor) -> None:
        """logits: (len(requests), V), one row per request -> one new token each (penalties,
        logit bias, min-tokens and logprobs as in the engine: `sampler.sample_requests`)."""
        sampled = sample_requests(logits, requests)
        for request, token, logprobs in zip(requests, sampled.token_ids.tolist(), sampled.logprobs):
            request.append_output_token(token)
            if logprobs is not None:
                request.append_logprobs(logprobs)
        for match in self.output_processor.process(requests):
            match.request.stop_on_string(match.stop, match.num_output_tokens)

    @staticmethod
    def mark_running(requests: list[Request]) -> None:
        for r in requests:
            r.status = RequestStatus.RUNNING
            if r.metrics.first_scheduled_time is None:
                r.metrics.first_scheduled_time = time.perf_counter()
