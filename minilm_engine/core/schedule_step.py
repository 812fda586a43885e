"""One step's schedule as plain data: who runs, how many tokens each, who is preempted.

Contract: `schedule_step(step, pool) -> StepPlan` decides one step from plain data
(`StepInputs`: the running requests, the waiting queue head first, each with its tokens still to
compute; the token budget; the seats) and a narrow view of the KV cache (`StepPool`: look a
prompt up in the prefix cache, count blocks, allocate, preempt).  The `Scheduler` calls it every
step, carries each call out as it is made, and checks the returned plan against what was done.
Its decisions, in vLLM v1's order:

    1. running requests first, in arrival order, each taking what the token budget has left
       (`num_tokens_this_step`: a prompt that does not fit is chunked, or waits without chunked
       prefill; a decode's drafts are cut to fit);
    2. a running request whose blocks the pool cannot give makes room: a victim among it and
       those after it (`preemption_victim`: the newest) gives its blocks back and waits; if the
       victim is the request itself, it waits;
    3. then the waiting queue, head first: the head starts if `admits` says so (a seat, tokens,
       blocks, nobody preempted this step); the first that cannot start holds everyone behind it.

Under "priority" every request carries its `rank` and both lists come in rank order: a waiting
head that outranks a running request starts before it (`goes_before`), and a full batch gives
its last-ranked seat to a head that outranks it.  The three decisions are chapters 01 and 04's
seams; this loop around them is chapter 01's (fcfs) build (`course/teaching/build_schedule.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from minilm_engine.pluggable import replaceable


@dataclass(frozen=True)
class StepRequest:
    """One request as the step sees it."""

    request_id: str
    # Tokens not in the cache yet: a running request's prompt (or the rest of it, or all of it
    # again after a preemption), or 1 to decode; a waiting request's whole prompt (its prefix
    # hit is the pool's to look up).
    num_remaining_tokens: int
    num_spec_tokens: int = 0  # drafts to verify after a decode's token: as many as fit run
    # "priority" only: (priority, arrival), lower first; None under fcfs.
    rank: tuple[int, int] | None = None


@dataclass(frozen=True)
class StepInputs:
    running: list[StepRequest]  # in arrival (or rank) order
    waiting: list[StepRequest]  # the queue, head first (it ends before a request that must wait)
    max_num_batched_tokens: int  # the step's token budget, shared by everyone it computes
    max_num_seqs: int  # seats: requests running at once
    enable_chunked_prefill: bool


@dataclass
class StepPlan:
    """`num_new_tokens`: request id -> tokens it computes this step, in the order scheduled;
    `preempted`: the ids of the requests preempted, in order."""

    num_new_tokens: dict[str, int] = field(default_factory=dict)
    preempted: list[str] = field(default_factory=list)


class StepPlanError(RuntimeError):
    """A plan the `Scheduler` cannot carry out, or that disagrees with what the pool did."""


class StepPool(Protocol):
    """What a step may ask of the KV cache (the `Scheduler` answers from its block manager)."""

    def num_cached_tokens(self, request_id: str) -> int:
        """A waiting request's prompt tokens already in the prefix cache (looked up now)."""
        ...

    def num_new_blocks(self, request_id: str, num_new_tokens: int) -> int:
        """Blocks its next `num_new_tokens` tokens need beyond those it holds (or its hit)."""
        ...

    def num_free_blocks_for(self, request_id: str) -> int:
        """Blocks the pool can give the request now (less a waiting request's hit on free ones)."""
        ...

    def allocate(self, request_id: str, num_new_tokens: int) -> bool:
        """Room for the request's next `num_new_tokens` tokens: True, and the blocks are its (a
        waiting request starts: it runs from now on); False, and nothing changed (too few)."""
        ...

    def preempt(self, request_id: str) -> None:
        """A running request gives its blocks back and waits (to be recomputed later)."""
        ...


@replaceable("scheduler.preemption_victim")
def preemption_victim(candidates: Sequence[StepRequest]) -> StepRequest:
    """Out of blocks: who gives up theirs.  `candidates` are the running request that needs
    room and those after it; the ones before have had their turn this step.  The last one, the
    newest: the oldest requests always make progress, and the newest has the least to recompute."""
    return candidates[-1]


@dataclass(frozen=True)
class AdmissionState:
    """What the waiting queue's head asks for, and what the step has left, when it is reached."""

    num_running: int  # requests in the batch now
    max_num_seqs: int  # the batch's seats
    num_new_tokens: int  # its tokens that this step's token budget leaves room for (0: none)
    num_new_blocks: int  # KV blocks those tokens need, beyond its prefix-cache hit
    num_free_blocks: int  # blocks the pool can hand out now (its hit's free blocks taken)
    num_preempted: int  # requests preempted earlier in this step (the pool was short)


