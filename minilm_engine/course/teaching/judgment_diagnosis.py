"""Chapter 07's judgment exercise: diagnose a latency spike from an engine's step trace.

Contract: `steps_table(records)` turns `engine.trace.records` into one plain row per step
(what an operator's dashboard shows: step time, prefill and decode tokens, running and waiting
requests, KV blocks used, who was preempted, whose prompt was computed).  The stored cases
(`fixtures/diagnosis_cases.json`, recorded from the real engine by
`scripts/record_judgment_cases.py`) are traces with one latency spike each, caused by one of

    "long prefill"   one huge prompt computed in a single step: every running request's next
                     token waits for it (an ITL spike for everyone)
    "preemption"     the KV pool ran out while requests were decoding: one was evicted, and its
                     whole sequence is recomputed later (its tokens stall, then a slow step)
    "full pool"      new requests wait although the batch has seats: no KV blocks to give them
    "full batch"     new requests wait because `max_num_seqs` requests are already running

and the learner answers (cause, step): the cause, and the step where it started (the long
prefill's step, the step that preempted, the first step a new request had to wait).

    DIAGNOSIS.case(i)                  the i-th trace (a DataFrame) and its engine limits
    DIAGNOSIS.check_answer(i, c, s)    feedback on one answer, naming the mistake
    DIAGNOSIS.check(diagnose)          a function (steps, limits) -> (cause, step) on every case

Feedback is worked out from the trace (the slow step, the preempted column, the free blocks),
so it names what the answer overlooked.  No function here returns an expected answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from minilm_engine.course.teaching.exercises import CheckResult, StoredCases

CAUSES = ("long prefill", "preemption", "full pool", "full batch")
FIXTURE = "diagnosis_cases"


def steps_table(records: Sequence[Any], arrivals: dict[int, list[str]] | None = None) -> list[dict]:
    """One JSON-able row per engine step of `records` (StepRecords), times relative to the
    first step.  `arrivals`: request ids added just before each step, if the caller kept them."""
    if not records:
        return []
    t0 = records[0].start_time
    rows = []
    for r in records:
        rows.append({
            "step": r.step - records[0].step,
            "time ms": round(1e3 * (r.start_time - t0), 2),
            "duration ms": round(1e3 * r.duration_s, 2),
            "prefill tokens": r.num_prefill_tokens,
            "decode tokens": r.num_decode_tokens,
            "running": r.num_running,
            "waiting": r.num_waiting,
            "used blocks": r.num_used_blocks,
            "num blocks": r.num_blocks,
            "preempted": ",".join(r.preempted),
            "prefills": ",".join(f"{c.request_id}:{c.num_prefill_tokens}" for c in r.chunks if c.num_prefill_tokens),
            "arrived": ",".join((arrivals or {}).get(r.step - records[0].step, [])),
        })
    return rows


@dataclass(frozen=True)
class Case:
    """One trace to diagnose: its steps and the engine's limits (no answer)."""

    name: str
    steps: pd.DataFrame
    limits: dict[str, int]  # max_num_seqs, num_blocks, block_size

    def _repr_html_(self) -> str:
        return f"<p><b>{self.name}</b> (limits: {self.limits})</p>" + self.steps.to_html(index=False)


def _prefilled_before(steps: pd.DataFrame, step: int) -> set[str]:
    seen: set[str] = set()
    for text in steps[steps["step"] < step]["prefills"]:
        seen |= {p.split(":")[0] for p in text.split(",") if p}
    return seen


def _slowest(steps: pd.DataFrame) -> pd.Series:
    return steps.loc[steps["duration ms"].idxmax()]


def _first(steps: pd.DataFrame, mask) -> int | None:
    hit = steps[mask]
    return int(hit["step"].iloc[0]) if len(hit) else None


def _cause_feedback(case: Case, cause: str, expected: str) -> str:
    """Why `cause` is the wrong cause for this trace, read from the trace itself."""
    s, limits = case.steps, case.limits
    slow = _slowest(s)
    median_ms = float(s["duration ms"].median())
    preempting = s[s["preempted"] != ""]
    waiting = s[s["waiting"] > 0]
    if cause == "preemption" and preempting.empty:
        return "no step preempted anything: the `preempted` column is empty from start to end"
    if cause == "long prefill" and expected == "preemption":
        again = [p.split(":")[0] for p in str(slow["prefills"]).split(",") if p]
        recomputed = [rid for rid in again if rid in _prefilled_before(s, int(slow["step"]))]
        if recomputed:
            return (f"the big prefill at step {int(slow['step'])} is request {recomputed[0]} being computed a second "
                    "time: its prompt had been computed before. Why would an engine compute a prompt twice? "
                    "Look at the `preempted` column")
        return "the slow steps come after a request was evicted from the pool: look at the `preempted` column"
    if cause == "long prefill":
        return (f"no step is much slower than the others (slowest {slow['duration ms']:.1f} ms, median "
                f"{median_ms:.1f} ms): the latency is time spent waiting, not a slow step. Look at `waiting`")
    if cause in ("full pool", "full batch") and waiting.empty:
        return "no request ever waited (`waiting` is 0 at every step): the latency is not queueing"
    if cause == "full batch":
        row = waiting.iloc[0]
        if row["running"] < limits["max_num_seqs"]:
            return (f"at step {int(row['step'])} a request waits while only {int(row['running'])} run, fewer than "
                    f"max_num_seqs={limits['max_num_seqs']}: the batch had seats. What else does a new request need?")
        return "the batch is full at some point, but that is not what held the latency up here"
    if cause == "full pool":
        row = waiting.iloc[0]
        free = int(row["num blocks"] - row["used blocks"])
        if expected == "full batch":
            return (f"at step {int(row['step'])} the pool still had {free} free blocks, and "
                    f"{int(row['running'])} requests ran = max_num_seqs: count the running requests")
        return ("the pool did fill, but the engine answered by evicting a running request (the `preempted` "
                "column): that eviction is the cause of the spike" if expected == "preemption"
                else "the pool was not what limited admission here")
    if cause == "preemption":
        return ("a preemption happened, but it is not the spike you were asked about: compare the slowest step's "
                "time with when the preemption happened")
    return f"the cause is not {cause!r}"


