"""Write minilm_engine/course/teaching/fixtures/sizing_cases.json: chapter 01's sizing judgment cases.

    python scripts/make_sizing_cases.py --measure   # measure the engine's step table (minutes), then write
    python scripts/make_sizing_cases.py             # keep the stored table, redraw the cases

The step table is measured on the package's continuous engine (the shipped noodle-chef, one
torch thread): for each batch size, every step of `engine_decode_sweep` rounds gives the mean and
the P99 of a decode step, and a long prompt's prefill gives the cost of one prompt token.  The
cases (a load, an SLO on P99 TPOT) are answered here, outside the package, together with the
answers each usual mistake gives, so the checker (`course/teaching/judgment_sizing.py`) holds no
formula and no package import returns an expected value.  tests/test_judgment_sizing.py
redraws the cases from the stored table and compares.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "minilm_engine" / "teaching" / "fixtures" / "sizing_cases.json"
NUM_CASES = 24
SEED = 0
BATCH_SIZES = [1, 2, 4, 8, 16, 32, 64]


def measure_table(num_rounds: int = 5, num_steps: int = 40) -> dict:
    import torch

    from minilm_engine import LLM, SamplingParams
    from minilm_engine.course.experiments.batching import engine_decode_sweep, hardware_summary, percentile

    torch.set_num_threads(1)
    llm = LLM("noodle-chef", max_num_seqs=max(BATCH_SIZES), num_kv_blocks=max(BATCH_SIZES) * 16)
    timings = engine_decode_sweep(llm, BATCH_SIZES, num_steps=num_steps, num_rounds=num_rounds)
    rows = [{"batch": t.batch_size, "mean_step_ms": round(1e3 * statistics.fmean(t.steps_s), 2),
             "p99_step_ms": round(1e3 * percentile(list(t.steps_s), 99), 2), "num_steps": len(t.steps_s)}
            for t in timings]
    prompt = " ".join(["The Golden Bowl is open every day from eleven until late."] * 16)
    ttfts, num_prompt_tokens = [], 0
    for _ in range(3):
        (out,) = llm.generate(prompt, SamplingParams(max_tokens=1, temperature=0), use_tqdm=False)
        ttfts.append(out.metrics.ttft)
        num_prompt_tokens = len(out.prompt_token_ids)
    return {"measured_on": f"minilm-engine continuous engine, noodle-chef, {hardware_summary('cpu')}",
            "steps": rows, "prefill_ms_per_token": round(1e3 * statistics.median(ttfts) / num_prompt_tokens, 4)}


# -- the reference answer and the usual mistakes (kept out of the package) -------------------------


def _largest_batch(table: dict, slo_ms: float, key: str) -> int | None:
    fits = [row["batch"] for row in table["steps"] if row[key] <= slo_ms]
    return max(fits) if fits else None


def _step(table: dict, batch: int, key: str) -> float:
    return next(row[key] for row in table["steps"] if row["batch"] == batch)


def _replicas(load: dict, table: dict, batch: int, step_key: str = "mean_step_ms", prefill: bool = True,
              step_batch: int | None = None, rounding=math.ceil) -> int:
    """Each replica serves `batch` requests at a time; a request holds its seat for its output
    tokens, one per step (a step serves `batch` tokens), and its prompt costs prefill time."""
    step_ms = _step(table, batch if step_batch is None else step_batch, step_key)
    replica_ms_per_request = load["output_tokens"] * step_ms / batch
    if prefill:
        replica_ms_per_request += load["prompt_tokens"] * table["prefill_ms_per_token"]
    capacity = 1e3 / replica_ms_per_request  # requests/s one replica completes
    return int(rounding(load["requests_per_s"] / capacity - 1e-9))


def answer(case: dict, table: dict) -> dict:
    slo = case["slo"]["p99_tpot_ms"]
    batch = _largest_batch(table, slo, "p99_step_ms")
    return {"max_num_seqs": batch, "num_replicas": _replicas(case["load"], table, batch)}


def mistakes(case: dict, table: dict) -> dict[str, dict]:
    load, slo = case["load"], case["slo"]["p99_tpot_ms"]
    right = _largest_batch(table, slo, "p99_step_ms")
    by_mean = _largest_batch(table, slo, "mean_step_ms")
    largest = max(row["batch"] for row in table["steps"])
    return {
        "mean_not_p99": {"max_num_seqs": by_mean, "num_replicas": _replicas(load, table, by_mean)},
        "flat_step": {"max_num_seqs": largest, "num_replicas": _replicas(load, table, largest, step_batch=1)},
        "no_ceiling": {"max_num_seqs": right, "num_replicas": _replicas(load, table, right, rounding=math.floor)},
        "no_prefill": {"max_num_seqs": right, "num_replicas": _replicas(load, table, right, prefill=False)},
        "p99_for_capacity": {"max_num_seqs": right,
                             "num_replicas": _replicas(load, table, right, step_key="p99_step_ms")},
    }


def draw_cases(table: dict, num_cases: int = NUM_CASES, seed: int = SEED) -> list[dict]:
    """Loads and SLOs drawn so that every mistake gives a wrong answer in several cases: an SLO
    between a batch's mean and its P99 step, loads of many replicas' worth."""
    rng = random.Random(seed)
    steps = table["steps"]
    cases = []
    while len(cases) < num_cases:
        row = rng.choice(steps[1:])
        slo = round(rng.uniform(min(row["mean_step_ms"], row["p99_step_ms"]), max(row["mean_step_ms"], row["p99_step_ms"]) * 1.1), 1)
        batch = _largest_batch(table, slo, "p99_step_ms")
        if batch is None or any(r["p99_step_ms"] > slo for r in steps if r["batch"] < batch):
            continue  # (a noisy table can have a smaller batch miss the SLO: no case hangs on that)
        case = {"load": {"requests_per_s": round(rng.uniform(0.5, 12.0), 2),
                         "prompt_tokens": rng.choice([64, 128, 256, 512, 1024]),
                         "output_tokens": rng.choice([32, 64, 128, 256])},
                "slo": {"p99_tpot_ms": slo}}
        right = answer(case, table)
        wrong = {name: a for name, a in mistakes(case, table).items() if a != right}
        if not wrong:
            continue  # a case no mistake gets wrong teaches nothing
        cases.append({**case, "expected": right, "mistakes": wrong})
    return cases


def build(table: dict) -> dict:
    return {"table": table, "cases": draw_cases(table)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", action="store_true", help="measure the step table again (minutes)")
    args = parser.parse_args(argv)
    table = measure_table() if args.measure else json.loads(FIXTURE.read_text())["table"]
    FIXTURE.write_text(json.dumps(build(table), indent=1) + "\n")
    data = json.loads(FIXTURE.read_text())
    counts = {}
    for case in data["cases"]:
        for name in case["mistakes"]:
            counts[name] = counts.get(name, 0) + 1
    print(f"{FIXTURE.relative_to(ROOT)}: {len(data['cases'])} cases; wrong answers per mistake: {counts}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    sys.exit(main())
