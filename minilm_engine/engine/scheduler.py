"""Continuous batching: who runs in the next engine step, and how many tokens each.

Contract: `schedule()` picks work for one step under two limits, `max_num_batched_tokens`
(tokens computed this step) and `max_num_seqs` (requests in the batch).  There is no "prefill
phase" or "decode phase": each request simply has tokens whose keys/values are not computed yet
(`num_tokens - num_computed_tokens`: the whole prompt at first, one token per step later), and
all requests draw on the same budget (vLLM v1's scheduler):

    1. running requests first, in arrival order; a prompt too long for what is left of the
       budget is cut into a chunk (chunked prefill);
    2. if the pool runs out of blocks, the most recently arrived running request is preempted:
       its blocks are freed and it goes back to the front of the queue, to be recomputed later
       (so nothing is lost and the oldest requests always make progress);
    3. then waiting requests, oldest first, reusing cached prefix blocks where they can.

`update_from_output()` records what the step computed; the engine appends sampled tokens and
calls `finish()` for requests that are done.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..kv_cache.block_manager import BlockManager
from ..request import Request, RequestStatus
from .config import EngineConfig


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step, decided by `schedule()` and fixed from then on.

    The kind of step is stored, not read later from the request: `update_from_output` moves
    the request on, and a property computed from live state would then answer differently.
    """

    request: Request
    num_computed_tokens: int  # tokens already in the cache: this step computes the ones after
    num_new_tokens: int  # tokens computed this step
    num_cached_tokens: int  # prefix-cache hit, on the request's first step only (else 0)
    # Decode = computing the one token sampled last step; anything else fills the cache
    # (a prompt, a chunk of one, or a preempted request's recompute).
    is_prefill: bool
    # After this step every known token is computed, so the step samples a new token.
    completes_sequence: bool
    # Speculative decoding: the drafts verified this step, after the request's last token
    # (num_new_tokens counts them: 1 + len(spec_token_ids) for a speculating decode).
    spec_token_ids: list[int] = field(default_factory=list)


def schedule_request(request: Request, num_new_tokens: int, num_cached_tokens: int = 0) -> ScheduledRequest:
    """Decide what computing `num_new_tokens` of `request` is, from where it stands now.

    Tokens past the request's own are its drafts (speculative decoding): as many of
    `request.spec_token_ids` as fit.
    """
    num_computed, num_tokens = request.num_computed_tokens, request.num_tokens
    num_spec = max(0, num_computed + num_new_tokens - num_tokens)
    spec_token_ids = request.spec_token_ids[:num_spec]
    is_decode = (
        num_new_tokens == 1 + num_spec and num_computed == num_tokens - 1 and len(request.output_token_ids) > 0
    )
    return ScheduledRequest(
        request,
        num_computed,
        num_new_tokens,
        num_cached_tokens,
        is_prefill=not is_decode,
        completes_sequence=num_computed + num_new_tokens == num_tokens + num_spec,
        spec_token_ids=spec_token_ids,
    )


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)

    @property
    def num_prefill_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if s.is_prefill)

    @property
    def num_decode_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled if not s.is_prefill)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled


class Scheduler:
    """Invariant: every request is in exactly one of `waiting` and `running`, or finished;
    running requests hold blocks, waiting ones hold none."""

    def __init__(self, config: EngineConfig, block_manager: BlockManager):
        self.config = config
        self.block_manager = block_manager
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # Totals since start, read by the server's /metrics (vLLM's names, without "vllm:").
        self.num_preemptions = 0
        self.num_prefix_cache_queries = 0  # prompt tokens looked up when a request is admitted
        self.num_prefix_cache_hits = 0  # of which found in the prefix cache

    def add_request(self, request: Request) -> None:
        self.waiting.append(request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> SchedulerOutput:
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens

        # 1. Running requests, oldest first.
        i = 0
        while i < len(self.running) and budget > 0:
            request = self.running[i]
            num_computed = request.num_computed_tokens
            num_new = self._num_tokens_to_compute(
                request.num_tokens, num_computed, budget, len(request.spec_token_ids)
            )
            if num_new == 0:
                i += 1
                continue
            # 2. Make room: preempt from the back (newest) until this request fits.
            while True:
                if self.block_manager.allocate_slots(request.request_id, num_computed, num_new):
                    out.scheduled.append(schedule_request(request, num_new))
                    budget -= num_new
                    i += 1
                    break
                victim = self.running.pop()
                self._preempt(victim)
                out.preempted.append(victim)
                if victim is request:
                    break  # it was the newest itself: it waits, and the loop ends with it

        # 3. Waiting requests, oldest first, while budget, batch slots and blocks allow.
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            if out.preempted:
                break  # memory is short this step: admitting more would only thrash
            request = self.waiting[0]
            computed_blocks, num_cached = self.block_manager.get_computed_blocks(request.all_token_ids)
            num_new = self._num_tokens_to_compute(request.num_tokens, num_cached, budget)
            if num_new == 0 or not self.block_manager.allocate_slots(
                request.request_id, num_cached, num_new, computed_blocks
            ):
                break
            self.waiting.popleft()
            self.running.append(request)
            self.num_prefix_cache_queries += request.num_tokens
            self.num_prefix_cache_hits += num_cached
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_cached  # the prefix hit is in the cache already
            out.scheduled.append(schedule_request(request, num_new, num_cached))
            budget -= num_new
        return out

    def _num_tokens_to_compute(
        self, num_tokens: int, num_computed_tokens: int, budget: int, num_spec_tokens: int = 0
    ) -> int:
        remaining = num_tokens - num_computed_tokens
        if remaining == 1 and num_spec_tokens:
            # A decode with drafts: as many of them as the budget leaves room for.
            return min(1 + num_spec_tokens, budget)
        if remaining <= budget:
            return remaining
        # Without chunked prefill a prompt runs whole or waits for a step with room for it.
        return budget if self.config.enable_chunked_prefill else 0

    def _preempt(self, request: Request) -> None:
        self.num_preemptions += 1
        self.block_manager.free(request.request_id)
        request.num_computed_tokens = 0
        request.spec_token_ids = []  # drafts of a request that does not run now are stale
        request.status = RequestStatus.PREEMPTED
        self.waiting.appendleft(request)

    def update_from_output(self, out: SchedulerOutput, num_rejected: list[int] | None = None) -> None:
        """The step ran: its tokens' keys/values are in the cache; full blocks join the cache.

        `num_rejected[i]`: drafts of scheduled request i the target turned down (speculative
        decoding; call this after appending the accepted tokens).  Their keys/values are
        garbage: the computed count falls back before them, and blocks past it are freed.
        """
        for i, s in enumerate(out.scheduled):
            r = s.request
            rejected = num_rejected[i] if num_rejected is not None else 0
            r.num_computed_tokens += s.num_new_tokens - rejected
            self.block_manager.commit(r.request_id, r.all_token_ids, r.num_computed_tokens)
            if rejected:
                self.block_manager.trim(r.request_id, r.num_computed_tokens)

    def finish(self, request: Request) -> None:
        """Remove a finished or aborted request and free its blocks (now, not later)."""
        if request in self.running:
            self.running.remove(request)
            self.block_manager.free(request.request_id)
        elif request in self.waiting:
            self.waiting.remove(request)
