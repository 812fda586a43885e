"""Continuous batching: who runs in the next engine step, and how many tokens each.

Contract: `schedule()` picks work for one step under two limits, `max_num_batched_tokens`
(tokens computed this step) and `max_num_seqs` (requests in the batch).  There is no "prefill
phase" or "decode phase": each request simply has tokens whose keys/values are not computed yet
(`num_tokens - num_computed_tokens`: the whole prompt at first, one token per step later), and
all requests draw on the same budget (vLLM v1's scheduler).  The step is decided as plain data
by `schedule_step.py` (running requests first, a victim preempted when blocks run out, then the
waiting queue in order); `_StepPool` carries out each allocation, admission and preemption as
it is asked for, then checks the returned plan against them.  The policy, "fcfs" or
"priority", is `request_queue.py`'s.

Data flows one way through an engine step, and the scheduler owns both ends of it:

    drafts (spec_decode) ──> schedule(drafts) ──> SchedulerOutput ──> ModelRunner.execute
                                                                           │ tokens per request
    release (engine: finish(), the draft's blocks) <── update_from_output(out, sampled) <┘

The output also carries what changed in the block tables, so the runner keeps its own copy
(`worker/block_table.py`) without asking the block manager: per scheduled request the blocks it
already has and the new ones after them, and the tables released since the last step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minilm_engine.core.config import EngineConfig
from minilm_engine.core.kv_cache_manager import BlockManager
from minilm_engine.core.outputs import DraftTokens
from minilm_engine.core.request import Request, RequestStatus
from minilm_engine.core.request_queue import RequestOrder
from minilm_engine.core.schedule_step import (
    StepInputs, StepPlan, StepPlanError, StepRequest, schedule_step,
)

if TYPE_CHECKING:
    from minilm_engine.core.outputs import ModelRunnerOutput


@dataclass(frozen=True)
class ScheduledRequest:
    """One request's share of a step, decided by `schedule()` and fixed from then on (not read
    later from the request, which `update_from_output` moves on)."""

    request: Request
    num_computed_tokens: int  # tokens already in the cache: this step computes the ones after
    num_new_tokens: int  # tokens computed this step
    num_cached_tokens: int  # prefix-cache hit, on the request's first step only (else 0)
    # Decode = computing the one token sampled last step; anything else fills the cache
    # (a prompt, a chunk of one, or a preempted request's recompute).
    is_prefill: bool
    samples_token: bool  # every known token is computed after this step (not a prompt chunk)
    # The request's block table as the runner must update it: its first `num_kept_blocks`
    # blocks stay, `new_block_ids` follow (0 kept: the runner has not seen the table).
    num_kept_blocks: int
    new_block_ids: list[int]
    # Speculative decoding: the drafts verified this step after the request's last token, ids
    # and the draft's probabilities together (num_new_tokens counts them: 1 + k).
    draft: DraftTokens | None = None

    @property
    def spec_token_ids(self) -> list[int]:
        """The draft's token ids verified this step ([] without speculation)."""
        return [] if self.draft is None else self.draft.token_ids


def is_decoding(request: Request) -> bool:
    """Every token but the one sampled last is in the cache: the next step is a decode."""
    return request.num_computed_tokens == request.num_tokens - 1 and len(request.output_token_ids) > 0


def schedule_request(
    request: Request,
    num_new_tokens: int,
    num_cached_tokens: int = 0,
    draft: DraftTokens | None = None,
    block_update: tuple[int, list[int]] = (0, []),
) -> ScheduledRequest:
    """What computing `num_new_tokens` of `request` is, from where it stands now.  Tokens past
    its own are drafts (as many of `draft`'s as fit); `block_update`: (kept, new block ids)."""
    num_computed, num_tokens = request.num_computed_tokens, request.num_tokens
    num_spec = max(0, num_computed + num_new_tokens - num_tokens)
    verified = draft.truncate(num_spec) if draft is not None and num_spec > 0 else None
    return ScheduledRequest(
        request,
        num_computed,
        num_new_tokens,
        num_cached_tokens,
        is_prefill=not (num_new_tokens == 1 + num_spec and is_decoding(request)),
        samples_token=num_computed + num_new_tokens == num_tokens + num_spec,
        num_kept_blocks=block_update[0],
        new_block_ids=block_update[1],
        draft=verified,
    )