@replaceable("scheduler.admits")
def admits(state: AdmissionState) -> bool:
    """Whether the waiting queue's head starts this step: a seat, tokens in the budget, blocks
    for them, and no preemption this step (the pool is short: a newcomer would only push a
    running request out again, thrashing).  A head that cannot start holds the queue."""
    return (
        state.num_preempted == 0
        and state.num_running < state.max_num_seqs
        and state.num_new_tokens > 0
        and state.num_new_blocks <= state.num_free_blocks
    )


@replaceable("scheduler.num_tokens_this_step")
def num_tokens_this_step(
    num_remaining_tokens: int, num_scheduled_tokens: int, max_num_batched_tokens: int, enable_chunked_prefill: bool
) -> int:
    """How many of a request's `num_remaining_tokens` uncomputed tokens run this step, when the
    requests scheduled before it in this step already take `num_scheduled_tokens` of the
    `max_num_batched_tokens` budget: all of them if they fit; else, with chunked prefill, a chunk
    that fills the rest of the budget; without it, none (the prompt waits for a step with room)."""
    budget = max_num_batched_tokens - num_scheduled_tokens
    if num_remaining_tokens <= budget:
        return num_remaining_tokens
    return budget if enable_chunked_prefill else 0


def num_tokens_to_compute(request: StepRequest, num_scheduled_tokens: int, step: StepInputs) -> int:
    """A running request's tokens this step: a decode with drafts takes as many as fit."""
    if request.num_remaining_tokens == 1 and request.num_spec_tokens:
        return min(1 + request.num_spec_tokens, step.max_num_batched_tokens - num_scheduled_tokens)
    return num_tokens_this_step(
        request.num_remaining_tokens, num_scheduled_tokens, step.max_num_batched_tokens, step.enable_chunked_prefill
    )


def goes_before(a: StepRequest, b: StepRequest) -> bool:
    """Whether waiting `a` takes its share of the step before running `b`: under priority when it
    ranks first; under fcfs (no ranks) never."""
    return a.rank is not None and b.rank is not None and a.rank < b.rank


@replaceable("scheduler.schedule_step")
def schedule_step(step: StepInputs, pool: StepPool) -> StepPlan:
    """The step's schedule (module docstring: 1, 2, 3)."""
    plan = StepPlan()
    running = list(step.running)  # who holds blocks now; victims leave, admissions join
    waiting = list(step.waiting)  # emptied when its head cannot start
    num_scheduled = 0
    i = 0  # running[:i] have had their turn

    def preempt(victim: StepRequest) -> None:
        running.remove(victim)
        pool.preempt(victim.request_id)
        plan.preempted.append(victim.request_id)

    while num_scheduled < step.max_num_batched_tokens:
        request = running[i] if i < len(running) else None
        if waiting and (request is None or goes_before(waiting[0], request)):
            # 3. The queue's head: after every running request (fcfs), or at its rank (priority).
            head = waiting[0]
            num_preempted = len(plan.preempted)
            if request is not None and not num_preempted and len(running) >= step.max_num_seqs \
                    and goes_before(head, running[-1]):
                preempt(running[-1])  # priority: the last-ranked gives up its seat
            num_cached = pool.num_cached_tokens(head.request_id)
            num_new = num_tokens_this_step(
                head.num_remaining_tokens - num_cached, num_scheduled, step.max_num_batched_tokens,
                step.enable_chunked_prefill,
            )
            state = AdmissionState(
                num_running=len(running),
                max_num_seqs=step.max_num_seqs,
                num_new_tokens=num_new,
                num_new_blocks=pool.num_new_blocks(head.request_id, num_new),
                num_free_blocks=pool.num_free_blocks_for(head.request_id),
                num_preempted=num_preempted,
            )
            if not admits(state):
                waiting.clear()  # the head holds the queue
                continue
            if num_new == 0:
                raise RuntimeError(f"{head.request_id!r} admitted with no tokens to compute: "
                                   f"{state}")
            if not pool.allocate(head.request_id, num_new):
                raise RuntimeError(f"{head.request_id!r} admitted, but the pool cannot hold it: "
                                   f"{state}")
            waiting.pop(0)
            running.insert(i, head)
            request = head
        elif request is not None:
            # 1. A running request: its share of what the budget has left.
            num_new = num_tokens_to_compute(request, num_scheduled, step)
            if num_new == 0:
                i += 1
                continue
            # 2. Out of blocks: preempt until it fits, or until it was the victim itself.
            victim = None
            while victim is not request and not pool.allocate(request.request_id, num_new):
                victim = preemption_victim(running[i:])
                preempt(victim)
            if victim is request:
                continue  # it waits now; running[i] is the one after it
        else:
            break
        plan.num_new_tokens[request.request_id] = num_new
        num_scheduled += num_new
        i += 1
    return plan
