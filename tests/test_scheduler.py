"""Tests for minilm_engine.core.scheduler: who runs in each step, with a real block manager.

No model here: a "step" is `schedule()`, then `update_from_output()`, then a made-up token for
every request whose known tokens are all computed (what the model runner would sample).  The
unit tests pin one rule each; the state machine at the end drives random arrivals, aborts and
tiny pools, checks the bookkeeping after every move, checks that a fake KV cache (each slot
holding the tokens its key/value would depend on) is never read wrong, and checks that every
request finishes within a proven number of steps.
"""

from __future__ import annotations

import itertools
import random

import torch
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from minilm_engine.core.config import EngineConfig
from minilm_engine.core.scheduler import Scheduler, SchedulerOutput
from minilm_engine.core.kv_cache_manager import BlockManager, cdiv
from minilm_engine.core.block_pool import BlockPool
from minilm_engine.core.request import Request, RequestStatus
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.outputs import DraftTokens


def make_scheduler(num_blocks: int, block_size: int = 4, **config) -> Scheduler:
    config = EngineConfig(block_size=block_size, num_kv_blocks=num_blocks, **config)
    pool = BlockPool(num_blocks, enable_caching=config.enable_prefix_caching)
    return Scheduler(config, BlockManager(pool, block_size, config.enable_prefix_caching))


def make_request(
    request_id: str, prompt, max_tokens: int = 4, max_model_len: int = 64, eos=(), priority: int = 0
) -> Request:
    return Request(
        request_id=request_id,
        prompt=None,
        prompt_token_ids=list(prompt),
        sampling_params=SamplingParams(temperature=0, max_tokens=max_tokens),
        eos_token_ids=tuple(eos),
        max_model_len=max_model_len,
        priority=priority,
    )


def run_step(scheduler: Scheduler, tokens=None) -> SchedulerOutput:
    """One engine step without a model: sampled tokens come from `tokens` (default 100, 101...)."""
    tokens = tokens if tokens is not None else itertools.count(100)
    out = scheduler.schedule()
    # Decided before update_from_output, as the model runner does.
    sampling = [s.request for s in out.scheduled if s.samples_token]
    scheduler.update_from_output(out)
    for request in sampling:
        request.append_output_token(next(tokens))
        if request.finished:
            scheduler.finish(request)
    return out


def num_new(out: SchedulerOutput) -> dict[str, int]:
    return {s.request.request_id: s.num_new_tokens for s in out.scheduled}


def table_ids(scheduler: Scheduler, request: Request) -> list[int]:
    return scheduler.block_manager.get_block_table(request.request_id)


# ---------------------------------------------------------------------- limits of one step
def test_token_budget_and_max_num_seqs_are_never_exceeded():
    rng = random.Random(0)
    scheduler = make_scheduler(num_blocks=64, max_num_batched_tokens=10, max_num_seqs=3)
    requests = [
        make_request(str(i), range(1, rng.randint(2, 30)), max_tokens=rng.randint(1, 6))
        for i in range(8)
    ]
    for r in requests:
        scheduler.add_request(r)
    budget_used = []
    for _ in range(200):
        if not scheduler.has_unfinished_requests():
            break
        out = run_step(scheduler)
        assert sum(num_new(out).values()) <= 10
        assert len(out.scheduled) <= 3 and len(scheduler.running) <= 3
        assert all(s.num_new_tokens >= 1 for s in out.scheduled)
        assert out.num_prefill_tokens + out.num_decode_tokens == sum(num_new(out).values())
        budget_used.append(sum(num_new(out).values()))
    assert all(r.finished for r in requests)
    assert 10 in budget_used  # the budget was the binding limit at least once
    assert scheduler.block_manager.block_pool.num_used_blocks == 0


