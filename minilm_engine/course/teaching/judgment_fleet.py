"""Chapter 08's judgment exercise: size a fleet from measured numbers.

Contract: each stored case (`fixtures/fleet_cases.json`, written by
`scripts/record_judgment_cases.py` from a measured sweep of the engine over `max_num_seqs`) gives

    sweep                 one row per batch limit, measured on one replica: output tokens/s,
                          p99 TPOT (ms), p99 TTFT (ms)
    target_tokens_per_s   the peak load to serve (output tokens/s)
    slo                   {"p99_tpot_ms": ..., "p99_ttft_ms": ...}, both must hold
    price_per_hour        one replica's rent;  utilization: the average load over the peak

and the learner answers (max_num_seqs, num_replicas, cost_per_mtok): the batch limit to run, how
many replicas serve the target within the SLO (the fewest), and the fleet's cost per million
output tokens over the month (rent of every replica, the tokens of the average load), or None
when no batch limit meets the SLO.

    FLEET.case(i)                              the i-th question (no answer)
    FLEET.check_answer(i, b, n, cost)          feedback on one answer, naming the mistake
    FLEET.check(size_fleet)                    a function (sweep, target, slo, price, utilization)
                                               -> (b, n, cost) or None, on every case

The feedback names the usual slips: the fastest batch limit though it breaks the SLO, the
quickest per user though it needs more replicas, a fleet rounded down, idle hours left unpaid,
one replica's capacity priced instead of the fleet, hours mixed with seconds.  No function here
returns an expected answer.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd

from minilm_engine.course.teaching.exercises import CheckResult, StoredCases

FIXTURE = "fleet_cases"
REL_TOL = 1e-4


@dataclass(frozen=True)
class FleetCase:
    """One sizing question (no answer)."""

    index: int
    sweep: pd.DataFrame
    target_tokens_per_s: float
    slo: dict[str, float]
    price_per_hour: float
    utilization: float

    def describe(self) -> str:
        return (f"case {self.index}: serve {self.target_tokens_per_s:,.0f} output tokens/s at p99 TPOT <= "
                f"{self.slo['p99_tpot_ms']} ms and p99 TTFT <= {self.slo['p99_ttft_ms']} ms; a replica rents for "
                f"{self.price_per_hour}/h, average load {self.utilization:.0%} of the peak")

    def _repr_html_(self) -> str:
        return f"<p>{self.describe()}</p>" + self.sweep.to_html(index=False)


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL)


class FleetExercise(StoredCases):
    """The stored cases and their checker (see the module docstring)."""

    def __init__(self, fixture: str = FIXTURE) -> None:
        super().__init__(fixture)

    def case(self, index: int) -> FleetCase:
        raw = self._stored()[index]["inputs"]
        return FleetCase(index, pd.DataFrame(raw["sweep"]), raw["target_tokens_per_s"], dict(raw["slo"]),
                         raw["price_per_hour"], raw["utilization"])

    def _judge(self, index: int, answer: Any) -> str:
        raw = self._stored()[index]
        inputs, want = raw["inputs"], raw["expected"]
        rows = {p["max_num_seqs"]: p for p in inputs["sweep"]}
        slo, target = inputs["slo"], inputs["target_tokens_per_s"]
        if want is None:
            if answer is None:
                return ""
            b = answer[0] if isinstance(answer, (tuple, list)) and answer else None
            row = rows.get(b)
            if row is not None:
                broken = _broken(row, slo)
                return f"no batch limit meets this SLO; max_num_seqs={b} breaks it: {broken}. Answer None"
            return "no batch limit of the sweep meets both limits of this SLO: answer None"
        if answer is None:
            return ("at least one measured batch limit meets both limits: check each row against p99 TPOT and "
                    "p99 TTFT")
        if not (isinstance(answer, (tuple, list)) and len(answer) == 3):
            return f"answer (max_num_seqs, num_replicas, cost_per_mtok), or None; got {answer!r}"
        b, n, cost = answer
        if b not in rows:
            return f"max_num_seqs={b!r} was not measured: pick one of {sorted(rows)}"
        if isinstance(n, bool) or not isinstance(n, int):
            return f"num_replicas must be a whole number (an int), got {n!r}"
        if isinstance(cost, bool) or not isinstance(cost, (int, float)):
            return f"cost_per_mtok must be a number, got {cost!r}"
        row = rows[b]
        broken = _broken(row, slo)
        if broken:
            return (f"max_num_seqs={b} breaks the SLO: {broken}. The most tokens/s is worth nothing if its "
                    "latency is out of bounds: only the rows within both limits may be run")
        needed = math.ceil(target / row["tokens_per_s"])
        if b not in want["max_num_seqs"]:
            return (f"max_num_seqs={b} meets the SLO, but one replica carries only {row['tokens_per_s']:,.0f} tokens/s, "
                    f"so {needed} replicas; another batch limit within the SLO carries more per replica and needs "
                    "fewer. The quickest per user is not the cheapest fleet")
        if n < needed:
            return (f"{n} replicas carry {n} x {row['tokens_per_s']:,.1f} = {n * row['tokens_per_s']:,.0f} tokens/s, "
                    f"less than the {target:,.0f} asked for: a fleet is rounded up, never down")
        if n > needed:
            return f"{n} replicas are more than max_num_seqs={b} needs for this load: the fewest that carry it"
        return _cost_feedback(cost, want["cost_per_mtok"], n, row, inputs)

    def check_answer(self, index: int, max_num_seqs: int | None, num_replicas: int | None = None,
                     cost_per_mtok: float | None = None) -> CheckResult:
        """Feedback on one answer for case `index` (pass max_num_seqs=None for "no batch limit",
        `...` for not answered yet)."""
        if max_num_seqs is ...:
            return CheckResult(False, 0, f"case {index}: not answered yet: replace the ... with your answer")
        answer = None if max_num_seqs is None else (max_num_seqs, num_replicas, cost_per_mtok)
        problem = self._judge(index, answer)
        if problem:
            return CheckResult(False, 1, f"case {index}: {problem}")
        return CheckResult(True, 1, f"case {index}: right")

    def check(self, size_fleet: Callable[..., Any]) -> CheckResult:
        """`size_fleet(sweep, target_tokens_per_s, slo, price_per_hour, utilization)` on every case;
        `sweep` is a list of row dicts.  The first wrong answer is explained."""
        stored = self._stored()
        for index, raw in enumerate(stored):
            inputs = json.loads(json.dumps(raw["inputs"]))  # a copy the learner may change
            try:
                answer = size_fleet(**inputs)
                problem = self._judge(index, answer)
            except NotImplementedError:
                return CheckResult(False, 0, "size_fleet: not implemented yet")
            except Exception as e:  # the learner's bug: feedback, not a traceback
                return CheckResult(False, index, f"size_fleet raised {type(e).__name__}: {e} on case {index}")
            if problem:
                return CheckResult(False, index, f"case {index}: your answer {answer!r}: {problem}")
        return CheckResult(True, len(stored), f"size_fleet: all {len(stored)} sizing questions answered right")

    def hint(self) -> str:
        return ("First strike out every row that breaks either limit. Among the rest, what matters for the bill "
                "is how many replicas the load needs, and a replica is bought whole. The rent is paid every hour; "
                "the tokens come at the average load.")


def _broken(row: dict, slo: dict) -> str:
    out = []
    if row["p99_tpot_ms"] > slo["p99_tpot_ms"]:
        out.append(f"p99 TPOT {row['p99_tpot_ms']} ms > {slo['p99_tpot_ms']} ms")
    if row["p99_ttft_ms"] > slo["p99_ttft_ms"]:
        out.append(f"p99 TTFT {row['p99_ttft_ms']} ms > {slo['p99_ttft_ms']} ms")
    return " and ".join(out)


def _cost_feedback(cost: float, want: float, n: int, row: dict, inputs: dict) -> str:
    if _close(cost, want):
        return ""
    u = inputs["utilization"]
    if u != 1.0 and _close(cost, want * u):
        return (f"the fleet is not busy every hour (average load {u:.0%} of the peak) but its rent is: divide by "
                "the utilization")
    per_replica = inputs["price_per_hour"] / (row["tokens_per_s"] * u * 3600) * 1e6
    if _close(cost, per_replica) or _close(cost, per_replica / u):
        return (f"that prices one replica running at its full {row['tokens_per_s']:,.0f} tokens/s; the fleet's "
                f"{n} replicas are paid for and carry only the target load, so the rounding-up is paid too")
    if _close(cost, want / 3600) or _close(cost, want * 3600):
        return "off by a factor of 3600: the price is per hour, the throughput per second"
    if _close(cost, want / 1e6) or _close(cost, want * 1e6):
        return "off by a factor of a million: the cost is per million tokens"
    return f"the cost per million tokens is off by x{cost / want:.3g}" if want else "the cost is off"


FLEET = FleetExercise()
