"""What `generate` returns: vLLM's `RequestOutput` / `CompletionOutput` / `Logprob` shapes.

Logprobs, where asked for, are one dict per position, {token id: Logprob}: the chosen token
(sampled, or the prompt's own) with its rank, and the top-k tokens with ranks 1..k (one entry
when the chosen token is among them).  `RequestOutput.prompt_logprobs[0]` is None: nothing
predicts a prompt's first token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .spec_decode.metrics import SpecDecodingStats


@dataclass
class RequestMetrics:
    """Wall-clock times (time.perf_counter seconds) of one request's life."""

    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    token_times: list[float] = field(default_factory=list)
    finished_time: float | None = None
    # Speculative decoding only: rounds, drafted and accepted tokens (vLLM's names).
    spec_decoding: SpecDecodingStats | None = None

    @property
    def ttft(self) -> float | None:
        """Time to first token: arrival -> first output token."""
        if self.first_token_time is None:
            return None
        return self.first_token_time - self.arrival_time

    @property
    def inter_token_latencies(self) -> list[float]:
        return [b - a for a, b in zip(self.token_times, self.token_times[1:])]

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first (mean inter-token latency)."""
        gaps = self.inter_token_latencies
        return sum(gaps) / len(gaps) if gaps else None

    @property
    def e2e_latency(self) -> float | None:
        if self.finished_time is None:
            return None
        return self.finished_time - self.arrival_time


@dataclass
class Logprob:
    logprob: float  # natural log of the model's probability (raw logits, before any penalty)
    rank: int | None = None  # 1 = the most likely token at this position
    decoded_token: str | None = None


PositionLogprobs = dict[int, Logprob]  # one position's chosen and top-k tokens


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop", "length", "abort" or None while running
    # The stop string or stop token id that ended it; None when EOS (or length) did (vLLM's).
    stop_reason: int | str | None = None
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs, if asked
    logprobs: list[PositionLogprobs] | None = None  # per output token, if asked

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = None  # per prompt token, if asked
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache
