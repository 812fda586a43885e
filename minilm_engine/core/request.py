"""A request's state as it moves through the engine, and the rules that finish it.

Contract: the scheduler calls `request.append_output_token(token_id)` after every sampled token;
the request then decides whether its ids end it (EOS, a stop token id, a terminated grammar,
`max_tokens`, the context full) and records vLLM's `finish_reason` ("stop" or "length") and
`stop_reason` (the stop token id; None for EOS).  Nothing here sees a tokenizer: the output
processor writes `output_text` and ends a request on a stop string (`stop_on_string`).
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

import torch

from minilm_engine.core.outputs import (
    CompletionOutput,
    Logprob,
    PositionLogprobs,
    RequestMetrics,
    RequestOutput,
)
from minilm_engine.core.outputs import TokenLogprobs
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.structured_output import Grammar


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def finished(self) -> bool:
        return self in _FINISH_REASONS


_FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: tuple[int, ...]
    max_model_len: int
    generator: torch.Generator | None = None
    priority: int = 0  # under scheduling_policy="priority": lower is served first (vLLM's)
    output_token_ids: list[int] = field(default_factory=list)
    output_text: str = ""  # written by the output processor; the core only copies it out
    status: RequestStatus = RequestStatus.WAITING
    stop_reason: int | str | None = None
    num_computed_tokens: int = 0  # tokens whose keys/values are in the cache (paged engine)
    metrics: RequestMetrics = field(default_factory=lambda: RequestMetrics(time.perf_counter()))
    # Prefix caching: block size -> chained hashes of its full blocks, computed once.
    block_hashes: dict[int, list[int]] = field(default_factory=dict, repr=False)
    incremental_text: bool = True  # output_text follows every token (False: decoded at the end)
    index: int = 0  # which of the n samples of its prompt this request is (n > 1)
    # n > 1: the sample whose prompt KV this one reads from the prefix cache (`waits_for_prefix`).
    prefix_source: Request | None = field(default=None, repr=False)
    num_cached_tokens: int | None = None  # prefix-cache hit when first scheduled
    # Logprobs, if asked: one {token id: Logprob} per output token, and per prompt token.
    logprobs: list[PositionLogprobs] | None = field(default=None, repr=False)
    cumulative_logprob: float | None = None
    prompt_logprobs: list[PositionLogprobs | None] | None = field(default=None, repr=False)
    grammar: Grammar | None = field(default=None, repr=False)  # structured outputs' matcher

    def __post_init__(self) -> None:
        # Prompt and outputs in one list, kept up to date token by token (read every step).
        self._all_token_ids = list(self.prompt_token_ids) + list(self.output_token_ids)
        params = self.sampling_params
        if params.logprobs is not None and self.logprobs is None:
            self.logprobs, self.cumulative_logprob = [], 0.0
        if params.prompt_logprobs is not None and self.prompt_logprobs is None:
            self.prompt_logprobs = [None]

    @property
    def skip_reading_prefix_cache(self) -> bool:
        """Prompt logprobs need the logits of every prompt position: nothing may be skipped."""
        return self.sampling_params.prompt_logprobs is not None

    @property
    def waits_for_prefix(self) -> bool:
        """n > 1: wait while the sample this one shares its prompt with is still computing it,
        so that this one finds the prompt's full blocks in the prefix cache."""
        source = self.prefix_source
        return (
            source is not None
            and not source.finished
            and source.num_computed_tokens < source.num_prompt_tokens
        )

    def append_logprobs(self, found: TokenLogprobs) -> None:
        """The logprobs of the token(s) just appended (one row per token)."""
        for row in _position_dicts(found):
            self.logprobs.append(row)
            self.cumulative_logprob += next(iter(row.values())).logprob

    def append_prompt_logprobs(self, first_position: int, found: TokenLogprobs) -> None:
        """The logprobs of prompt tokens first_position, first_position + 1, ...; positions
        already known (a preempted request computes its prompt again) are not added twice."""
        rows = _position_dicts(found)
        skip = len(self.prompt_logprobs) - first_position
        self.prompt_logprobs.extend(rows[max(skip, 0):])

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt then outputs, as one list (the request's own: read it, do not change it)."""
        return self._all_token_ids

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def max_new_tokens(self) -> int:
        """Output tokens this request may still produce at most (max_tokens and context)."""
        room = self.max_model_len - self.num_prompt_tokens
        limit = self.sampling_params.max_tokens
        return room if limit is None else min(limit, room)

    @property
    def finish_reason(self) -> str | None:
        return _FINISH_REASONS.get(self.status)

    @property
    def finished(self) -> bool:
        return self.status.finished

    def append_output_token(self, token_id: int) -> None:
        """Record a sampled token, then check whether its id ends the request."""
        now = time.perf_counter()
        if self.metrics.first_token_time is None:
            self.metrics.first_token_time = now
        self.metrics.token_times.append(now)
        self.output_token_ids.append(token_id)
        self._all_token_ids.append(token_id)
        if self.grammar is not None and not self.grammar.accept_token(token_id):
            # The sampler allowed only what the grammar allows: this is an engine bug.
            raise RuntimeError(f"request {self.request_id!r}: its grammar refuses token {token_id}")
        if self.is_stop_token(token_id):
            # vLLM's stop_reason: the stop token id, or None when EOS ended it.
            is_eos = token_id not in self.sampling_params.stop_token_ids
            self.status = RequestStatus.FINISHED_STOPPED
            self.stop_reason = None if is_eos else token_id
        elif self.grammar is not None and self.grammar.is_terminated:  # (with ignore_eos)
            self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, None
        elif len(self.output_token_ids) >= self.max_new_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
        self._stamp_finish()

    def stop_on_string(self, stop: str, num_output_tokens: int) -> None:
        """The output processor found `stop` in the text of the first `num_output_tokens` output
        tokens: the request ends there (later tokens, accepted drafts, are dropped)."""
        del self.output_token_ids[num_output_tokens:]
        del self._all_token_ids[self.num_prompt_tokens + num_output_tokens :]
        del self.metrics.token_times[num_output_tokens:]
        self.num_computed_tokens = min(self.num_computed_tokens, self.num_tokens)
        self.status, self.stop_reason = RequestStatus.FINISHED_STOPPED, stop
        self._stamp_finish()

    def _stamp_finish(self) -> None:
        if self.finished:
            self.metrics.finished_time = self.metrics.token_times[-1]

    def is_stop_token(self, token_id: int) -> bool:
        """Whether this token would end the request (a stop token id, or EOS unless ignored)."""
        params = self.sampling_params
        is_eos = not params.ignore_eos and token_id in self.eos_token_ids
        return is_eos or token_id in params.stop_token_ids

    def abort(self) -> None:
        self.status = RequestStatus.FINISHED_ABORTED
        self.metrics.finished_time = time.perf_counter()

    def to_output(self) -> RequestOutput:
        return merge_samples([self], self.request_id)

    def completion(self) -> CompletionOutput:
        return CompletionOutput(
            index=self.index,
            text=self.output_text,
            token_ids=list(self.output_token_ids),
            finish_reason=self.finish_reason,
            stop_reason=self.stop_reason,
            cumulative_logprob=self.cumulative_logprob,
            logprobs=None if self.logprobs is None else list(self.logprobs),
        )


def merge_samples(samples: list[Request], request_id: str) -> RequestOutput:
    """The n samples of one prompt -> one RequestOutput, outputs indexed 0..n-1 (vLLM's shape).
    Prompt logprobs come from sample 0 (the only one that computes them); num_cached_tokens
    adds up the samples' prefix-cache hits."""
    first = samples[0]
    return RequestOutput(
        request_id=request_id,
        prompt=first.prompt,
        prompt_token_ids=first.prompt_token_ids,
        outputs=[s.completion() for s in sorted(samples, key=lambda s: s.index)],
        finished=all(s.finished for s in samples),
        metrics=first.metrics,
        prompt_logprobs=first.prompt_logprobs,
        num_cached_tokens=sum(s.num_cached_tokens or 0 for s in samples),
    )


def _position_dicts(found: TokenLogprobs) -> list[PositionLogprobs]:
    """vLLM's shape, one dict per position: {chosen id: Logprob(logprob, rank), then the top-k
    ids: Logprob(logprob, 1..k)} (the output processor names their tokens)."""
    rows = []
    for ids, values, rank in zip(found.token_ids, found.logprobs, found.ranks):
        row: PositionLogprobs = {}
        for j, (token_id, value) in enumerate(zip(ids, values)):
            if token_id not in row:
                row[token_id] = Logprob(value, rank if j == 0 else j)
        rows.append(row)
    return rows
