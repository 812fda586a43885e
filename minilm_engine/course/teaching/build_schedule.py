"""Chapter 01's scheduler step: the loop that decides who runs, how many tokens, who is preempted.

Contract: the piece `schedule_step(step, pool) -> StepPlan` (`core/schedule_step.py`) is the
engine's whole fcfs scheduling decision.  It is checked alone first, against the package's step
on small states whose every branch is named (running before waiting, chunked prefill on and
off, the budget used up, out of blocks and the newest preempted, a victim that is the request
itself, nobody admitted after a preemption, seats full, a head that cannot start holding the
queue, a prefix hit, drafts cut to fit) and on random states; each on a `CountingPool` (plain
counts of blocks, no sharing) that answers as the engine's pool does.  Then in the engine: the
preemption, admission, chunking, prefix-caching and speculative workloads, the schedule step
for step against the reference scheduler's.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minilm_engine.core.schedule_step import StepInputs, StepPlan, StepPlanError, StepRequest
from minilm_engine.course.teaching.build import BuildFailure, PieceError
from minilm_engine.course.teaching.build_pieces import (
    CHUNK_ARGS,
    PAGED_ARGS,
    _calls,
    _piece,
    _with,
    admit_args,
    get_adapter,
    preempt_args,
)
from minilm_engine.course.teaching.build_runs import (
    BuildSetup,
    first_schedule_difference,
    greedy,
    reference_run,
    require_same_tokens,
    run_engine,
)

Fn = Callable[..., Any]


@dataclass
class Held:
    """A request as the counting pool sees it: tokens in the cache, blocks held; waiting: its
    prefix hit in tokens, and how many of the hit's blocks are free (ref count 0)."""

    num_computed_tokens: int = 0
    num_held_blocks: int = 0
    num_cached_tokens: int = 0
    num_hit_free_blocks: int = 0


