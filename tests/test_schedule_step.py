"""The scheduler's plain-data seam (core/schedule_step.py): `Scheduler.schedule` decides every
step through `schedule_step(step, pool)` and holds the returned plan against what the pool
did; a plan it cannot carry out is refused with a `StepPlanError` that says why.
"""

from __future__ import annotations

import pytest

from minilm_engine import pluggable
from minilm_engine.core.block_pool import BlockPool
from minilm_engine.core.config import EngineConfig
from minilm_engine.core.kv_cache_manager import BlockManager
from minilm_engine.core.request import Request
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.schedule_step import StepPlan, StepPlanError
from minilm_engine.core.scheduler import Scheduler

REFERENCE = pluggable.default("scheduler.schedule_step")


def scheduler(num_blocks: int = 32, **config) -> Scheduler:
    config = EngineConfig(block_size=4, num_kv_blocks=num_blocks, **config)
    return Scheduler(config, BlockManager(BlockPool(num_blocks, enable_caching=True), 4, True))


def request(rid: str, n: int = 6, priority: int = 0) -> Request:
    return Request(request_id=rid, prompt=None, prompt_token_ids=list(range(1, n + 1)),
                   sampling_params=SamplingParams(temperature=0, max_tokens=4), eos_token_ids=(),
                   max_model_len=64, priority=priority)


def test_every_fcfs_step_goes_through_the_seam_as_plain_data():
    seen = []

    def watching(step, pool):
        seen.append(([(r.request_id, r.num_remaining_tokens) for r in step.running],
                     [(r.request_id, r.num_remaining_tokens) for r in step.waiting]))
        return REFERENCE(step, pool)

    s = scheduler(max_num_seqs=2)
    for rid in "abc":
        s.add_request(request(rid))
    with pluggable.override("scheduler.schedule_step", watching):
        out = s.schedule()
    # Nobody runs yet; the queue offered: the two that could take a seat and one more.
    assert seen == [([], [("a", 6), ("b", 6), ("c", 6)])]
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 6), ("b", 6)]


def test_priority_goes_through_the_seam_with_ranks():
    seen = []

    def watching(step, pool):
        seen.append([(r.request_id, r.rank) for r in step.waiting])
        return REFERENCE(step, pool)

    s = scheduler(scheduling_policy="priority")
    s.add_request(request("a", priority=5))
    s.add_request(request("b", priority=-1))
    with pluggable.override("scheduler.schedule_step", watching):
        out = s.schedule()
    assert seen == [[("b", (-1, 1)), ("a", (5, 0))]]
    assert [x.request.request_id for x in out.scheduled] == ["b", "a"]


@pytest.mark.parametrize("plan, words", [
    (lambda step, pool: (pool.allocate("a", 6), StepPlan())[1], "allocate for each scheduled request"),
    (lambda step, pool: StepPlan({"a": 6}), "allocate for each scheduled request"),
    (lambda step, pool: (pool.allocate("b", 6), StepPlan({"b": 6}))[1], "fcfs starts requests in queue order"),
    (lambda step, pool: (pool.allocate("a", 9), StepPlan({"a": 9}))[1], "has 6 tokens to compute .*, not 9"),
    (lambda step, pool: (pool.allocate("a", 0), StepPlan({"a": 0}))[1], "allocate at least 1"),
    (lambda step, pool: {"a": 6}, "returns a StepPlan"),
])
def test_a_plan_the_scheduler_cannot_carry_out_is_refused(plan, words):
    s = scheduler()
    for rid in "ab":
        s.add_request(request(rid))
    with pluggable.override("scheduler.schedule_step", plan), pytest.raises(StepPlanError, match=words):
        s.schedule()


def test_seats_and_budget_are_held_against_the_plan():
    def greedy(step, pool):
        plan = StepPlan()
        for r in step.waiting:
            if pool.allocate(r.request_id, r.num_remaining_tokens):
                plan.num_new_tokens[r.request_id] = r.num_remaining_tokens
        return plan

    s = scheduler(max_num_seqs=1)
    for rid in "ab":
        s.add_request(request(rid))
    with pluggable.override("scheduler.schedule_step", greedy), pytest.raises(StepPlanError, match="every seat taken"):
        s.schedule()
    s = scheduler(max_num_batched_tokens=8)
    for rid in "ab":
        s.add_request(request(rid))
    with pluggable.override("scheduler.schedule_step", greedy), pytest.raises(StepPlanError, match="budget is one"):
        s.schedule()
