"""Tests for scheduling_policy="priority" (core/request_queue.py and the scheduler's merge).

Unit tests pin each rule (admission by rank, the budget handed down the ranks, the batch request
preempted first); a Hypothesis state machine (test_scheduler.py's, with random priorities)
checks after every step that:

    A. `waiting` and `running` are each in rank order, rank = (priority, arrival);
    B. the requests a step schedules are in rank order;
    C. a request preempted in a step (for memory, or for its seat) ranks after every request
       still running after it;
    D. every request still waiting after a step ranks after every request the step admitted;
    E. with chunked prefill, when the queue's head ranks before a request that got tokens, the
       head was kept out by a seat or by memory, never by budget given to lower-ranked work: the
       batch is full, the step preempted, or the free blocks cannot hold the head's tokens;

and that every request still finishes.  On the engine: outputs token for token equal to FCFS
(greedy), nothing leaked, and bad priorities refused with a clear error.
"""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.core.config import EngineConfig
from minilm_engine.core.request_queue import RequestOrder
from minilm_engine.core.kv_cache_manager import cdiv
from test_scheduler import PREFIXES, VOCAB, SchedulerMachine, make_request, make_scheduler, num_new, run_step

BATCH = 100  # a batch-tier priority in these tests


def test_fcfs_ignores_priorities_and_priority_admits_by_rank():
    for policy, expected in (("fcfs", ["a", "b", "c"]), ("priority", ["c", "a", "b"])):
        scheduler = make_scheduler(num_blocks=16, max_num_seqs=1, scheduling_policy=policy)
        # (The engine refuses priorities under fcfs; the scheduler alone just ignores them.)
        requests = [make_request("a", [1, 2]), make_request("b", [3, 4], priority=BATCH),
                    make_request("c", [5, 6], priority=-1)]
        for r in requests:
            scheduler.add_request(r)
        started = []
        while scheduler.has_unfinished_requests():
            out = run_step(scheduler)
            started += [s.request.request_id for s in out.scheduled if s.request.request_id not in started]
        assert started == expected


def test_equal_priorities_are_served_in_arrival_order():
    order = RequestOrder("priority")
    requests = [make_request(str(i), [1], priority=p) for i, p in enumerate([5, 0, 5, 0])]
    for r in requests:
        order.arrive(r)
    assert sorted(requests, key=order.rank) == [requests[1], requests[3], requests[0], requests[2]]
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        RequestOrder("lifo")


def test_batch_work_gets_what_interactive_work_leaves_of_the_budget():
    # A running batch request with a long prompt, then an interactive one arrives: under
    # priority the interactive prompt takes its tokens first and the batch chunk the rest.
    for policy, expected in (("fcfs", {"batch": 10}), ("priority", {"chat": 6, "batch": 4})):
        scheduler = make_scheduler(num_blocks=32, max_num_batched_tokens=10, scheduling_policy=policy)
        batch = make_request("batch", range(1, 41), priority=BATCH)
        scheduler.add_request(batch)
        run_step(scheduler)  # the first 10 tokens of its 40-token prompt
        scheduler.add_request(make_request("chat", range(50, 56)))
        out = run_step(scheduler)
        assert num_new(out) == expected
        assert [s.request.request_id for s in out.scheduled] == list(expected)


def test_the_pool_full_preempts_the_batch_request_not_the_newer_interactive_one():
    # 4 blocks of 2 tokens.  Batch arrives first, interactive second; both fill 2 blocks.  When
    # one must go, FCFS preempts the newest (the interactive one), priority the batch one.
    for policy, victim in (("fcfs", "chat"), ("priority", "batch")):
        scheduler = make_scheduler(num_blocks=4, block_size=2, enable_prefix_caching=False,
                                   scheduling_policy=policy)
        batch = make_request("batch", [1, 2, 3], max_tokens=5, priority=BATCH)
        chat = make_request("chat", [4, 5, 6], max_tokens=5)
        scheduler.add_request(batch)
        scheduler.add_request(chat)
        run_step(scheduler)
        run_step(scheduler)
        out = run_step(scheduler)  # position 4 needs a fifth block
        assert [r.request_id for r in out.preempted] == [victim]
        while scheduler.has_unfinished_requests():
            run_step(scheduler)
        assert len(batch.output_token_ids) == len(chat.output_token_ids) == 5
        assert scheduler.block_manager.block_pool.num_used_blocks == 0