@dataclass
class CountingPool:
    """`StepPool` over plain counts (no block is shared, so a victim frees all it holds); it
    raises `StepPlanError` where the engine's pool would."""

    block_size: int
    num_free_blocks: int
    running: dict[str, Held]
    waiting: dict[str, Held]  # queue order
    num_tokens: dict[str, int]  # each request's tokens to compute now (+ drafts), for the range check
    allocated: list[tuple[str, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)

    def _blocks(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _waiting(self, request_id: str) -> Held:
        if request_id in self.preempted:
            raise StepPlanError(f"request {request_id!r} is preempted earlier in this step (it waits: the pool is short)")
        if request_id not in self.waiting:
            raise StepPlanError(f"request {request_id!r} is not a waiting request of this step")
        return self.waiting[request_id]

    def num_cached_tokens(self, request_id: str) -> int:
        return self._waiting(request_id).num_cached_tokens

    def num_new_blocks(self, request_id: str, num_new_tokens: int) -> int:
        if request_id in self.running:
            held = self.running[request_id]
            return max(0, self._blocks(held.num_computed_tokens + num_new_tokens) - held.num_held_blocks)
        held = self._waiting(request_id)
        return self._blocks(held.num_cached_tokens + num_new_tokens) - held.num_cached_tokens // self.block_size

    def num_free_blocks_for(self, request_id: str) -> int:
        if request_id in self.running:
            return self.num_free_blocks
        return self.num_free_blocks - self._waiting(request_id).num_hit_free_blocks

    def allocate(self, request_id: str, num_new_tokens: int) -> bool:
        if any(rid == request_id for rid, _ in self.allocated):
            raise StepPlanError(f"request {request_id!r} was given tokens twice in one step")
        if not isinstance(num_new_tokens, int) or num_new_tokens < 1:
            raise StepPlanError(f"request {request_id!r} was allocated {num_new_tokens!r} tokens: a request that runs "
                                f"has no tokens to compute otherwise; allocate at least 1 (and leave out one with 0)")
        if request_id not in self.running:
            held = self._waiting(request_id)
            head = next(iter(self.waiting))
            if head != request_id:
                raise StepPlanError(f"request {request_id!r} was started while {head!r} is the waiting queue's head: "
                                    f"fcfs starts requests in queue order")
            most = self.num_tokens[request_id] - held.num_cached_tokens
            if num_new_tokens > most:
                raise StepPlanError(f"waiting request {request_id!r} has {most} tokens to compute (its prompt less a "
                                    f"prefix hit of {held.num_cached_tokens}), not {num_new_tokens}")
        elif num_new_tokens > self.num_tokens[request_id]:
            raise StepPlanError(f"running request {request_id!r} has {self.num_tokens[request_id]} tokens to compute, "
                                f"not {num_new_tokens}")
        need = self.num_new_blocks(request_id, num_new_tokens)
        if need > self.num_free_blocks_for(request_id):
            return False
        if request_id in self.running:
            held = self.running[request_id]
            self.num_free_blocks -= need
        else:
            held = self.waiting.pop(request_id)
            self.num_free_blocks -= need + held.num_hit_free_blocks
            held.num_computed_tokens = held.num_cached_tokens
            held.num_held_blocks = held.num_cached_tokens // self.block_size
            self.running[request_id] = held
        held.num_computed_tokens += num_new_tokens
        held.num_held_blocks += need
        self.allocated.append((request_id, num_new_tokens))
        return True

    def preempt(self, request_id: str) -> None:
        if request_id not in self.running:
            raise StepPlanError(f"request {request_id!r} is not running, so it cannot be preempted")
        if any(rid == request_id for rid, _ in self.allocated):
            raise StepPlanError(f"request {request_id!r} was preempted after it was scheduled this step (its tokens "
                                f"would be computed into blocks it gave back): a victim is the request that needs "
                                f"room or one after it")
        self.num_free_blocks += self.running.pop(request_id).num_held_blocks
        self.preempted.append(request_id)


@dataclass(frozen=True)
class Case:
    """A step's state: running (id, tokens to compute, tokens in the cache, blocks held, drafts);
    waiting (id, prompt tokens, prefix hit in tokens, free blocks among the hit's)."""

    running: tuple[tuple[str, int, int, int, int], ...]
    waiting: tuple[tuple[str, int, int, int], ...]
    budget: int
    seats: int
    chunked: bool
    num_free_blocks: int
    block_size: int = 4
    label: str = "a random step"
    why: str = ""

    def inputs(self) -> StepInputs:
        return StepInputs(
            running=[StepRequest(rid, n, spec) for rid, n, _, _, spec in self.running],
            waiting=[StepRequest(rid, n) for rid, n, _, _ in self.waiting],
            max_num_batched_tokens=self.budget,
            max_num_seqs=self.seats,
            enable_chunked_prefill=self.chunked,
        )

    def pool(self) -> CountingPool:
        num_tokens = {rid: n + (spec if n == 1 else 0) for rid, n, _, _, spec in self.running}
        num_tokens.update({rid: n for rid, n, _, _ in self.waiting})
        return CountingPool(
            self.block_size, self.num_free_blocks,
            running={rid: Held(done, held) for rid, _, done, held, _ in self.running},
            waiting={rid: Held(num_cached_tokens=hit, num_hit_free_blocks=free) for rid, _, hit, free in self.waiting},
            num_tokens=num_tokens,
        )

    def describe(self) -> str:
        run = ", ".join(
            f"{rid}: {'1 to decode' if n == 1 else f'{n} prompt tokens to compute'}"
            + (f" + {spec} drafts" if spec else "") + f", {held} blocks held" for rid, n, _, held, spec in self.running)
        wait = ", ".join(f"{rid}: a {n}-token prompt" + (f" ({hit} in the prefix cache)" if hit else "")
                         for rid, n, hit, _ in self.waiting)
        return (f"running [{run}], waiting [{wait}], a {self.budget}-token budget, {self.seats} seats, chunked prefill "
                f"{'on' if self.chunked else 'off'}, {self.num_free_blocks} free blocks of {self.block_size} tokens")


def _run_plan(fn: Fn, case: Case) -> tuple[list[tuple[str, int]], list[str]]:
    """`fn`'s plan on a fresh pool, held against what the pool did (as the engine's scheduler does)."""
    pool = case.pool()
    plan = fn(case.inputs(), pool)
    got = list(plan.num_new_tokens.items())
    if got != pool.allocated:
        raise StepPlanError(f"the plan schedules {dict(got)} but the pool allocated for {dict(pool.allocated)} in that "
                            f"order: allocate for each scheduled request exactly its tokens, and list every request "
                            f"you allocated for")
    if list(plan.preempted) != pool.preempted:
        raise StepPlanError(f"the plan lists preempted {plan.preempted}, but {pool.preempted} were preempted")
    total = sum(n for _, n in got)
    if total > case.budget:
        raise StepPlanError(f"the plan computes {total} tokens, but the budget is {case.budget}: the budget is one for "
                            f"the whole step")
    if len(pool.running) > case.seats:
        raise StepPlanError(f"{len(pool.running)} requests run after the step, but there are {case.seats} seats: a "
                            f"request started with every seat taken")
    return got, list(plan.preempted)


def _r(rid: str, n: int, done: int, held: int, spec: int = 0) -> tuple[str, int, int, int, int]:
    return (rid, n, done, held, spec)


# Decodes whose next token starts a new block (4 tokens in the cache, 1 block held).
def _decode(rid: str, spec: int = 0) -> tuple[str, int, int, int, int]:
    return _r(rid, 1, 4, 1, spec)


NAMED_CASES = [
    Case((_decode("A"), _decode("B"), _decode("C")), (), 2, 4, True, 10, label="the budget used up",
         why="the budget is one for the whole step: once it is spent, everyone after waits (C runs nothing)"),
    Case((_r("A", 10, 0, 0), _decode("B")), (), 8, 4, True, 10, label="chunked prefill on",
         why="with chunking on, a prompt that does not fit takes what is left of the budget and comes back next step"),
    Case((_r("A", 10, 0, 0), _decode("B")), (), 8, 4, False, 10, label="chunked prefill off",
         why="with chunking off, a prompt that does not fit whole runs nothing this step (it waits for a step "
             "with room); the requests after it still get their tokens"),
    Case((_decode("A"),), (("B", 8, 0, 0),), 8, 4, True, 10, label="running before waiting",
         why="running requests get their tokens first (a decode is one token of a request already paid for); the "
             "queue gets what the budget has left, so B starts with a 7-token chunk"),
    Case((_r("A", 8, 0, 0),), (("B", 3, 0, 0),), 8, 4, True, 10, label="a prompt that fills the budget exactly",
         why="A's 8 tokens fit the 8-token budget exactly: all run now, and nothing is left for B"),
    Case((_decode("A"), _decode("B"), _r("C", 1, 8, 2)), (), 8, 4, True, 1, label="out of blocks",
         why="A takes the last free block; B needs one more: preempt the newest running request, C, which gives "
             "its 2 blocks back and waits; then B fits (the oldest requests always make progress)"),
    Case((_decode("A"), _decode("B")), (), 8, 4, True, 1, label="the victim is the request itself",
         why="B needs a block and is the newest: it is preempted itself and waits (nothing after it to preempt)"),
    Case((_decode("A"), _decode("B"), _r("C", 1, 8, 2)), (("D", 3, 0, 0),), 8, 4, True, 1,
         label="nobody admitted after a preemption",
         why="the pool was short this step: the blocks C gave back are what C needs to come back; starting D would "
             "only push someone out again next step (thrashing)"),
    Case((_decode("A"), _decode("B")), (("C", 3, 0, 0), ("D", 3, 0, 0)), 16, 3, True, 10, label="seats full",
         why="3 seats: C takes the last one, D waits although budget and blocks are there"),
    Case((_decode("A"),), (("B", 20, 0, 0), ("C", 3, 0, 0)), 8, 4, False, 10,
         label="a head that cannot start holds the queue",
         why="without chunking B's 20-token prompt does not fit; C must not overtake it: under steady traffic of "
             "short prompts B would never start (starvation)"),
    Case((), (("B", 12, 8, 0),), 16, 4, True, 10, label="a prefix hit",
         why="8 of B's 12 prompt tokens are in the prefix cache (pool.num_cached_tokens): only 4 are computed"),
    Case((), (("B", 12, 8, 2), ("C", 4, 0, 0)), 16, 4, True, 2, label="a prefix hit on free blocks",
         why="B's hit is on 2 free blocks, which it takes out of the free queue: none is left for its 1 new "
             "block, so B waits (pool.num_free_blocks_for), and C waits behind it"),
    Case((_decode("A", spec=3), _decode("B")), (), 3, 4, False, 10, label="a decode's drafts cut to fit",
         why="drafts are guesses: a decode verifies as many as the budget has room for (A: 1 + 2), chunking or "
             "not; B's decode then has no budget left"),
]


def random_cases(num_cases: int, seed: int = 0) -> list[Case]:
    """Small random states: decodes and prompts (some with drafts), a queue with prefix hits,
    tight or roomy budgets, pools and seats, chunking on or off."""
    rng = random.Random(seed)
    cases = []
    for _ in range(num_cases):
        bs = rng.choice((1, 2, 4))
        running = []
        for i in range(rng.randint(0, 4)):
            if rng.random() < 0.6:
                done = rng.randint(1, 12)
                running.append(_r(f"r{i}", 1, done, -(-done // bs), rng.choice((0, 0, 2, 3))))
            else:
                done = rng.choice((0, 0, 4, 8))
                running.append(_r(f"r{i}", rng.randint(1, 14), done, -(-done // bs)))
        waiting = []
        for i in range(rng.randint(0, 4)):
            n = rng.randint(1, 14)
            hit = rng.choice((0, 0, (n - 1) // bs * bs))
            waiting.append((f"w{i}", n, hit, rng.randint(0, hit // bs)))
        cases.append(Case(tuple(running), tuple(waiting), rng.choice((2, 4, 8, 12, 24)), rng.randint(max(1, len(running)), 5),
                          rng.random() < 0.5, rng.randint(0, 8), bs))
    return cases


def check_schedule_step_alone(call: Fn, num_random: int = 300) -> str:
    from minilm_engine import pluggable

    reference = pluggable.default("scheduler.schedule_step")
    for case in NAMED_CASES + random_cases(num_random):
        where = f"alone, {case.label} ({case.describe()})"
        want = _run_plan(reference, case)
        try:
            got = _run_plan(call, case)
        except StepPlanError as e:
            raise BuildFailure(f"{where}: {e}" + (f" ({case.why})" if case.why else "")) from None
        if got == want:
            continue
        (got_tokens, got_pre), (want_tokens, want_pre) = (dict(got[0]), got[1]), (dict(want[0]), want[1])
        raise BuildFailure(
            f"{where}: your step runs {got_tokens or 'nobody'}" + (f", preempts {got_pre}" if got_pre else "")
            + f"; the reference runs {want_tokens or 'nobody'}" + (f", preempts {want_pre}" if want_pre else "")
            + (f": {case.why}" if case.why else _random_why(got, want, case))
        )
    return (f"alone: {len(NAMED_CASES)} named steps (running first, chunking on and off, the budget used up, "
            f"out of blocks, seats full, a head holding the queue, prefix hits, drafts) and {num_random} random ones match")


def _random_why(got: tuple[list[tuple[str, int]], list[str]], want: tuple[list[tuple[str, int]], list[str]],
                case: Case) -> str:
    """The first decision that differs, in words."""
    (got_tokens, got_pre), (want_tokens, want_pre) = (dict(got[0]), got[1]), (dict(want[0]), want[1])
    if got_pre != want_pre:
        return (" (preempt only when a running request's blocks do not fit, and then the newest among it and "
                "those after it)")
    for rid in [*want_tokens, *got_tokens]:
        if got_tokens.get(rid) != want_tokens.get(rid):
            kind = "waiting" if any(rid == w[0] for w in case.waiting) else "running"
            return f" ({kind} request {rid!r} is the first that differs: {got_tokens.get(rid, 0)} tokens, expected {want_tokens.get(rid, 0)})"
    return " (the same tokens in a different order: running requests in arrival order, then the queue head first)"


def _adapt_schedule_step(fn: Fn) -> Fn:
    def call(step: StepInputs, pool: Any) -> StepPlan:
        plan = fn(step, pool)
        if not isinstance(plan, StepPlan):
            raise PieceError(f"return a StepPlan (num_new_tokens: request id -> tokens, preempted: ids), got {plan!r:.80}")
        return plan

    return call


def _spec_args(setup: BuildSetup) -> dict[str, Any]:
    return {**CHUNK_ARGS, "max_num_batched_tokens": 6,
            "speculative_config": {"model": setup.draft_model, "num_speculative_tokens": 3}}


def _check_schedule_step(fn: Fn, setup: BuildSetup) -> list[str]:
    details = [check_schedule_step_alone(get_adapter("scheduler.schedule_step")(fn))]
    roomy, tight = admit_args(setup)
    runs = [("preemption (a pool that holds the longest request, not them all)", preempt_args(setup), 1),
            (f"admission ({roomy['max_num_seqs']} seats, chunked prefill off)", roomy, 1),
            (f"admission with a pool of {tight['num_kv_blocks']} blocks", tight, 1),
            ("chunked prefill (an 8-token budget)", CHUNK_ARGS, 1),
            ("prefix caching, two waves of shared prompts", PAGED_ARGS, 2),
            ("speculative decoding, a 6-token budget", _spec_args(setup), 1)]
    for label, args, waves in runs:
        want = reference_run(setup, args, waves=waves)
        try:
            got = _with("scheduler.schedule_step", fn, lambda args=args, waves=waves, want=want: run_engine(
                setup, args, waves=waves, params=greedy(setup), max_steps=4 * want.num_steps + 20))
        except StepPlanError as e:
            raise BuildFailure(f"in the engine, {label}: {e}") from None
        diff = first_schedule_difference(got, want)
        if diff is not None:
            raise BuildFailure(f"in the engine, {label}: the schedule differs from the reference scheduler's: {diff}")
        details.append(f"{label}: {got.num_steps} steps, the same schedule as the reference, "
                       f"{sum(map(len, got.preempted))} preemptions; " + require_same_tokens(got, want, setup))
    return [*details, _calls("scheduler.schedule_step")]


_piece(
    name="schedule_step",
    registry_name="scheduler.schedule_step",
    chapter="01",
    signature=(
        "def schedule_step(step, pool) -> StepPlan\n"
        "  step: StepInputs(running, waiting, max_num_batched_tokens, max_num_seqs, enable_chunked_prefill);\n"
        "  running (arrival order) and waiting (queue order) are StepRequest(request_id, num_remaining_tokens,\n"
        "  num_spec_tokens). pool: num_cached_tokens(id), num_new_blocks(id, n), num_free_blocks_for(id),\n"
        "  allocate(id, n) -> bool (False: too few blocks, nothing changed), preempt(id).\n"
        "  Return StepPlan(num_new_tokens={id: n, ...} in the order scheduled, preempted=[id, ...])"
    ),
    hint=(
        "who has already paid for their place in the batch, and who is still outside? One budget covers the "
        "whole step. When memory runs out, somebody must give theirs back so the oldest keep moving; and a "
        "queue whose head cannot start must not let anybody overtake it. Your admits, preemption_victim and "
        "num_tokens_this_step are the three decisions inside this loop."
    ),
    adapt=_adapt_schedule_step,
    run_check=_check_schedule_step,
    solutions="01_batching_solutions.ipynb",
)
