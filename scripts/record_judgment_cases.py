"""Record the judgment exercises' stored cases from the real engine, and answer them.

    python scripts/record_judgment_cases.py            # both fixtures
    python scripts/record_judgment_cases.py diagnosis  # or fleet

diagnosis (chapter 07, course/teaching/fixtures/diagnosis_cases.json): the shipped chef served step by
step, with arrivals at chosen steps, under limits that cause one latency spike each (a long
prefill, a preemption, a full KV pool, a full batch); the engine's trace becomes the case's
steps (`judgment_diagnosis.steps_table`), and the answer is read off the trace by the
definitions below (and checked against what the scenario did: a case whose trace does not show
its cause is an error, not a stored case).

fleet (chapter 08, course/teaching/fixtures/fleet_cases.json): one measured sweep of the chef over
`max_num_seqs` (the ladder's workload, every request at once, ledger.measure_workload) and
sizing questions over it (a load, an SLO, a price); the answer is the batch limit that meets
the SLO with the fewest replicas, that many replicas, and the fleet's cost per million tokens.

The answers are computed here, in a script, and stored: no package import returns them.
"""

from __future__ import annotations

import json
import math
import random
import sys
from pathlib import Path

import torch

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments.prefill import corpus_token_ids
from minilm_engine.course.teaching.exercises import FIXTURES_DIR
from minilm_engine.course.teaching.judgment_diagnosis import steps_table


def _prompt(llm, num_tokens: int, seed: int) -> dict:
    return {"prompt_token_ids": corpus_token_ids(llm.tokenizer, num_tokens, seed)}


def _serve(llm, arrivals: dict[int, list[tuple[str, dict, SamplingParams]]]) -> list[dict]:
    """Step the engine, adding each request just before its step; the steps as table rows."""
    engine = llm.engine
    engine.trace.clear()
    step, added = 0, {}
    while True:
        for rid, prompt, params in arrivals.get(step, []):
            engine.add_request(rid, prompt, params)
            added.setdefault(step, []).append(rid)
        if not engine.has_unfinished_requests() and step > max(arrivals):
            break
        if engine.has_unfinished_requests():
            engine.step()
        step += 1
    assert engine.block_pool.num_used_blocks == 0, "a case must end with every block back in the pool"
    return steps_table(engine.trace.records, added)


def _answer(steps: list[dict], cause: str, limits: dict) -> int:
    """The step where `cause` started, by the definitions of the exercise."""
    if cause == "long prefill":
        row = max(steps, key=lambda r: r["prefill tokens"])
        slowest = max(steps, key=lambda r: r["duration ms"])
        assert row["step"] == slowest["step"], "the long prefill must be the slowest step"
        assert not any(r["preempted"] for r in steps)
        return row["step"]
    if cause == "preemption":
        return next(r["step"] for r in steps if r["preempted"])
    assert not any(r["preempted"] for r in steps), f"a {cause} case must not preempt"
    first = next(r for r in steps if r["waiting"] > 0)
    if cause == "full batch":
        assert first["running"] == limits["max_num_seqs"]
    else:
        assert first["running"] < limits["max_num_seqs"]
    return first["step"]


def diagnosis_cases() -> list[dict]:
    torch.set_num_threads(1)
    rng = random.Random(0)
    cases = []
    greedy = lambda n: SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)  # noqa: E731
    for index in range(2):
        seed = 10 * index
        # 1. A long prompt computed in one step, while short requests decode.
        at = rng.randint(6, 12)
        limits = {"max_num_seqs": 8, "block_size": 16}
        llm = LLM(None, max_num_seqs=8, enable_chunked_prefill=False, max_num_batched_tokens=1024,
                  enable_prefix_caching=False, num_kv_blocks=256)
        arrivals = {0: [(f"r{i}", _prompt(llm, 20 + 3 * i, seed + i), greedy(40)) for i in range(6)],
                    at: [("r6", _prompt(llm, 900, seed + 99), greedy(4))]}
        cases.append(("long prefill", llm, arrivals, {**limits, "num_blocks": 256}))
        # 2. The pool runs out while requests decode: one is preempted, recomputed later.
        num_blocks = 36 + 8 * index
        llm = LLM(None, max_num_seqs=8, num_kv_blocks=num_blocks, enable_prefix_caching=False)
        arrivals = {s: [(f"r{2 * s + j}", _prompt(llm, 40 + 5 * j + 7 * index, seed + 2 * s + j),
                         greedy(110 + 10 * j + 20 * index)) for j in range(2)] for s in range(3)}
        cases.append(("preemption", llm, arrivals, {"max_num_seqs": 8, "block_size": 16, "num_blocks": num_blocks}))
        # 3. Seats free, blocks gone: long prompts fill the pool, newcomers wait for blocks.
        llm = LLM(None, max_num_seqs=16, num_kv_blocks=40 + 7 * index, enable_prefix_caching=False)
        arrivals = {s: [(f"r{s}", _prompt(llm, 100, seed + s), greedy(8))] for s in range(12)}
        cases.append(("full pool", llm, arrivals, {"max_num_seqs": 16, "block_size": 16, "num_blocks": 40 + 7 * index}))
        # 4. Blocks free, seats gone: a small max_num_seqs, newcomers wait for a seat.
        llm = LLM(None, max_num_seqs=4, num_kv_blocks=256, enable_prefix_caching=False)
        arrivals = {s: [(f"r{s}", _prompt(llm, 24, seed + s), greedy(24 + 4 * index))] for s in range(10)}
        cases.append(("full batch", llm, arrivals, {"max_num_seqs": 4, "block_size": 16, "num_blocks": 256}))
    stored = []
    for number, (cause, llm, arrivals, limits) in enumerate(cases):
        steps = _serve(llm, arrivals)
        stored.append({"name": f"trace {chr(ord('A') + number)}", "limits": limits, "steps": steps,
                       "expected": {"cause": cause, "step": _answer(steps, cause, limits)}})
    order = list(range(len(stored)))
    random.Random(1).shuffle(order)  # not in cause order: the case's position must not tell
    return [{**stored[i], "name": f"trace {chr(ord('A') + k)}"} for k, i in enumerate(order)]