def test_a_full_batch_gives_a_batch_seat_to_an_interactive_request():
    for policy, first_step in (("fcfs", {"batch0": 1, "batch1": 1}), ("priority", {"batch0": 1, "chat": 2})):
        scheduler = make_scheduler(num_blocks=16, max_num_seqs=2, scheduling_policy=policy)
        batch = [make_request(f"batch{i}", [1 + i, 2], max_tokens=6, priority=BATCH) for i in range(2)]
        for r in batch:
            scheduler.add_request(r)
        run_step(scheduler)  # both seats taken by batch work
        chat = make_request("chat", [7, 8], max_tokens=3)
        scheduler.add_request(chat)
        out = run_step(scheduler)
        assert num_new(out) == first_step
        if policy == "priority":
            assert out.preempted == [batch[1]] and list(scheduler.waiting) == [batch[1]]
        while scheduler.has_unfinished_requests():
            run_step(scheduler)
        assert all(len(r.output_token_ids) == r.sampling_params.max_tokens for r in [*batch, chat])
        assert scheduler.block_manager.block_pool.num_used_blocks == 0


def test_a_bad_scheduling_policy_is_refused():
    with pytest.raises(ValueError, match="scheduling_policy must be one of"):
        EngineConfig(scheduling_policy="lottery")


# ---------------------------------------------------------------------- random programs
class PrioritySchedulerMachine(SchedulerMachine):
    """test_scheduler.py's machine under scheduling_policy="priority", priorities drawn at random
    (negative, the default 0, and a batch tier), with the rank invariants A-E checked."""

    @initialize(
        block_size=st.sampled_from([1, 2, 4]),
        num_blocks=st.integers(3, 10),
        budget=st.integers(1, 12),
        max_num_seqs=st.integers(1, 4),
        chunked=st.booleans(),
        caching=st.booleans(),
    )
    def setup(self, block_size, num_blocks, budget, max_num_seqs, chunked, caching, policy="priority"):
        super().setup(block_size, num_blocks, budget, max_num_seqs, chunked, caching, policy)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, VOCAB - 1), max_size=10),
        max_tokens=st.integers(1, 12),
        copies=st.integers(1, 3),
        priority=st.sampled_from([-1, 0, 0, BATCH]),
    )
    def add_request(self, prefix, suffix, max_tokens, copies=1, priority=0):
        super().add_request(prefix, suffix, max_tokens, copies, priority)

    def check_schedule(self, out, waiting_before):
        s = self.scheduler
        rank = s.order.rank
        waiting, running = list(s.waiting), s.running
        assert [rank(r) for r in waiting] == sorted(rank(r) for r in waiting)  # A
        assert [rank(r) for r in running] == sorted(rank(r) for r in running)
        scheduled = [x.request for x in out.scheduled]
        assert [rank(r) for r in scheduled] == sorted(rank(r) for r in scheduled)  # B
        for victim in out.preempted:  # C
            assert all(rank(victim) > rank(r) for r in running)
        admitted = [r for r in scheduled if r.request_id in waiting_before]
        for r in waiting:  # D
            assert all(rank(r) > rank(a) for a in admitted)
        if waiting and scheduled and s.config.enable_chunked_prefill and not out.preempted:  # E
            head = waiting[0]
            if rank(head) < rank(scheduled[-1]):
                seats_full = len(running) >= s.config.max_num_seqs
                memory_short = self.pool.num_free_blocks < cdiv(head.num_tokens, s.config.block_size)
                assert seats_full or memory_short, (
                    f"request {head.request_id} (rank {rank(head)}) waits while lower-ranked "
                    f"{scheduled[-1].request_id} got tokens, with a seat and memory free"
                )

    def step_bound(self, unfinished):
        # The best-ranked unfinished request is never preempted and, once admitted, computes a
        # token every step; while it waits, no one is admitted and the best-ranked running
        # request is never preempted.  So each request's turn as the best takes at most all the
        # work left, and there are len(unfinished) turns.
        work = sum(r.num_prompt_tokens + r.max_new_tokens for r in unfinished)
        return len(unfinished) * (work + 1) + 1


PrioritySchedulerMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestPrioritySchedulerMachine = PrioritySchedulerMachine.TestCase


# ---------------------------------------------------------------------- on the engine
PROMPTS = ["Order for table 7:\n", "Receipt #7061\n", "Kitchen ticket:", "Two bowls of", "Table 3 asks",
           "Receipt #12\n", "Order for table 1:\n", "The chef says"]


@pytest.fixture(scope="module")
def llms():
    common = dict(max_num_seqs=4, max_num_batched_tokens=24, num_kv_blocks=16, block_size=4, seed=0)
    return LLM("noodle-chef", **common), LLM("noodle-chef", scheduling_policy="priority", **common)


def test_priority_outputs_equal_fcfs_token_for_token_and_nothing_leaks(llms):
    fcfs, prio = llms
    params = [SamplingParams(temperature=0, max_tokens=12 + 5 * i, ignore_eos=True) for i in range(len(PROMPTS))]
    priorities = [BATCH if i % 2 else 0 for i in range(len(PROMPTS))]
    expected = fcfs.generate(PROMPTS, params, use_tqdm=False)
    got = prio.generate(PROMPTS, params, use_tqdm=False, priority=priorities)
    assert [o.outputs[0].token_ids for o in got] == [o.outputs[0].token_ids for o in expected]
    assert prio.engine.scheduler.num_preemptions > 0  # the small pool made it preempt
    for llm in llms:
        assert llm.engine.block_pool.num_used_blocks == 0
        llm.engine.block_pool.check_invariants()
    # All arrived at once: under priority every interactive request started before any batch one.
    first_seen = []
    for record in prio.engine.trace.records:
        first_seen += [c.request_id for c in record.chunks if c.request_id not in first_seen]
    ids = [o.request_id for o in got]
    started = [priorities[ids.index(rid)] for rid in first_seen if rid in ids]
    assert started == sorted(started)


def test_interactive_requests_arriving_into_a_full_batch_take_seats_and_outputs_stay_exact(llms):
    fcfs, prio = llms
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    expected = fcfs.generate(PROMPTS, params, use_tqdm=False)
    engine = prio.engine
    preempted_before = engine.scheduler.num_preemptions
    requests = [engine.add_request(f"seat-b{i}", p, params, priority=BATCH) for i, p in enumerate(PROMPTS[:4])]
    for _ in range(3):
        engine.step()  # the four seats are batch work, decoding
    requests += [engine.add_request(f"seat-i{i}", p, params) for i, p in enumerate(PROMPTS[4:])]
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.scheduler.num_preemptions > preempted_before  # seats were taken from batch work
    assert [r.output_token_ids for r in requests] == [o.outputs[0].token_ids for o in expected]
    assert engine.block_pool.num_used_blocks == 0


def test_bad_priorities_are_clear_errors(llms):
    fcfs, prio = llms
    params = SamplingParams(temperature=0, max_tokens=2)
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        fcfs.generate(["a", "b"], params, priority=[0, 3], use_tqdm=False)
    with pytest.raises(ValueError, match="priority scheduling is not enabled"):
        fcfs.engine.add_request("x", "a", params, priority=1)
    with pytest.raises(TypeError, match="priority must be a list of ints"):
        prio.generate(["a"], params, priority=[1.5], use_tqdm=False)
    with pytest.raises(TypeError, match="priority must be a list of ints"):
        prio.generate(["a"], params, priority=3, use_tqdm=False)
    with pytest.raises(ValueError, match="1 priorities for 2 prompts"):
        prio.generate(["a", "b"], params, priority=[0], use_tqdm=False)
    with pytest.raises(TypeError, match="priority must be an int"):
        prio.engine.add_request("x", "a", params, priority=True)
    # Negative priorities are fine (vLLM's rule): served before the default 0.
    out = prio.generate(["a", "b"], params, priority=[-5, 0], use_tqdm=False)
    assert all(o.finished for o in out)
    assert not prio.engine.has_unfinished_requests() and prio.engine.block_pool.num_used_blocks == 0
    with pytest.raises(ValueError, match="runs in the continuous engine"):
        BaselineLLM("noodle-chef", strategy="kv_cache", scheduling_policy="priority")
