"""Chapter 01's scheduler-step piece (course/teaching/build_schedule.py): the learner's loop.

A correct step written here passes, alone and in the engine; one written differently (admission
decided by the pool's allocate) passes too; each usual mistake fails alone with the name of the
branch it breaks; the package's own step gets the nudge.  The engine run of the correct attempt
is in test_build_exercises.py (with every other piece's).
"""

from __future__ import annotations

import pytest

from minilm_engine import pluggable
from minilm_engine.core.schedule_step import StepPlan
from minilm_engine.course.teaching import build
from minilm_engine.course.teaching.build_pieces import get_adapter
from minilm_engine.course.teaching.build_runs import BuildSetup
from minilm_engine.course.teaching.build_schedule import NAMED_CASES, check_schedule_step_alone


@pytest.fixture(scope="module")
def setup(checkpoints) -> BuildSetup:
    return BuildSetup(model=str(checkpoints["qwen3"].path), draft_model=str(checkpoints["llama"].path),
                      max_tokens=6, num_samples=3000)


def learner_step(mistake: str | None = None):
    """A learner's schedule_step, right (mistake=None) or with one named mistake."""

    def tokens(remaining, spec, used, step):
        left = step.max_num_batched_tokens - (0 if mistake == "budget per request" else used)
        if remaining == 1 and spec and mistake != "drafts chunked":
            return min(1 + spec, left)
        if remaining <= left:
            return remaining
        chunked = {"always chunk": True, "never chunk": False}.get(mistake, step.enable_chunked_prefill)
        return left if chunked else 0

    def step_fn(step, pool):
        plan = StepPlan()
        running = list(step.running)
        used = 0

        def admit_queue():
            nonlocal used
            for w in step.waiting:
                if (plan.preempted and mistake != "admits after preemption") or (
                        len(running) >= step.max_num_seqs and mistake != "ignores seats"):
                    break
                hit = 0 if mistake == "ignores the prefix hit" else pool.num_cached_tokens(w.request_id)
                n = tokens(w.num_remaining_tokens - hit, 0, used, step)
                if n == 0 or not pool.allocate(w.request_id, n):
                    if mistake == "skips the head":
                        continue
                    break
                running.append(w)
                plan.num_new_tokens[w.request_id] = n
                used += n

        if mistake == "waiting first":
            admit_queue()
        i = 0
        while i < len(running):
            r = running[i]
            if mistake == "waiting first" and r.request_id in plan.num_new_tokens:
                i += 1
                continue
            n = tokens(r.num_remaining_tokens, r.num_spec_tokens, used, step)
            if n == 0:
                i += 1
                continue
            fits = True
            while not pool.allocate(r.request_id, n):
                victim = {"preempts the oldest": running[0], "preempts the requester": r}.get(mistake, running[-1])
                running.remove(victim)
                pool.preempt(victim.request_id)
                if mistake != "forgets the preemption":
                    plan.preempted.append(victim.request_id)
                if victim is r:
                    fits = False
                    break
            if fits:
                if mistake != "forgets to plan":
                    plan.num_new_tokens[r.request_id] = n
                used += n
                i += 1
        if mistake != "waiting first":
            admit_queue()
        return plan

    return step_fn


def test_a_correct_step_passes_alone_and_one_written_differently_too():
    call = get_adapter("scheduler.schedule_step")
    assert "match" in check_schedule_step_alone(call(learner_step()))


@pytest.mark.parametrize("mistake, phrases", [
    ("waiting first", ["running before waiting", "running requests get their tokens first"]),
    ("always chunk", ["chunked prefill off", "runs nothing this step"]),
    ("never chunk", ["chunked prefill on", "takes what is left of the budget"]),
    ("budget per request", ["the budget"]),
    ("preempts the oldest", ["out of blocks", "preempted after it was scheduled"]),
    ("preempts the requester", ["out of blocks", "preempt the newest"]),
    ("admits after preemption", ["nobody admitted after a preemption", "thrashing"]),
    ("ignores seats", ["seats full", "every seat taken"]),
    ("skips the head", ["a head that cannot start holds the queue", "starvation"]),
    ("ignores the prefix hit", ["a prefix hit", "prefix hit of 8"]),
    ("drafts chunked", ["a decode's drafts cut to fit", "drafts are guesses"]),
    ("forgets the preemption", ["out of blocks", "the plan lists preempted"]),
    ("forgets to plan", ["allocate for each scheduled request"]),
])
def test_each_mistake_fails_alone_with_its_own_message(mistake, phrases, setup):
    result = build.check("schedule_step", learner_step(mistake), setup)
    assert not result.passed, result
    for phrase in phrases:
        assert phrase in result.message, (mistake, result)


def test_every_named_branch_is_reached_by_some_mistake():
    labels = {c.label for c in NAMED_CASES}
    caught = set()
    call = get_adapter("scheduler.schedule_step")
    for mistake in ("waiting first", "always chunk", "never chunk", "budget per request", "preempts the requester",
                    "admits after preemption", "ignores seats", "skips the head", "ignores the prefix hit",
                    "drafts chunked"):
        try:
            check_schedule_step_alone(call(learner_step(mistake)), num_random=0)
        except build.BuildFailure as e:
            caught |= {label for label in labels if f"alone, {label} (" in str(e)}
    assert len(caught) >= 9, sorted(labels - caught)


def test_the_package_step_gets_a_nudge(setup):
    own = pluggable.default("scheduler.schedule_step")
    result = build.check("schedule_step", own, setup)
    assert not result.passed and "package's own" in result.message, result

    from minilm_engine.core.schedule_step import schedule_step

    def wrapper(step, pool):
        return schedule_step(step, pool)

    result = build.check("schedule_step", wrapper, setup)
    assert not result.passed and "your function calls it" in result.message, result


def test_a_wrong_return_type_is_named(setup):
    result = build.check("schedule_step", lambda step, pool: {}, setup)
    assert not result.passed and "return a StepPlan" in result.message, result