def fleet_sweep() -> list[dict]:
    from minilm_engine.course.ledger import ladder

    torch.set_num_threads(1)
    workload = ladder.ladder_workload(32, seed=0)
    sweep = []
    for seats in (1, 2, 4, 8, 16, 32):
        settings = dict(max_num_seqs=seats, enable_prefix_caching=True)
        m = ladder.measure_workload(LLM(None, **settings), workload, settings)
        sweep.append({"max_num_seqs": seats, "tokens_per_s": round(m.output_tokens_per_s, 1),
                      "p99_tpot_ms": round(1e3 * m.tpot_s[99], 2), "p99_ttft_ms": round(1e3 * m.ttft_s[99], 1)})
    return sweep


def fleet_answer(sweep, target_tokens_per_s, slo, price_per_hour, utilization):
    meeting = [p for p in sweep if p["p99_tpot_ms"] <= slo["p99_tpot_ms"] and p["p99_ttft_ms"] <= slo["p99_ttft_ms"]]
    if not meeting:
        return None
    replicas = {p["max_num_seqs"]: math.ceil(target_tokens_per_s / p["tokens_per_s"]) for p in meeting}
    fewest = min(replicas.values())
    cost = fewest * price_per_hour / (target_tokens_per_s * utilization * 3600) * 1e6
    return {"max_num_seqs": sorted(b for b, n in replicas.items() if n == fewest), "num_replicas": fewest,
            "cost_per_mtok": cost}


def fleet_cases(num_cases: int = 12) -> list[dict]:
    sweep = fleet_sweep()
    rng = random.Random(0)

    def between(values: list[float]) -> list[float]:
        """Limits that fall between two measured values (and one above them all): each cuts
        the sweep at a different row."""
        v = sorted(values)
        return [round((a + b) / 2, 1) for a, b in zip(v, v[1:])] + [round(v[-1] * 1.1, 1)]

    tpot_limits, ttft_limits = between([p["p99_tpot_ms"] for p in sweep]), between([p["p99_ttft_ms"] for p in sweep])
    cases = []
    for i in range(num_cases):
        if i == num_cases - 1:  # an SLO no batch limit meets
            slo = {"p99_tpot_ms": round(min(p["p99_tpot_ms"] for p in sweep) * 0.8, 1),
                   "p99_ttft_ms": ttft_limits[-1]}
        else:
            slo = {"p99_tpot_ms": rng.choice(tpot_limits), "p99_ttft_ms": rng.choice(ttft_limits)}
        inputs = {"sweep": sweep, "target_tokens_per_s": float(rng.randrange(1_000, 40_000, 250)), "slo": slo,
                  "price_per_hour": rng.choice([0.1, 0.4, 2.5, 4.0]), "utilization": rng.choice([1.0, 0.7, 0.5])}
        expected = fleet_answer(**inputs)
        while i < num_cases - 1 and expected is None:  # a question with an answer: loosen TTFT
            slo["p99_ttft_ms"] = rng.choice(ttft_limits[ttft_limits.index(slo["p99_ttft_ms"]):])
            slo["p99_tpot_ms"] = rng.choice(tpot_limits[tpot_limits.index(slo["p99_tpot_ms"]):])
            expected = fleet_answer(**inputs)
        cases.append({"inputs": inputs, "expected": expected})
    return cases


def write(name: str, cases: list[dict]) -> Path:
    path = FIXTURES_DIR / f"{name}.json"
    lines = ",\n".join(json.dumps(c) for c in cases)
    path.write_text(f"[\n{lines}\n]\n")
    return path


if __name__ == "__main__":
    which = sys.argv[1:] or ["diagnosis", "fleet"]
    if "diagnosis" in which:
        print("wrote", write("diagnosis_cases", diagnosis_cases()))
    if "fleet" in which:
        print("wrote", write("fleet_cases", fleet_cases()))
