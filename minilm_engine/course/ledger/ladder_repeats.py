"""The technique ladder, repeated: every rung measured several times, in alternating order.

Contract: `run_ladder_repeats(workload, num_repeats=5)` serves the same workload with every
rung of `ladder.compose(rungs)` once per repeat, the rungs visited in a rotated order each
repeat (so a burst of other work on the machine does not always land on the same rung), each
run on a fresh engine (a second run on the same engine would find every prompt in its prefix
cache).  It returns a `LadderRepeats`: each rung's `Measurement`s in repeat order, or the reason
a rung could not run.  From it:

    median_results()        one `RungResult` per rung, its median-duration run: what
                            `ladder_table`, `verdicts` and the dashboard read
    costs(prices)           {rung name: blended cost per Mtok of each repeat}, in repeat order,
                            so rung / rung before is a paired ratio per repeat

Intervals and verdicts over those pairs are the teaching layer's (`teaching.claims`): this
module returns the raw repeats and never a summary that hides them.
"""

from __future__ import annotations

import gc
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from minilm_engine.course.ledger.books import Ledger
from minilm_engine.course.ledger.ladder import (
    LADDER,
    Rung,
    RungResult,
    compose,
    measure_workload,
    rung_arguments,
)
from minilm_engine.course.ledger.measurement import Measurement
from minilm_engine.course.ledger.prices import Prices


@dataclass
class LadderRepeats:
    rungs: list[Rung]
    runs: dict[str, list[Measurement]] = field(default_factory=dict)  # rung name -> repeats
    reasons: dict[str, str] = field(default_factory=dict)  # rung name -> why it did not run

    @property
    def measured(self) -> list[Rung]:
        return [r for r in self.rungs if self.runs.get(r.name)]

    def median_results(self) -> list[RungResult]:
        results = []
        for rung in self.rungs:
            runs = self.runs.get(rung.name)
            if not runs:
                results.append(RungResult(rung, None, self.reasons.get(rung.name, "not run")))
                continue
            durations = [m.duration_s for m in runs]
            median = statistics.median_low(durations)  # a run that happened, not an average
            results.append(RungResult(rung, runs[durations.index(median)]))
        return results

    def costs(self, prices: Prices) -> dict[str, list[float]]:
        return {rung.name: [Ledger(m, prices).blended_cost_per_mtok for m in self.runs[rung.name]]
                for rung in self.measured}

    def tokens_per_s(self) -> dict[str, list[float]]:
        return {rung.name: [m.output_tokens_per_s for m in self.runs[rung.name]] for rung in self.measured}


def run_ladder_repeats(
    workload, rungs: Sequence[Rung] = LADDER, *, model=None, device=None, max_num_seqs: int = 8,
    num_repeats: int = 5, machine: str | None = None, progress: bool = False, **common: Any,
) -> LadderRepeats:
    """Every runnable rung, `num_repeats` times, in rotated order (see the module docstring)."""
    from minilm_engine.course.baselines import BaselineLLM

    composed = compose(rungs)
    out = LadderRepeats([rung for rung, _ in composed])
    runnable = []
    for rung, reason in composed:
        if reason:
            out.reasons[rung.name] = reason
        else:
            runnable.append(rung)
            out.runs[rung.name] = []
    for repeat in range(num_repeats):
        shift = repeat % max(1, len(runnable))
        for rung in runnable[shift:] + runnable[:shift]:
            if rung.name in out.reasons:  # refused on an earlier repeat
                continue
            kwargs, settings = rung_arguments(rung, common, max_num_seqs)
            try:
                llm = BaselineLLM(model, device=device, **kwargs)
            except (ValueError, TypeError, NotImplementedError) as e:
                out.reasons[rung.name] = f"refused by this version: {type(e).__name__}: {e}"
                out.runs[rung.name] = []
                continue
            out.runs[rung.name].append(measure_workload(llm, workload, settings, machine=machine))
            del llm
            gc.collect()
        if progress:
            print(f"repeat {repeat + 1}/{num_repeats}: " + ", ".join(
                f"{r.name} {out.runs[r.name][-1].output_tokens_per_s:.0f}" for r in runnable if out.runs.get(r.name))
                  + " output tok/s", flush=True)
    return out