@dataclass
class StepUpdate:
    """What `update_from_output` did with one step's tokens."""

    advanced: list[Request] = field(default_factory=list)  # got at least one token, in step order
    finished: list[Request] = field(default_factory=list)  # of which now finished (to release)


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledRequest] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    # Requests whose block tables were released since the last step that ran (finished,
    # aborted, preempted, detached): the runner drops their rows before this step's updates.
    freed_request_ids: list[str] = field(default_factory=list)

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
        self.order = RequestOrder(config.scheduling_policy)
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # What the runner's block tables must still hear about: tables released since the last
        # step that ran, and running requests whose table it has never seen (`add_running`).
        self._freed_request_ids: list[str] = []
        self._unsent_tables: set[str] = set()
        # Totals since start, read by the server's /metrics (vLLM's names, without "vllm:").
        self.num_preemptions = 0
        self.num_prefix_cache_queries = 0  # prompt tokens looked up when a request is admitted
        self.num_prefix_cache_hits = 0  # of which found in the prefix cache

    def add_request(self, request: Request) -> None:
        self.order.arrive(request)
        self.order.place(self.waiting, request)

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self, drafts: Mapping[str, DraftTokens] | None = None) -> SchedulerOutput:
        """`drafts[request_id]`: what the draft proposed for a decoding running request."""
        drafts = drafts or {}
        out = SchedulerOutput()
        # The queue's first requests: as many as could take a seat, and one more (so a step that
        # ignores the seats shows it); it ends before a request that waits for its sibling's prompt.
        considered: list[Request] = []
        for request in self.waiting:
            if len(considered) > self.config.max_num_seqs - len(self.running):
                break
            if request.waits_for_prefix and self.block_manager.enable_prefix_caching:
                break  # n > 1: its sibling's prompt blocks are about to be cached
            considered.append(request)
        step = StepInputs(
            running=[self._step_request(r, drafts.get(r.request_id)) for r in self.running],
            waiting=[self._step_request(r) for r in considered],
            max_num_batched_tokens=self.config.max_num_batched_tokens,
            max_num_seqs=self.config.max_num_seqs,
            enable_chunked_prefill=self.config.enable_chunked_prefill,
        )
        pool = _StepPool(self, {r.request_id: r for r in considered}, drafts, out)
        pool.check(schedule_step(step, pool), step)
        if out.scheduled:  # (an empty step runs nothing: the next one carries them)
            out.freed_request_ids, self._freed_request_ids = self._freed_request_ids, []
        return out

    def _step_request(self, request: Request, draft: DraftTokens | None = None) -> StepRequest:
        num_remaining = request.num_tokens - request.num_computed_tokens
        num_spec = 0 if draft is None else len(draft)
        rank = self.order.rank(request) if self.order.by_priority else None
        return StepRequest(request.request_id, num_remaining, num_spec, rank)

    def update_from_output(
        self,
        out: SchedulerOutput,
        sampled: list[list[int]] | None = None,
        logprobs: ModelRunnerOutput | None = None,
    ) -> StepUpdate:
        """The step ran: append its tokens, and its keys/values are in the cache.

        `sampled[i]`: the tokens scheduled request i got (none for a prompt chunk; one; or the
        accepted drafts and one more), appended until the request finishes by its ids.  Drafts
        not appended were computed for nothing: the computed count falls back before them and
        blocks past it are freed.  Then full blocks join the prefix cache.  `sampled=None`: no
        tokens (tests of the scheduler alone).  `logprobs`: the runner's output, if any asked.
        """
        update = StepUpdate()
        for i, s in enumerate(out.scheduled):
            r = s.request
            tokens = sampled[i] if sampled is not None else []
            if logprobs is not None and logprobs.prompt_logprobs[i] is not None:
                found = logprobs.prompt_logprobs[i]
                r.append_prompt_logprobs(found.first_position, found.logprobs)
            num_appended = 0
            for token in tokens:
                r.append_output_token(token)
                num_appended += 1
                if r.finished:
                    break
            if num_appended and logprobs is not None and logprobs.logprobs[i] is not None:
                r.append_logprobs(logprobs.logprobs[i])
            rejected = len(s.spec_token_ids) - max(num_appended - 1, 0) if tokens else 0
            r.num_computed_tokens += s.num_new_tokens - rejected
            self.block_manager.commit(r.request_id, r.all_token_ids, r.num_computed_tokens)
            if rejected:
                self.block_manager.trim(r.request_id, r.num_computed_tokens)
            if tokens:
                update.advanced.append(r)
                if r.finished:
                    update.finished.append(r)
        return update

    def finish(self, request: Request) -> None:
        """Remove a finished or aborted request and free its blocks (now, not later)."""
        if request in self.running:
            self.running.remove(request)
            self._release_table(request.request_id)
        elif request in self.waiting:
            self.waiting.remove(request)
        self.order.leave(request)

    def _release_table(self, request_id: str) -> None:
        self.block_manager.free(request_id)
        self._freed_request_ids.append(request_id)
        self._unsent_tables.discard(request_id)

    # -- KV transfer (distributed/kv_transfer/): requests that move between engines

    def detach(self, request: Request) -> None:
        """Stop scheduling a running request without freeing its blocks: a KV producer
        (disaggregated prefill) copies them out, then calls `block_manager.free`."""
        if request not in self.running:
            raise ValueError(f"request {request.request_id!r} is not running, so it cannot be detached")
        self.running.remove(request)
        self.order.leave(request)
        self._freed_request_ids.append(request.request_id)
        self._unsent_tables.discard(request.request_id)

    def add_running(self, request: Request) -> None:
        """Admit a decoding request whose KV is already in its block table (a KV consumer
        received it): it joins `running`."""
        if len(self.running) >= self.config.max_num_seqs:
            raise ValueError(f"the batch is full ({self.config.max_num_seqs} requests running)")
        request.status = RequestStatus.RUNNING
        self.order.arrive(request)  # ranked by its priority, as a new arrival of this engine
        self.order.place(self.running, request)
        self._unsent_tables.add(request.request_id)  # its first step sends the whole table


