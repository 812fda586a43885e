"""What a step and a request return.

`generate` returns vLLM's `RequestOutput` / `CompletionOutput` / `Logprob` shapes.  A step's
results travel from the worker to the scheduler as plain data, `ModelRunnerOutput`, and a
draft's proposal as `DraftTokens` (vLLM's `v1/outputs.py`), so the scheduler never imports the
worker.  Logprobs are one dict per position, {token id: Logprob}: the chosen token with its
rank, then the top-k with ranks 1..k; `prompt_logprobs[0]` is None (nothing predicts it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minilm_engine.core.spec_decode_stats import SpecDecodingStats

if TYPE_CHECKING:
    import torch


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
        return None if self.first_token_time is None else self.first_token_time - self.arrival_time

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
        return None if self.finished_time is None else self.finished_time - self.arrival_time


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


@dataclass
class TokenLogprobs:
    """Logprobs at some positions, as plain lists (vLLM's LogprobsLists).  Row i: the chosen
    token (sampled, or the prompt's next token) first, then the top-k tokens best first."""

    token_ids: list[list[int]]  # (N, 1 + k)
    logprobs: list[list[float]]  # (N, 1 + k)
    ranks: list[int]  # (N,) the chosen token's rank (1 = the most likely)

    def __len__(self) -> int:
        return len(self.ranks)

    def row(self, i: int) -> TokenLogprobs:
        return TokenLogprobs(self.token_ids[i : i + 1], self.logprobs[i : i + 1], self.ranks[i : i + 1])


@dataclass
class DraftTokens:
    """What the draft proposed for one request this round."""

    token_ids: list[int]  # k proposed tokens, k >= 0
    probs: torch.Tensor | None = None  # (k, V) the draft's distributions; None for greedy requests

    def __len__(self) -> int:
        return len(self.token_ids)

    def truncate(self, num_tokens: int) -> DraftTokens:
        """The first `num_tokens` drafts (a short token budget verifies fewer)."""
        probs = None if self.probs is None else self.probs[:num_tokens]
        return DraftTokens(self.token_ids[:num_tokens], probs)


@dataclass
class PromptLogprobs:
    """The logprobs of prompt tokens first_position, first_position + 1, ... (one chunk's)."""

    first_position: int
    logprobs: TokenLogprobs


@dataclass
class ModelRunnerOutput:
    """One step's results, per scheduled request (in schedule order)."""

    sampled_token_ids: list[list[int]]
    logprobs: list[TokenLogprobs | None] = field(default_factory=list)  # of the sampled tokens
    prompt_logprobs: list[PromptLogprobs | None] = field(default_factory=list)
