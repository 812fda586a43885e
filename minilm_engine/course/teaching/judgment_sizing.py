"""Chapter 01's judgment exercise: size a deployment from measured decode steps.

Contract: the learner writes `size(case) -> (max_num_seqs, num_replicas)` for a `SizingCase`:
a load (requests per second, prompt and output tokens per request), an SLO (the P99 time per
output token, in ms), and a step table measured on this engine (per batch size, the mean and
the P99 of one decode step, and the cost of one prompt token's prefill).  `check(fn)` runs it
on the stored cases (`fixtures/sizing_cases.json`, written by `scripts/make_sizing_cases.py`,
which answers them outside the package, together with the answer each usual mistake gives)
and reports the first wrong case; when the learner's answer is one a known mistake gives, the
feedback names that mistake.  This module holds no formula and returns no expected value.
`case_from_timings` turns chapter 01's own engine sweep into a case, to size for this machine.
"""

from __future__ import annotations

import json
import numbers
import statistics
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minilm_engine.course.teaching.exercises import CheckResult

FIXTURE = Path(__file__).parent / "fixtures" / "sizing_cases.json"

HINT = (
    "Two separate questions. The SLO is a promise about the slow steps, not the typical one, and a "
    "step gets slower as the batch grows: which batch sizes keep that promise? Then capacity: in the "
    "long run a replica's time is spent on average steps, and every request costs it its prompt as well "
    "as its output tokens; how many requests per second does one replica finish, and how many "
    "replicas does the load need (can you run part of a replica?)."
)

# What each stored mistake means, said to the learner whose answer matches it.
MISTAKES = {
    "mean_not_p99": "you chose the batch limit from the mean step, but the SLO is on the P99: at that batch "
                    "the slow steps break it. Use each batch size's P99 step for the SLO",
    "flat_step": "you took the largest batch as if a step cost the same at any batch size, sizing capacity "
                 "with the batch-1 step: the step grows with the batch (look at the table), so both the SLO "
                 "and the capacity change",
    "no_ceiling": "your replica count is rounded down: a fraction of a replica does not exist, and with fewer "
                  "replicas than the load needs the queue grows without bound. Round up",
    "no_prefill": "you counted only the output tokens: each request's prompt also takes the replica's time "
                  "(prefill_ms_per_token for every prompt token), so a replica finishes fewer requests",
    "p99_for_capacity": "you sized capacity with the P99 step: the SLO is about the slow steps, but throughput "
                        "over a long run is set by the average step, so this overprovisions",
}


@dataclass(frozen=True)
class StepRow:
    batch: int
    mean_step_ms: float
    p99_step_ms: float


@dataclass(frozen=True)
class SizingCase:
    """One deployment to size.  Every time is in milliseconds."""

    requests_per_s: float
    prompt_tokens: int
    output_tokens: int
    p99_tpot_ms: float  # the SLO on the P99 inter-token latency (ITL): 99% of output tokens come within
    # this of the previous one (a per-gap tail, not TPOT, which is one request's mean; the field keeps its old name)
    steps: tuple[StepRow, ...]  # measured decode steps by batch size
    prefill_ms_per_token: float  # measured: the cost of one prompt token

    def step_table(self) -> str:
        lines = [f"{'batch':>5} {'mean step ms':>13} {'P99 step ms':>12}"]
        lines += [f"{r.batch:>5} {r.mean_step_ms:>13.2f} {r.p99_step_ms:>12.2f}" for r in self.steps]
        return "\n".join(lines)

    def __str__(self) -> str:
        return (f"load {self.requests_per_s} requests/s, {self.prompt_tokens} prompt + {self.output_tokens} output "
                f"tokens each; SLO: P99 ITL (each gap between tokens) <= {self.p99_tpot_ms} ms; prefill {self.prefill_ms_per_token} ms "
                f"per prompt token\n{self.step_table()}")


def _case(raw: dict[str, Any], table: dict[str, Any]) -> SizingCase:
    steps = tuple(StepRow(r["batch"], r["mean_step_ms"], r["p99_step_ms"]) for r in table["steps"])
    load = raw["load"]
    return SizingCase(load["requests_per_s"], load["prompt_tokens"], load["output_tokens"],
                      raw["slo"]["p99_tpot_ms"], steps, table["prefill_ms_per_token"])


def _stored() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


def cases() -> list[SizingCase]:
    """The stored cases (inputs only)."""
    data = _stored()
    return [_case(raw, data["table"]) for raw in data["cases"]]


def measured_on() -> str:
    """What the stored step table was measured on."""
    return _stored()["table"]["measured_on"]


def case_from_timings(timings, requests_per_s: float, prompt_tokens: int, output_tokens: int,
                      p99_tpot_ms: float, prefill_ms_per_token: float) -> SizingCase:
    """A case from chapter 01's `engine_decode_sweep` (each timing's every step: mean and P99)."""
    from minilm_engine.course.experiments.batching import percentile

    steps = tuple(StepRow(t.batch_size, 1e3 * statistics.fmean(t.steps_s), 1e3 * percentile(list(t.steps_s), 99))
                  for t in timings)
    return SizingCase(requests_per_s, prompt_tokens, output_tokens, p99_tpot_ms, steps, prefill_ms_per_token)


def _as_answer(got: Any) -> tuple[int, int] | str:
    """(max_num_seqs, num_replicas), or what is wrong with the shape of the answer."""
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        return f"return a pair (max_num_seqs, num_replicas), got {got!r:.60}"
    bad = [x for x in got if not isinstance(x, numbers.Integral) or isinstance(x, bool)]
    if bad:
        return f"both numbers must be whole numbers (ints): a batch limit and a count of replicas; got {got!r}"
    return int(got[0]), int(got[1])


def check(fn: Callable[[SizingCase], Any]) -> CheckResult:
    """Run `fn` on every stored case.  A wrong answer is reported on the first case where it is
    what exactly one known mistake gives (so the feedback can name it), else the first wrong one."""
    data = _stored()
    raws = data["cases"]
    wrong: list[tuple[int, SizingCase, tuple[int, int], list[str]]] = []
    for i, raw in enumerate(raws):
        case = _case(raw, data["table"])
        try:
            got = fn(case)
        except NotImplementedError:
            return CheckResult(False, len(raws), "size: not implemented yet")
        except Exception as e:  # the learner's code raised: say so, on this case
            return CheckResult(False, len(raws), f"case {i}: your function raised {type(e).__name__}: {e}\n{case}")
        answer = _as_answer(got)
        if isinstance(answer, str):
            return CheckResult(False, len(raws), f"case {i}: {answer}")
        if answer != (raw["expected"]["max_num_seqs"], raw["expected"]["num_replicas"]):
            named = [n for n, a in raw["mistakes"].items() if (a["max_num_seqs"], a["num_replicas"]) == answer]
            wrong.append((i, case, answer, named))
    if not wrong:
        return CheckResult(True, len(raws), f"size: all {len(raws)} stored cases sized right")
    i, case, answer, named = next((w for w in wrong if len(w[3]) == 1), next((w for w in wrong if w[3]), wrong[0]))
    if named:
        why = " Or: ".join(MISTAKES[n] for n in named)
    else:
        why = (f"your answer (max_num_seqs={answer[0]}, num_replicas={answer[1]}) is wrong, and not in a way the "
               f"usual mistakes give: reread the hint")
    return CheckResult(False, len(raws), f"{len(wrong)} of {len(raws)} cases wrong. Case {i}: {why}.\n{case}")


def hint() -> str:
    return HINT