def test_running_requests_are_scheduled_before_waiting_ones():
    scheduler = make_scheduler(num_blocks=16, max_num_batched_tokens=5)
    a = make_request("a", [1, 2, 3])
    scheduler.add_request(a)
    run_step(scheduler)  # a's prompt; a now decodes one token per step
    b = make_request("b", range(10, 20))
    scheduler.add_request(b)
    out = scheduler.schedule()
    # a's decode token is taken from the budget first; b gets what is left, as a chunk.
    assert [s.request for s in out.scheduled] == [a, b]
    assert num_new(out) == {"a": 1, "b": 4}
    assert [s.is_prefill for s in out.scheduled] == [False, True]
    assert (out.num_decode_tokens, out.num_prefill_tokens) == (1, 4)
    assert [s.samples_token for s in out.scheduled] == [True, False]
    # Decided once, in schedule(): the step running does not change what it was.
    scheduler.update_from_output(out)
    assert [s.is_prefill for s in out.scheduled] == [False, True]
    assert [s.samples_token for s in out.scheduled] == [True, False]
    assert [s.num_computed_tokens for s in out.scheduled] == [3, 0]


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    scheduler = make_scheduler(num_blocks=16, max_num_batched_tokens=10)
    r = make_request("r", range(1, 26), max_tokens=2)  # 25 prompt tokens
    scheduler.add_request(r)
    chunks, sampled_after = [], []
    while not r.finished:
        out = run_step(scheduler)
        chunks.append(num_new(out)["r"])
        sampled_after.append(len(r.output_token_ids))
    assert chunks == [10, 10, 5, 1]  # three prompt chunks, then one decode
    assert sampled_after == [0, 0, 1, 2]  # nothing is sampled before the prompt is complete


def test_without_chunked_prefill_a_prompt_waits_for_room():
    scheduler = make_scheduler(
        num_blocks=16, max_num_batched_tokens=10, enable_chunked_prefill=False
    )
    a = make_request("a", [1, 2, 3], max_tokens=3)
    scheduler.add_request(a)
    run_step(scheduler)
    b = make_request("b", range(10, 20))  # 10 tokens: the whole budget
    scheduler.add_request(b)
    out = run_step(scheduler)
    # a's decode took one token, 9 are left: b may not be cut, so it waits, holding nothing.
    assert num_new(out) == {"a": 1}
    assert list(scheduler.waiting) == [b] and b.num_computed_tokens == 0
    assert "b" not in scheduler.block_manager.block_tables
    run_step(scheduler)  # a's last token: a finishes
    assert a.finished
    out = run_step(scheduler)
    assert num_new(out) == {"b": 10}


# ---------------------------------------------------------------------- preemption
def test_preemption_takes_the_newest_running_request_and_requeues_it_first():
    # 4 blocks of 2 tokens; max_num_seqs=2 keeps c waiting behind a and b.
    scheduler = make_scheduler(
        num_blocks=4, block_size=2, max_num_seqs=2, enable_prefix_caching=False
    )
    pool = scheduler.block_manager.block_pool
    a, b, c = (
        make_request(n, p, max_tokens=5)
        for n, p in [("a", [1, 2, 3]), ("b", [4, 5, 6]), ("c", [7, 8])]
    )
    for r in (a, b, c):
        scheduler.add_request(r)
    assert num_new(run_step(scheduler)) == {"a": 3, "b": 3}  # 2 blocks each: the pool is full
    assert num_new(run_step(scheduler)) == {"a": 1, "b": 1}  # position 3 fits the second blocks
    assert pool.num_free_blocks == 0
    a_blocks = table_ids(scheduler, a)
    out = run_step(scheduler)  # position 4 needs a fifth block: someone must go
    assert out.preempted == [b]
    assert num_new(out) == {"a": 1}  # and c is not admitted into a step that is short of memory
    assert list(scheduler.waiting) == [b, c] and scheduler.running == [a]
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0
    assert "b" not in scheduler.block_manager.block_tables
    assert table_ids(scheduler, a)[:2] == a_blocks and pool.num_used_blocks == 3
    assert len(b.output_token_ids) == 2  # its outputs are kept, to be recomputed
    # Run to the end: b recomputes prompt + its 2 outputs in one step, then continues.
    recompute_steps = []
    for _ in range(50):
        if not scheduler.has_unfinished_requests():
            break
        out = run_step(scheduler)
        if "b" in num_new(out) and num_new(out)["b"] > 1:
            recompute_steps.append(num_new(out)["b"])
    assert recompute_steps == [5]
    assert all(len(r.output_token_ids) == 5 for r in (a, b, c))
    assert pool.num_used_blocks == 0
    pool.check_invariants()