class _StepPool:
    """`schedule_step`'s view of the KV cache (`StepPool`): each call is carried out on the
    scheduler's state as it is made, so that `check` can hold the plan against what was done."""

    def __init__(self, scheduler: Scheduler, waiting: dict[str, Request], drafts: Mapping[str, DraftTokens],
                 out: SchedulerOutput):
        self.scheduler = scheduler
        self.manager = scheduler.block_manager
        self.waiting = waiting  # the step's waiting requests by id
        self.drafts = drafts
        self.out = out
        self.hits: dict[str, tuple[list, int]] = {}  # prefix hits looked up this step
        self.running = {r.request_id: r for r in scheduler.running}  # kept as the step goes
        self.scheduled_ids: set[str] = set()

    def _waiting(self, request_id: str) -> Request:
        request = self.waiting.get(request_id)
        if request is None or request.status == RequestStatus.RUNNING:
            what = "preempted earlier in this step (it waits: the pool is short)" if any(
                r.request_id == request_id for r in self.out.preempted) else "not a waiting request of this step"
            raise StepPlanError(f"request {request_id!r} is {what}")
        return request

    def _hit(self, request: Request) -> tuple[list, int]:
        """Its prefix hit (cached blocks, tokens they hold), looked up again if a block of it was
        evicted since; none for a request that wants prompt logprobs (every position computed)."""
        hit = self.hits.get(request.request_id)
        cached = self.manager.block_pool.cached_blocks
        if hit is None or any(cached.get(b.block_hash) is not b for b in hit[0]):
            block_hashes = request.block_hashes.setdefault(self.manager.block_size, [])
            hit = self.manager.get_computed_blocks(request.all_token_ids, block_hashes)
            if request.skip_reading_prefix_cache:
                hit = ([], 0)
            self.hits[request.request_id] = hit
        return hit

    def _schedule(self, request: Request, num_new_tokens: int, num_cached: int,
                  num_held_blocks: int) -> None:
        """Record the request's share; the runner holds its first `num_held_blocks` blocks,
        unless it never saw the table."""
        unsent = self.scheduler._unsent_tables
        if unsent and request.request_id in unsent:
            unsent.discard(request.request_id)
            num_held_blocks = 0
        new_block_ids = self.manager.get_block_table(request.request_id, start=num_held_blocks)
        draft = self.drafts.get(request.request_id)
        block_update = (num_held_blocks, new_block_ids)
        scheduled = schedule_request(request, num_new_tokens, num_cached, draft, block_update)
        self.out.scheduled.append(scheduled)
        self.scheduled_ids.add(request.request_id)

    def num_cached_tokens(self, request_id: str) -> int:
        request = self._waiting(request_id)
        self.hits.pop(request_id, None)
        return self._hit(request)[1]

    def num_new_blocks(self, request_id: str, num_new_tokens: int) -> int:
        request = self.running.get(request_id)
        if request is not None:
            return self.manager.num_blocks_to_allocate(request_id, request.num_computed_tokens, num_new_tokens)
        blocks, num_cached = self._hit(self._waiting(request_id))
        return self.manager.num_blocks_to_allocate(request_id, num_cached, num_new_tokens, blocks)

    def num_free_blocks_for(self, request_id: str) -> int:
        if self.running.get(request_id) is not None:
            return self.manager.num_free_blocks
        return self.manager.num_free_blocks_beside(self._hit(self._waiting(request_id))[0])

    def allocate(self, request_id: str, num_new_tokens: int) -> bool:
        if request_id in self.scheduled_ids:
            raise StepPlanError(f"request {request_id!r} was given tokens twice in one step")
        if not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise StepPlanError(f"request {request_id!r} was allocated {num_new_tokens!r} tokens: a request that runs "
                                f"has no tokens to compute otherwise; allocate at least 1 (and leave out one with 0)")
        request = self.running.get(request_id)
        if request is not None:
            num_spec = len(self.drafts[request_id]) if request_id in self.drafts else 0
            num_remaining = request.num_tokens - request.num_computed_tokens
            most = num_remaining + (num_spec if num_remaining == 1 else 0)
            if num_new_tokens > most:
                raise StepPlanError(f"running request {request_id!r} has {most} tokens to compute, not {num_new_tokens}")
            num_held = self.manager.num_held_blocks(request_id)
            if not self.manager.allocate_slots(request_id, request.num_computed_tokens, num_new_tokens):
                return False
            self._schedule(request, num_new_tokens, 0, num_held)
            return True
        request = self._waiting(request_id)
        scheduler, head = self.scheduler, self.scheduler.waiting[0]
        if head is not request:
            raise StepPlanError(f"request {request_id!r} was started while {head.request_id!r} is the waiting queue's "
                                f"head: fcfs starts requests in queue order")
        blocks, num_cached = self._hit(request)
        if num_new_tokens > request.num_tokens - num_cached:
            raise StepPlanError(f"waiting request {request_id!r} has {request.num_tokens - num_cached} tokens to compute "
                                f"(its prompt less a prefix hit of {num_cached}), not {num_new_tokens}")
        if not self.manager.allocate_slots(request_id, num_cached, num_new_tokens, blocks):
            return False
        # The head starts, its prefix hit already in the cache.
        scheduler.waiting.popleft()
        scheduler.order.place(scheduler.running, request)
        scheduler.num_prefix_cache_queries += request.num_tokens
        scheduler.num_prefix_cache_hits += num_cached
        self.running[request_id] = request
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = num_cached
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_cached
        self._schedule(request, num_new_tokens, num_cached, 0)
        return True

    def preempt(self, request_id: str) -> None:
        request = self.running.get(request_id)
        if request is None:
            raise StepPlanError(f"request {request_id!r} is not running, so it cannot be preempted")
        if request_id in self.scheduled_ids:
            raise StepPlanError(f"request {request_id!r} was preempted after it was scheduled this step (its tokens "
                                f"would be computed into blocks it gave back): a victim is the request that needs "
                                f"room or one after it")
        scheduler = self.scheduler
        scheduler.running.remove(request)
        del self.running[request_id]
        scheduler.num_preemptions += 1
        scheduler._release_table(request_id)
        request.num_computed_tokens = 0
        request.status = RequestStatus.PREEMPTED
        scheduler.order.requeue(scheduler.waiting, request)
        self.out.preempted.append(request)

    def check(self, plan: StepPlan, step: StepInputs) -> None:
        """The plan says what the pool did; the budget and the seats are kept."""
        if not isinstance(getattr(plan, "num_new_tokens", None), dict) or not isinstance(
                getattr(plan, "preempted", None), list):
            raise StepPlanError(f"schedule_step returns a StepPlan (num_new_tokens: dict, preempted: list), "
                                f"got {plan!r:.80}")
        done = [(s.request.request_id, s.num_new_tokens) for s in self.out.scheduled]
        if list(plan.num_new_tokens.items()) != done:
            raise StepPlanError(f"the plan schedules {plan.num_new_tokens} but the pool allocated for {dict(done)} in "
                                f"that order: allocate for each scheduled request exactly its tokens, and list every "
                                f"request you allocated for")
        preempted = [r.request_id for r in self.out.preempted]
        if list(plan.preempted) != preempted:
            raise StepPlanError(f"the plan lists preempted {plan.preempted}, but {preempted} were preempted")
        total = sum(n for _, n in done)
        if total > step.max_num_batched_tokens:
            raise StepPlanError(f"the plan computes {total} tokens ({dict(done)}), but max_num_batched_tokens is "
                                f"{step.max_num_batched_tokens}: the budget is one for the whole step")
        if len(self.scheduler.running) > step.max_num_seqs:
            raise StepPlanError(f"{len(self.scheduler.running)} requests run after the step, but max_num_seqs is "
                                f"{step.max_num_seqs}: a request started with every seat taken")