def _step_feedback(case: Case, cause: str, step: int, expected_step: int) -> str:
    s = case.steps
    if step == expected_step:
        return ""
    if cause == "preemption":
        later = step > expected_step
        return ("that step is where the evicted request is recomputed or its stall shows; the cause is the step "
                "that evicted it (the `preempted` column)" if later else
                "nothing was preempted yet at that step: look for the first step whose `preempted` is not empty")
    if cause == "long prefill":
        if step == expected_step + 1:
            return ("one step late: the step after the prefill is where clients see the gap end; the time went "
                    "into the step that computed the long prompt")
        return "look for the step that computed the most prompt tokens at once (`prefill tokens`)"
    row = s[s["step"] == step]
    if len(row) and int(row["waiting"].iloc[0]) == 0:
        return f"at step {step} nobody was waiting yet: find the first step whose `waiting` is above 0"
    return ("requests were already waiting before that step: the queue started earlier (the first step with "
            "`waiting` above 0)" if step > expected_step else "that is before the queue formed")


class DiagnosisExercise(StoredCases):
    """The stored cases and their checker (see the module docstring)."""

    def __init__(self, fixture: str = FIXTURE) -> None:
        super().__init__(fixture)

    def case(self, index: int) -> Case:
        raw = self._stored()[index]
        return Case(raw["name"], pd.DataFrame(raw["steps"]), dict(raw["limits"]))

    def _judge(self, index: int, answer: Any) -> str:
        raw = self._stored()[index]
        want = raw["expected"]
        if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
            return f"answer (cause, step), a pair, got {answer!r}"
        cause, step = answer
        if cause not in CAUSES:
            return f"the cause must be one of {CAUSES}, got {cause!r}"
        if isinstance(step, bool) or not isinstance(step, int):
            return f"the step must be an int (the `step` column), got {step!r}"
        case = self.case(index)
        if cause != want["cause"]:
            return f"not {cause!r}: " + _cause_feedback(case, cause, want["cause"])
        return _step_feedback(case, cause, step, want["step"])

    def check_answer(self, index: int, cause: str, step: int) -> CheckResult:
        """Feedback on one answer for case `index` (`...`: not answered yet)."""
        if cause is ... or step is ...:
            return CheckResult(False, 0, f"{self._stored()[index]['name']}: not answered yet: replace the ... "
                                         "with your answer")
        problem = self._judge(index, (cause, step))
        name = self._stored()[index]["name"]
        if problem:
            return CheckResult(False, 1, f"{name}: {problem}")
        return CheckResult(True, 1, f"{name}: right: {cause} at step {step}")

    def check(self, diagnose: Callable[[pd.DataFrame, dict], tuple[str, int]]) -> CheckResult:
        """`diagnose(steps, limits)` on every stored case; the first wrong one is explained."""
        stored = self._stored()
        for index in range(len(stored)):
            case = self.case(index)
            try:
                answer = diagnose(case.steps.copy(), dict(case.limits))
                problem = self._judge(index, answer)
            except NotImplementedError:
                return CheckResult(False, 0, "diagnose: not implemented yet")
            except Exception as e:  # the learner's bug: feedback, not a traceback
                return CheckResult(False, index, f"diagnose raised {type(e).__name__}: {e} on {case.name}")
            if problem:
                return CheckResult(False, index, f"{case.name} (case {index}): your answer {answer!r}: {problem}")
        return CheckResult(True, len(stored), f"diagnose: all {len(stored)} recorded traces diagnosed right")

    def hint(self) -> str:
        return ("Ask two questions of the trace. Is there a step much slower than the others, and what did it "
                "compute? Did requests wait, and when they did, what was full: the seats or the blocks? "
                "A prompt computed twice has a story behind it.")


DIAGNOSIS = DiagnosisExercise()