def test_preemption_stops_as_soon_as_the_old_request_fits():
    # Three running requests; a needs one more block; preempting c (the newest) is enough.
    scheduler = make_scheduler(num_blocks=6, block_size=2, enable_prefix_caching=False)
    a = make_request("a", [1, 2, 3, 4], max_tokens=6)
    b = make_request("b", [5, 6, 7], max_tokens=2)
    c = make_request("c", [8, 9, 10], max_tokens=2)
    for r in (a, b, c):
        scheduler.add_request(r)
    run_step(scheduler)  # a: 2 blocks, b: 2, c: 2 -> full
    out = run_step(scheduler)  # a's position 4 needs a new block
    assert out.preempted == [c]
    assert [s.request for s in out.scheduled] == [a, b]
    assert list(scheduler.waiting) == [c]


# ---------------------------------------------------------------------- prefix caching
def test_prefix_hit_sets_num_computed_tokens():
    scheduler = make_scheduler(num_blocks=16, block_size=4)
    manager = scheduler.block_manager
    a = make_request("a", range(1, 10), max_tokens=8)  # 9 tokens: 2 full blocks once computed
    scheduler.add_request(a)
    run_step(scheduler)
    a_blocks = table_ids(scheduler, a)

    b = make_request("b", [*range(1, 9), 50, 51])  # shares a's two full blocks
    c = make_request("c", range(1, 9))  # all 8 tokens cached, but one must be computed
    d = make_request("d", [99, *range(2, 9)])  # first block differs: the chain misses at once
    for r in (b, c, d):
        scheduler.add_request(r)
    out = scheduler.schedule()
    by_id = {s.request.request_id: s for s in out.scheduled}
    assert (by_id["b"].num_cached_tokens, by_id["b"].num_new_tokens, b.num_computed_tokens) == (
        8,
        2,
        8,
    )
    assert (by_id["c"].num_cached_tokens, by_id["c"].num_new_tokens, c.num_computed_tokens) == (
        4,
        4,
        4,
    )
    assert (by_id["d"].num_cached_tokens, by_id["d"].num_new_tokens, d.num_computed_tokens) == (
        0,
        8,
        0,
    )
    assert table_ids(scheduler, b)[:2] == a_blocks[:2]
    assert table_ids(scheduler, c)[:1] == a_blocks[:1]
    assert manager.block_pool.blocks[a_blocks[0]].ref_cnt == 3  # a, b and c
    # The slots b computes start right after the shared blocks.
    assert manager.slot_mapping("b", 8, 10)[0] // 4 not in a_blocks


def test_no_prefix_hit_when_caching_is_off():
    scheduler = make_scheduler(num_blocks=16, block_size=4, enable_prefix_caching=False)
    a, b = make_request("a", range(1, 10)), make_request("b", range(1, 10))
    scheduler.add_request(a)
    run_step(scheduler)
    scheduler.add_request(b)
    out = scheduler.schedule()
    assert [(s.request, s.num_cached_tokens) for s in out.scheduled] == [(a, 0), (b, 0)]
    assert num_new(out)["b"] == 9


def test_finish_frees_blocks_of_running_and_dequeues_waiting():
    scheduler = make_scheduler(num_blocks=8, block_size=4, max_num_seqs=1)
    a, b = make_request("a", range(1, 7)), make_request("b", range(1, 3))
    scheduler.add_request(a)
    scheduler.add_request(b)
    run_step(scheduler)
    assert scheduler.block_manager.block_pool.num_used_blocks == 2
    scheduler.finish(a)
    scheduler.finish(b)
    assert not scheduler.has_unfinished_requests()
    assert scheduler.block_manager.block_pool.num_used_blocks == 0


