"""Tests for minilm_engine.course.ledger.ladder: rungs as data, missing rungs reported, never invented."""

from __future__ import annotations

import pytest

from minilm_engine.course.experiments.workloads import LengthMix
from minilm_engine.course.ledger import Measurement, Prices, Provenance
from minilm_engine.course.ledger.ladder import (
    LADDER,
    Rung,
    RungResult,
    compose,
    engine_arguments,
    ladder_rows,
    ladder_workload,
    missing_arguments,
    run_ladder,
    verdicts,
)

SHORT = LengthMix(short=(2, 4), long=(8, 10), long_fraction=0.3)


def test_the_ladder_is_the_issues_order() -> None:
    assert [r.name for r in LADDER] == [
        "no KV cache", "KV cache", "static batching", "continuous batching", "+ prefix caching",
        "+ quantization", "+ speculative decoding"]
    composed = compose(LADDER)
    # From continuous batching on, each rung keeps what the last runnable one before it had.
    runnable = [rung for rung, reason in composed[3:] if not reason]
    for before, after in zip(runnable, runnable[1:]):
        dropped = {k for k, v in before.llm_kwargs.items() if after.llm_kwargs.get(k) != v}
        assert dropped <= {"enable_prefix_caching"}, (before.name, dropped)
    assert composed[4][0].llm_kwargs == {"strategy": "continuous", "enable_prefix_caching": True}


def test_compose_builds_on_the_last_rung_that_can_run() -> None:
    rungs = [Rung("a", "first", {"strategy": "continuous"}),
             Rung("b", "missing", {"warp_drive": 9}),
             Rung("c", "third", {"enable_prefix_caching": False})]
    (a, ra), (b, rb), (c, rc) = compose(rungs)
    assert ra == rc == "" and rb.endswith("['warp_drive']")
    assert c.llm_kwargs == {"strategy": "continuous", "enable_prefix_caching": False}
    assert "without b: not in this version" in c.adds


def test_missing_arguments_follow_the_engine() -> None:
    assert {"strategy", "max_num_seqs", "enable_prefix_caching"} <= engine_arguments()
    for rung in LADDER[:5]:
        assert missing_arguments(rung) == []
    assert missing_arguments(Rung("x", "y", {"warp_drive": 9})) == ["warp_drive"]
    expected = [a for a in ("quantization",) if a not in engine_arguments()]
    assert missing_arguments(LADDER[5]) == expected


def test_ladder_workload_shares_a_prefix() -> None:
    w = ladder_workload(6, seed=1, shared_prefix="HOUSE RULES\n", mix=SHORT)
    assert w.num_requests == 6 and all(p.startswith("HOUSE RULES\n") for p in w.prompts)
    assert len(set(w.prompts)) > 1 and all(2 <= n <= 10 for n in w.output_lens)


@pytest.mark.slow
def test_run_ladder_measures_available_rungs_and_reports_the_rest(checkpoints) -> None:
    workload = ladder_workload(4, seed=0, shared_prefix="the same opening words " * 3, mix=SHORT)
    rungs = [*LADDER[:5], Rung("+ warp drive", "nothing real", {"warp_drive": True}),
             Rung("+ a bad setting", "refused", {**LADDER[4].llm_kwargs, "block_size": 0})]
    results = run_ladder(workload, rungs, model=checkpoints["llama"].path, max_num_seqs=2,
                         machine="test box", num_kv_blocks=64)
    assert [r.available for r in results] == [True] * 5 + [False, False]
    assert "not available in this version" in results[-2].reason
    assert results[-2].reason.endswith("['warp_drive']")
    assert results[-1].reason.startswith("refused by this version: ValueError: block_size")
    for r in results[:5]:
        m = r.measurement
        assert m.num_output_tokens == workload.num_output_tokens and m.num_requests == 4
        assert m.provenance.machine == "test box" and m.provenance.settings["rung"] == r.rung.name
        assert m.mean_e2e_s > 0 and 99 in m.e2e_s
    computed = [r.measurement.num_computed_tokens for r in results[:5]]
    assert computed[0] > computed[1] and computed[2] >= computed[1]  # recompute, padding
    continuous, prefix = results[3].measurement, results[4].measurement
    assert prefix.num_computed_tokens < continuous.num_computed_tokens  # the prefix is reused
    assert prefix.peak_kv_blocks > 0 and results[1].measurement.peak_kv_blocks is None
    assert continuous.num_cached_input_tokens == 0 and prefix.num_cached_input_tokens > 0
    assert prefix.provenance.settings["max_num_seqs"] == 2
    assert "max_num_seqs" not in results[1].measurement.provenance.settings

    rows = ladder_rows(results, Prices(2.0))
    assert rows[0]["x first rung"] == 1.0 and rows[-1]["output tokens/s"] is None
    assert rows[-2]["note"] == results[-2].reason
    for row, r in zip(rows[:5], results):
        tps = r.measurement.output_tokens_per_s
        assert row["cost $/Mtok"] == pytest.approx(2.0 / (tps * 3600) * 1e6)


def fake(name: str, tokens_per_s: float) -> RungResult:
    rung = next(r for r in LADDER if r.name == name)
    m = Measurement(Provenance("box", "m"), num_requests=1, num_input_tokens=10,
                    num_output_tokens=int(tokens_per_s * 10), duration_s=10.0)
    return RungResult(rung, m)


def test_verdicts_compare_with_both_baselines() -> None:
    prices = Prices(3.6)
    results = [fake("no KV cache", 10), fake("KV cache", 100), fake("continuous batching", 1200),
               RungResult(LADDER[5], None, "not available")]
    throughput, cost = verdicts(results, prices)
    assert throughput.verdict == "held" and "12.00x" in throughput.measured
    assert cost.verdict == "held" and "$10.000 (KV cache)" in cost.measured  # $3.60 / 0.36 M tokens an hour
    results[2] = fake("continuous batching", 250)
    throughput, cost = verdicts(results, prices)
    assert throughput.verdict == "partly" and cost.verdict == "partly"  # 25x and 2.5x
    throughput, cost = verdicts([fake("KV cache", 100), fake("static batching", 150)], prices)
    assert throughput.verdict == "not held" and cost.verdict == "not held"
    with pytest.raises(ValueError, match="no rung"):
        verdicts([RungResult(LADDER[0], None, "x")], prices)


def test_computed_tokens_by_hand() -> None:
    from types import SimpleNamespace

    from minilm_engine.course.ledger.ladder import computed_tokens

    def out(p: int, o: int):
        return SimpleNamespace(prompt_token_ids=[0] * p, outputs=[SimpleNamespace(token_ids=[0] * o)])

    outputs = [out(5, 3), out(2, 4), out(7, 1)]
    # no cache: (5 + 6 + 7) + (2 + 3 + 4 + 5) + 7 = 39
    assert computed_tokens("no_cache", outputs, 1) == 39
    # KV cache: (5 + 2) + (2 + 3) + (7 + 0) = 19
    assert computed_tokens("kv_cache", outputs, 1) == 19
    # static, 2 rows: batch 1 pads to 5 prompt + 3 decode steps: 2 * 8; batch 2: 1 * (7 + 0)
    assert computed_tokens("static_batch", outputs, 2) == 16 + 7
    with pytest.raises(ValueError, match="continuous"):
        computed_tokens("continuous", outputs, 2)
