"""Chapter 04's judgment exercise: pick the chunked-prefill token budget for an ITL target.

Contract: a `sweep` is a list of rows, one per `max_num_batched_tokens` tried, as
`experiments.prefill.budget_sweep` measures them on the engine:

    {"max_num_batched_tokens": 64, "p99_itl_s": 0.074, "mean_itl_s": 0.033, "long_ttft_s": 0.87}

(streams decoding, one long prompt arriving among them; ITL over the streams' gaps while the
prompt is in the system, TTFT the long prompt's).  The task: the budget that keeps the streams'
P99 ITL within `p99_itl_target_s` and, among those, gives the long prompt the shortest TTFT;
`None` when no budget does.  `num_decoding` streams take one token of every step's budget each,
so a budget of `num_decoding` or less leaves the prompt nothing (and below it, some streams wait).

    check(pick_budget)         the learner's rule on the stored cases (fixtures/budget_tradeoff.json,
                               written by hand, each with the picks of the usual wrong rules)
    check_pick(budget, sweep, p99_itl_target_s, num_decoding)
                               the value the learner read off their own sweep

Either answers a wrong pick with the mistake it shows: judged by the mean ITL, ignored the TTFT
(a safe budget that makes the long prompt wait longer than it must), a budget below one decode
batch, a P99 over the target, a budget not in the sweep.  There is no function here that returns
the right budget: `judge_pick` judges one pick.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from minilm_engine.course.teaching.exercises import FIXTURES_DIR, CheckResult

NAME = "pick_budget"
FIXTURE = "budget_tradeoff"
SOLUTIONS = "04_prefill_vs_decode_solutions.ipynb"

TASK = """def pick_budget(sweep, p99_itl_target_s, num_decoding) -> int | None
  sweep: one row per max_num_batched_tokens tried, with the streams' p99_itl_s and mean_itl_s
  and the long prompt's long_ttft_s (seconds). num_decoding streams were decoding.
  Return the budget you would deploy for a P99 ITL target of p99_itl_target_s, or None if
  no budget meets it."""

HINT = ("An SLO is a promise about the tail, not the average: a stall hits few tokens and hides "
        "in a mean. Every budget that keeps the promise is acceptable to the streams; the long "
        "prompt's user is the one who tells them apart. And a step's budget pays the decode "
        "tokens first: a prompt only gets what they leave.")

# Mistake names, as the tests and the worked solution refer to them.
MEAN_ITL = "judged by the mean ITL"
IGNORED_TTFT = "ignored the TTFT"
BELOW_DECODE_BATCH = "budget below one decode batch"
MISSED_TARGET = "P99 ITL over the target"
NOT_SWEPT = "not a swept budget"
SAID_NONE = "said none meets the target"
WRONG_TYPE = "not a budget"
NOT_PICKED = "not picked yet"


def _rows(sweep: list[dict]) -> dict[int, dict]:
    return {int(r["max_num_batched_tokens"]): r for r in sweep}


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.0f} ms"


def _meets(row: dict, target: float, num_decoding: int) -> bool:
    return row["max_num_batched_tokens"] > num_decoding and row["p99_itl_s"] <= target


def judge_pick(pick: Any, sweep: list[dict], p99_itl_target_s: float, num_decoding: int) -> tuple[str | None, str]:
    """(mistake or None, feedback) for one pick on one sweep."""
    rows = _rows(sweep)
    meeting = [r for r in rows.values() if _meets(r, p99_itl_target_s, num_decoding)]
    best_ttft = min((r["long_ttft_s"] for r in meeting), default=None)
    target = _ms(p99_itl_target_s)
    if pick is Ellipsis:
        return NOT_PICKED, f"{NOT_PICKED}: replace the ... with the budget you would deploy (or None)"
    if pick is None:
        if best_ttft is None:
            return None, f"right: no budget keeps the P99 ITL within {target} (chunking alone cannot do it here)"
        ok = sorted(r["max_num_batched_tokens"] for r in meeting)
        return SAID_NONE, (f"{SAID_NONE}: budgets {ok} keep the streams' P99 ITL within {target}; "
                           "read the p99 column against the target")
    if isinstance(pick, bool) or not isinstance(pick, int | float) or not math.isfinite(pick) or pick != int(pick):
        return WRONG_TYPE, f"{WRONG_TYPE}: return one of the swept max_num_batched_tokens (an int) or None, got {pick!r}"
    pick = int(pick)
    if pick not in rows:
        return NOT_SWEPT, f"{NOT_SWEPT}: {pick} was not measured; pick one of {sorted(rows)}"
    row = rows[pick]
    if pick <= num_decoding:
        return BELOW_DECODE_BATCH, (
            f"{BELOW_DECODE_BATCH}: {num_decoding} streams take one token each of every step's budget, so a "
            f"budget of {pick} leaves the long prompt {max(pick - num_decoding, 0)} tokens a step"
            + (" and makes some streams skip steps (their one long wait is under 1% of the gaps, so "
               "the P99 does not show it)" if pick < num_decoding else "")
            + f"; its TTFT is {_ms(row['long_ttft_s'])}")
    if row["p99_itl_s"] > p99_itl_target_s:
        if row["mean_itl_s"] <= p99_itl_target_s:
            return MEAN_ITL, (
                f"{MEAN_ITL}: at {pick} the mean ITL is {_ms(row['mean_itl_s'])}, within {target}, but the "
                f"P99 is {_ms(row['p99_itl_s'])}: the stalls are a few gaps, and the target is on the tail")
        return MISSED_TARGET, (f"{MISSED_TARGET}: at {pick} the streams' P99 ITL is {_ms(row['p99_itl_s'])}, "
                               f"over the {target} target")
    if row["long_ttft_s"] > best_ttft:
        best = min(meeting, key=lambda r: r["long_ttft_s"])
        return IGNORED_TTFT, (
            f"{IGNORED_TTFT}: {pick} meets the target, but so does {best['max_num_batched_tokens']}, and with "
            f"it the long prompt's first token comes after {_ms(best['long_ttft_s'])} instead of "
            f"{_ms(row['long_ttft_s'])}: a margin on ITL nobody asked for, paid by the long prompt's user")
    return None, (f"right: {pick} keeps the P99 ITL at {_ms(row['p99_itl_s'])} (target {target}) with the "
                  f"shortest TTFT of those that do, {_ms(row['long_ttft_s'])}")


def cases() -> list[dict]:
    return json.loads((FIXTURES_DIR / f"{FIXTURE}.json").read_text())


def check(pick_budget: Callable[..., Any]) -> CheckResult:
    """Run the learner's rule on every stored case; the first wrong pick is explained."""
    if not callable(pick_budget):
        return CheckResult(False, 0, f"{NAME}: pass your function itself, got {pick_budget!r}")
    stored = cases()
    for i, case in enumerate(stored):
        inputs = case["inputs"]
        try:
            pick = pick_budget(json.loads(json.dumps(inputs["sweep"])), inputs["p99_itl_target_s"],
                               inputs["num_decoding"])  # a copy: the rule may not edit the case
        except NotImplementedError:
            return CheckResult(False, i, f"{NAME}: not implemented yet")
        except Exception as e:  # noqa: BLE001 - the learner's bug, reported rather than raised
            return CheckResult(False, i, f"{NAME} raised {type(e).__name__}: {e} on case {i + 1} ({case['story']})")
        mistake, feedback = judge_pick(pick, inputs["sweep"], inputs["p99_itl_target_s"], inputs["num_decoding"])
        if mistake is not None or pick != case["expected"]:
            return CheckResult(False, i, f"{NAME}, case {i + 1} ({case['story']}): you picked {pick!r}. {feedback}")
    return CheckResult(True, len(stored), f"{NAME}: the right budget in all {len(stored)} stored cases")


def check_pick(budget: Any, sweep: list[dict], p99_itl_target_s: float, num_decoding: int) -> CheckResult:
    """Judge the budget the learner chose from their own measured sweep."""
    mistake, feedback = judge_pick(budget, sweep, p99_itl_target_s, num_decoding)
    return CheckResult(mistake is None, 1, f"your pick {budget!r} on your sweep: {feedback}")


def task() -> str:
    return f"{TASK}\n\nHint: {HINT}\nWorked solution: notebooks/solutions/{SOLUTIONS}"


def hint() -> str:
    return HINT
