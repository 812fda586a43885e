"""Chapter 07's diagnosis exercise: the stored traces, a right diagnosis, and each usual wrong one
answered with its own message."""

from __future__ import annotations

import json

import pandas as pd

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.teaching import judgment_diagnosis as jd
from minilm_engine.course.teaching.exercises import FIXTURES_DIR

STORED = json.loads((FIXTURES_DIR / "diagnosis_cases.json").read_text())


def diagnose(steps: pd.DataFrame, limits: dict) -> tuple[str, int]:
    """A right answer, written from the exercise's definitions."""
    prefill = steps.loc[steps["prefill tokens"].idxmax()]
    if prefill["step"] == steps.loc[steps["duration ms"].idxmax(), "step"] and (steps["preempted"] == "").all() \
            and prefill["prefill tokens"] > 10 * steps["prefill tokens"].median() + 100:
        return "long prefill", int(prefill["step"])
    preempting = steps[steps["preempted"] != ""]
    if len(preempting):
        return "preemption", int(preempting["step"].iloc[0])
    first = steps[steps["waiting"] > 0].iloc[0]
    return ("full batch" if first["running"] == limits["max_num_seqs"] else "full pool"), int(first["step"])


def index_of(cause: str) -> int:
    return next(i for i, c in enumerate(STORED) if c["expected"]["cause"] == cause)


def test_every_cause_is_stored_and_each_answer_is_what_its_trace_shows():
    assert {c["expected"]["cause"] for c in STORED} == set(jd.CAUSES)
    for i, raw in enumerate(STORED):
        case = jd.DIAGNOSIS.case(i)
        assert not hasattr(case, "expected") and "expected" not in case.steps
        assert diagnose(case.steps, case.limits) == (raw["expected"]["cause"], raw["expected"]["step"]), raw["name"]


def test_a_right_diagnosis_passes_and_an_unwritten_one_is_told_so():
    assert jd.DIAGNOSIS.check(diagnose).passed
    for i, raw in enumerate(STORED):
        assert jd.DIAGNOSIS.check_answer(i, raw["expected"]["cause"], raw["expected"]["step"]).passed

    def todo(steps, limits):
        raise NotImplementedError

    assert "not implemented" in jd.DIAGNOSIS.check(todo).message


def wrong(i: int, cause: str, step: int) -> str:
    result = jd.DIAGNOSIS.check_answer(i, cause, step)
    assert not result.passed
    return result.message


def test_each_usual_mistake_gets_its_own_message():
    pre, long_, pool, batch = (index_of(c) for c in ("preemption", "long prefill", "full pool", "full batch"))
    steps = {i: jd.DIAGNOSIS.case(i).steps for i in (pre, long_, pool, batch)}
    slowest = int(steps[pre].loc[steps[pre]["duration ms"].idxmax(), "step"])
    messages = {
        # the slowest step of a preemption trace is the victim's recomputation
        "recompute read as a long prefill": wrong(pre, "long prefill", slowest),
        "preemption where nothing was preempted": wrong(long_, "preemption", STORED[long_]["expected"]["step"]),
        "a full batch where seats were free": wrong(pool, "full batch", STORED[pool]["expected"]["step"]),
        "a full pool where blocks were free": wrong(batch, "full pool", STORED[batch]["expected"]["step"]),
        "a slow step where nobody's step was slow": wrong(batch, "long prefill", STORED[batch]["expected"]["step"]),
        "a queue where nobody waited": wrong(long_, "full batch", STORED[long_]["expected"]["step"]),
        "one step late after the prefill": wrong(long_, "long prefill", STORED[long_]["expected"]["step"] + 1),
        "the recompute step, not the eviction": wrong(pre, "preemption", slowest),
        "before the queue formed": wrong(batch, "full batch", STORED[batch]["expected"]["step"] - 2),
    }
    assert "second time" in messages["recompute read as a long prefill"]
    assert "`preempted` column is empty" in messages["preemption where nothing was preempted"]
    assert "had seats" in messages["a full batch where seats were free"]
    assert "free blocks" in messages["a full pool where blocks were free"]
    assert "waiting" in messages["a slow step where nobody's step was slow"]
    assert "no request ever waited" in messages["a queue where nobody waited"]
    assert "one step late" in messages["one step late after the prefill"]
    assert "recomputed" in messages["the recompute step, not the eviction"]
    assert "nobody was waiting yet" in messages["before the queue formed"]
    assert len(set(messages.values())) == len(messages), "every mistake has its own message"


def test_malformed_answers_get_feedback_not_a_traceback():
    assert "one of" in wrong(0, "gremlins", 3)
    assert "an int" in wrong(0, "preemption", "3")
    assert "pair" in jd.DIAGNOSIS.check(lambda steps, limits: "preemption").message
    assert "ZeroDivisionError" in jd.DIAGNOSIS.check(lambda steps, limits: 1 / 0).message


def test_steps_table_reads_a_real_trace_with_its_preemption():
    llm = LLM("noodle-apprentice", max_num_seqs=4, num_kv_blocks=12, enable_prefix_caching=False)
    params = SamplingParams(temperature=0, max_tokens=60, ignore_eos=True)
    for i in range(3):
        llm.engine.add_request(f"r{i}", "Order for table 7: two bowls of", params)
    while llm.engine.has_unfinished_requests():
        llm.engine.step()
    rows = jd.steps_table(llm.engine.trace.records, {0: ["r0", "r1", "r2"]})
    assert [r["step"] for r in rows] == list(range(len(rows))) and rows[0]["arrived"] == "r0,r1,r2"
    assert rows[0]["prefills"].startswith("r0:") and rows[0]["time ms"] == 0
    assert any(r["preempted"] for r in rows), "12 blocks cannot hold three 60-token answers"
    assert all(r["used blocks"] <= r["num blocks"] for r in rows)
    assert jd.steps_table([]) == []


def test_a_case_carries_no_answer():
    assert set(jd.DIAGNOSIS.case(0).__dataclass_fields__) == {"name", "steps", "limits"}
    assert "expected" not in jd.DIAGNOSIS.case(0)._repr_html_()


def test_an_unanswered_placeholder_is_told_so():
    assert "not answered yet" in jd.DIAGNOSIS.check_answer(0, ..., ...).message