# ---------------------------------------------------------------------- random programs
VOCAB = 6  # few distinct tokens, so that prompts often share prefixes
EOS = VOCAB - 1
PREFIXES = [(), (1, 2, 3, 4), (1, 2, 3, 4, 2, 2, 1, 3), (3, 1)]


class SchedulerMachine(RuleBasedStateMachine):
    """Random arrivals, steps and aborts against one scheduler with a tiny pool.

    Alongside the real bookkeeping we keep a fake KV cache: `kv[slot]` is the tuple of tokens
    whose key/value the slot would hold (a token's K/V depends on every token up to it).  A step
    "writes" its tokens and "reads" every position of its context, so handing out a wrong
    prefix block, or reusing a block someone still reads, shows up as a wrong tuple.
    """

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 10),
        budget=st.integers(1, 12),
        max_num_seqs=st.integers(1, 4),
        chunked=st.booleans(),
        caching=st.booleans(),
    )
    def setup(self, block_size, num_blocks, budget, max_num_seqs, chunked, caching, policy="fcfs"):
        # Every request fits the whole pool alone (the engine refuses the others), and without
        # chunked prefill every sequence fits one step's budget (the engine insists on that).
        self.max_model_len = min(num_blocks * block_size, 20)
        if not chunked:
            budget = max(budget, self.max_model_len)
        self.scheduler = make_scheduler(
            num_blocks,
            block_size,
            max_num_batched_tokens=budget,
            max_num_seqs=max_num_seqs,
            enable_chunked_prefill=chunked,
            enable_prefix_caching=caching,
            scheduling_policy=policy,
        )
        self.pool = self.scheduler.block_manager.block_pool
        self.kv: list[tuple | None] = [None] * (num_blocks * block_size)
        self.requests: list[Request] = []  # in arrival order
        self.aborted: set[str] = set()
        self.num_steps = 0

    # -- moves ------------------------------------------------------------------------------
    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, VOCAB - 1), max_size=10),
        max_tokens=st.integers(1, 12),
        copies=st.integers(1, 3),
    )
    def add_request(self, prefix, suffix, max_tokens, copies=1, priority=0):
        # Copies arrive together: identical prompts computing the same blocks in one step.
        prompt = (list(prefix) + suffix)[: self.max_model_len - 1] or [1]
        for _ in range(copies):
            r = make_request(
                str(len(self.requests)), prompt, max_tokens, self.max_model_len, eos=(EOS,),
                priority=priority,
            )
            worst_case = cdiv(
                r.num_prompt_tokens + r.max_new_tokens, self.scheduler.config.block_size
            )
            assert worst_case <= self.pool.num_blocks  # what the engine checks at the door
            self.requests.append(r)
            self.scheduler.add_request(r)

    @rule(seed=st.integers(0, 2**16))
    def step(self, seed):
        out = self.one_step(random.Random(seed))
        # Coverage report for `pytest --hypothesis-show-statistics`.
        if out.preempted:
            event("a step preempted")
        if any(x.num_cached_tokens for x in out.scheduled):
            event("a step had a prefix hit")
        if any(not x.samples_token for x in out.scheduled):
            event("a step ran a partial prompt chunk")

    @rule(index=st.integers(0, 100))
    def abort(self, index):
        alive = [r for r in self.requests if not r.finished]
        if not alive:
            return
        r = alive[index % len(alive)]
        self.scheduler.finish(r)
        r.abort()
        self.aborted.add(r.request_id)

    def one_step(self, rng: random.Random) -> SchedulerOutput:
        s = self.scheduler
        config, manager = s.config, s.block_manager
        waiting_before = {r.request_id for r in s.waiting}
        out = s.schedule()
        self.check_schedule(out, waiting_before)
        if s.has_unfinished_requests():
            assert not out.is_empty, "no progress although requests are waiting: deadlock"
        assert sum(x.num_new_tokens for x in out.scheduled) <= config.max_num_batched_tokens
        assert len(out.scheduled) <= config.max_num_seqs
        assert len({x.request.request_id for x in out.scheduled}) == len(out.scheduled)
        for x in out.scheduled:
            r = x.request
            assert x.num_new_tokens >= 1 and r in s.running
            start, end = r.num_computed_tokens, r.num_computed_tokens + x.num_new_tokens
            assert end <= r.num_tokens
            if not config.enable_chunked_prefill:
                assert end == r.num_tokens
            tokens = r.all_token_ids
            # write this step's K/V, then read the whole context as attention would
            for position, slot in zip(
                range(start, end), manager.slot_mapping(r.request_id, start, end)
            ):
                self.kv[slot] = tuple(tokens[: position + 1])
            for position, slot in enumerate(manager.slot_mapping(r.request_id, 0, end)):
                assert self.kv[slot] == tuple(tokens[: position + 1]), (
                    f"request {r.request_id} reads a wrong K/V at position {position}"
                )
        for victim in out.preempted:
            assert victim in s.waiting and victim.request_id not in manager.block_tables
        sampling = [x.request for x in out.scheduled if x.samples_token]
        s.update_from_output(out)
        for r in sampling:
            r.append_output_token(rng.randrange(VOCAB))
            if r.finished:
                s.finish(r)
        self.num_steps += 1
        return out

    def check_schedule(self, out: SchedulerOutput, waiting_before: set[str]) -> None:
        """Checks of one step's decision, right after schedule() (the policy's own rules)."""

    def step_bound(self, unfinished: list[Request]) -> int:
        """Steps within which every request finishes from here: the oldest running request
        computes at least one token per step and is never preempted, so the work left bounds
        the steps left."""
        return sum(r.num_prompt_tokens + r.max_new_tokens for r in unfinished) + 1

    # -- invariants -------------------------------------------------------------------------
    @invariant()
    def bookkeeping(self):
        s = self.scheduler
        waiting, running = list(s.waiting), s.running
        for r in self.requests:
            places = sum(x is r for x in waiting) + sum(x is r for x in running) + r.finished
            assert places == 1, f"request {r.request_id} is in {places} places"
        assert all(r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED) for r in waiting)
        assert all(r.status is RequestStatus.RUNNING for r in running)
        assert len(running) <= s.config.max_num_seqs
        # Running requests hold blocks, waiting and finished ones none.
        tables = s.block_manager.block_tables
        assert set(tables) == {r.request_id for r in running}
        for r in running:
            assert len(tables[r.request_id]) >= cdiv(r.num_computed_tokens, s.config.block_size)
            assert r.num_computed_tokens < r.num_tokens  # there is always something left to do
        assert all(r.num_computed_tokens == 0 for r in waiting)
        # The pool: counts add up, and ref counts are the number of tables holding the block.
        assert self.pool.num_free_blocks + self.pool.num_used_blocks == self.pool.num_blocks
        self.pool.check_invariants()
        held = [0] * self.pool.num_blocks
        for table in tables.values():
            for block in table:
                held[block.block_id] += 1
        assert held == [block.ref_cnt for block in self.pool.blocks]
        if s.config.scheduling_policy == "fcfs":
            # Running then waiting is arrival order: preemption takes the newest, requeues it first.
            order = [int(r.request_id) for r in running + waiting]
            assert order == sorted(order)

    def teardown(self):
        # From any state, every request finishes within a proven number of steps.
        bound = self.step_bound([r for r in self.requests if not r.finished])
        rng = random.Random(0)
        for _ in range(bound):
            if not self.scheduler.has_unfinished_requests():
                break
            self.one_step(rng)
            self.bookkeeping()
        assert not self.scheduler.has_unfinished_requests(), f"not done after {bound} steps"
        assert all(r.finished for r in self.requests)
        for r in self.requests:
            if r.request_id in self.aborted:
                assert r.finish_reason == "abort"
            elif r.finish_reason == "stop":
                assert r.output_token_ids[-1] == EOS and EOS not in r.output_token_ids[:-1]
            else:
                assert r.finish_reason == "length"
                assert len(r.output_token_ids) == r.max_new_tokens
        assert self.pool.num_used_blocks == 0
        self.pool.check_invariants()


SchedulerMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestSchedulerMachine = SchedulerMachine.TestCase


def test_heavy_random_load_preempts_and_still_finishes():
    # A seeded program the state machine may rarely draw: many long requests, a tiny pool.
    num_preempted = num_prefix_hits = 0
    for seed in range(20):
        rng = random.Random(seed)
        machine = SchedulerMachine()
        machine.setup(
            block_size=rng.choice([1, 2, 4]),
            num_blocks=rng.randint(4, 8),
            budget=rng.randint(1, 12),
            max_num_seqs=rng.randint(2, 4),
            chunked=rng.random() < 0.7,
            caching=rng.random() < 0.7,
        )
        for _ in range(60):
            if rng.random() < 0.3:
                prefix = rng.choice(PREFIXES)
                suffix = [rng.randrange(EOS) for _ in range(rng.randint(0, 10))]  # no EOS
                machine.add_request(prefix, suffix, rng.randint(4, 12))
            else:
                out = machine.one_step(rng)
                num_preempted += len(out.preempted)
                num_prefix_hits += sum(x.num_cached_tokens > 0 for x in out.scheduled)
            machine.bookkeeping()
        machine.teardown()
    assert num_preempted >= 10 and num_prefix_hits >= 10


# ---------------------------------------------------------------------- speculative decoding
def test_a_decode_with_drafts_gets_one_token_per_draft_and_rolls_back_rejections():
    scheduler = make_scheduler(num_blocks=16, block_size=2, max_num_batched_tokens=4)
    request = make_request("a", range(1, 5), max_tokens=20)  # 4 prompt tokens
    scheduler.add_request(request)
    run_step(scheduler)  # the prompt, and a first token
    assert request.num_computed_tokens == 4 and request.num_tokens == 5
    probs = torch.softmax(torch.randn(4, 50), dim=-1)  # (k, V) the draft's distributions
    drafts = {"a": DraftTokens([7, 8, 9, 10], probs)}  # 4 drafts: 1 + 4 tokens, but the budget is 4
    out = scheduler.schedule(drafts)
    (s,) = out.scheduled
    assert (s.num_new_tokens, s.spec_token_ids, s.is_prefill, s.samples_token) == (4, [7, 8, 9], False, True)
    assert torch.equal(s.draft.probs, probs[:3])  # ids and probabilities cut together
    assert len(table_ids(scheduler, request)) == cdiv(4 + 4, 2)  # slots for the drafts too
    # The target accepted d1 only and added its own token: 2 tokens appended, 2 drafts rejected.
    update = scheduler.update_from_output(out, [[7, 42]])
    assert update.advanced == [request] and update.finished == []
    assert request.output_token_ids[-2:] == [7, 42]
    assert request.num_computed_tokens == 6 == request.num_tokens - 1
    assert len(table_ids(scheduler, request)) == cdiv(6, 2)  # the rejected drafts' block went back
    scheduler.block_manager.block_pool.check_invariants()


def test_preemption_drops_the_drafts():
    scheduler = make_scheduler(num_blocks=3, max_num_batched_tokens=16)
    old, new = make_request("old", range(1, 5), max_tokens=8), make_request("new", range(1, 5), max_tokens=8)
    for r in (old, new):
        scheduler.add_request(r)
    run_step(scheduler)
    drafts = {"old": DraftTokens([5, 6, 7]), "new": DraftTokens([5, 6, 7])}  # old needs a second block
    out = scheduler.schedule(drafts)
    assert new in out.preempted and new.num_computed_tokens == 0
    assert [s.request for s in out.scheduled] == [old]  # the preempted request's drafts go nowhere
    assert out.scheduled[0].spec_token_ids == [5, 6, 7]
