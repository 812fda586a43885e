"""course/experiments/tiers.py (the tier measurement) and course/ledger/tiers.py (the batch tier's price from it).

What is checked is what the run reports and the arithmetic of the price, never the timings.
"""

from __future__ import annotations

import pytest

from minilm_engine.course.experiments.cost import cost_per_million_tokens
from minilm_engine.course.experiments.tiers import (
    TierRun,
    TiersResult,
    TierWorkload,
    measure_tiers,
    p99_ttft_ratio,
    tiers_table,
)
from minilm_engine.course.ledger import Prices
from minilm_engine.course.ledger.tiers import batch_tier_price, with_measured_batch_discount

SMALL = TierWorkload(num_interactive=3, interactive_rate=50.0, interactive_output_len=4, num_batch=4,
                     batch_output_len=8)


def test_a_small_run_reports_every_condition_and_leaves_nothing_behind():
    result = measure_tiers(SMALL, num_repeats=2, max_num_seqs=2)
    assert set(result.runs) == {("fcfs", False), ("fcfs", True), ("priority", False), ("priority", True)}
    for (policy, backlog), runs in result.runs.items():
        assert len(runs) == 2
        for run in runs:
            assert (run.policy, run.with_backlog) == (policy, backlog)
            assert len(run.ttft_s) == 3 and all(t > 0 for t in run.ttft_s)
            assert len(run.itl_s) == 3 * (4 - 1) and run.interactive_tokens == 12
            assert run.batch_tokens == (4 * 8 if backlog else 0)
            assert (run.batch_makespan_s > 0) == backlog and run.wall_s >= run.batch_makespan_s
    table = tiers_table(result)
    assert list(table["policy"]) == ["fcfs", "fcfs", "priority", "priority"]
    assert list(table["batch tok/s"])[0] == "-" and "[" in list(table["batch tok/s"])[1]
    assert p99_ttft_ratio(result) > 0
    price = batch_tier_price(result, Prices(gpu_cost_per_hour=1.0))
    assert 0 <= price.discount < 1


def fake_run(policy: str, backlog: bool, total_tok_s: float) -> TierRun:
    return TierRun(policy, backlog, ttft_s=[0.1], itl_s=[0.01], interactive_tokens=int(total_tok_s),
                   batch_tokens=0, batch_makespan_s=0.0, wall_s=1.0, num_preemptions=0)


def test_the_batch_discount_is_the_share_of_cost_the_backlog_saves():
    result = TiersResult(SMALL, {
        ("priority", False): [fake_run("priority", False, t) for t in (90.0, 100.0, 400.0)],  # median 100
        ("priority", True): [fake_run("priority", True, t) for t in (380.0, 400.0, 10.0)],  # median 380
    })
    prices = Prices(gpu_cost_per_hour=2.0, utilization=0.5, input_price_per_mtok=1.0, output_price_per_mtok=4.0)
    price = batch_tier_price(result, prices)
    assert price.interactive_tokens_per_s == 100.0 and price.with_backlog_tokens_per_s == 380.0
    assert price.discount == pytest.approx(1 - 100 / 380)
    assert price.interactive_cost_per_mtok == pytest.approx(cost_per_million_tokens(4.0, 100.0))
    assert price.with_backlog_cost_per_mtok == pytest.approx(price.interactive_cost_per_mtok * (1 - price.discount))
    measured = with_measured_batch_discount(prices, result)
    assert measured.batch_discount == pytest.approx(1 - 100 / 380)
    assert (measured.gpu_cost_per_hour, measured.output_price_per_mtok) == (2.0, 4.0)
    # A backlog that bought nothing (noise): no discount, never a negative one.
    result.runs[("priority", True)] = [fake_run("priority", True, 50.0)]
    assert batch_tier_price(result, prices).discount == 0.0


def test_a_bad_workload_is_refused():
    with pytest.raises(ValueError, match="num_batch must be >= 1"):
        TierWorkload(num_batch=0)
    with pytest.raises(ValueError, match="interactive_rate must be > 0"):
        TierWorkload(interactive_rate=0)
