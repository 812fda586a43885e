"""Tests for minilm_engine.course.experiments.cost: the ledger's arithmetic, throughput, receipts."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine import LLM
from minilm_engine.course.noodle_corpus import make_receipt
from minilm_engine.course.experiments import cost
from minilm_engine.course.experiments.cost import (
    audit_receipt,
    cost_per_million_tokens,
    cost_table,
    measure_throughput,
    measure_throughput_rounds,
    median_run,
    throughput_figure,
    tokens_per_second_needed,
    unit_cost,
)

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)


def test_the_noodle_shop_ledger() -> None:
    assert unit_cost(120_000, 10_000) == 12
    assert unit_cost(120_000, 20_000) == 6


def test_cost_per_million_tokens_by_hand() -> None:
    # 1,000 tokens/s is 3.6 million tokens an hour: at $3.60/h a million cost $1.
    assert cost_per_million_tokens(3.6, 1000) == pytest.approx(1.0)
    assert tokens_per_second_needed(100, 10) == pytest.approx(2777.78, abs=0.01)


@given(price=positive, speed=positive)
def test_tokens_per_second_needed_inverts_the_cost(price: float, speed: float) -> None:
    cost = cost_per_million_tokens(price, speed)
    assert math.isclose(tokens_per_second_needed(price, cost), speed, rel_tol=1e-9)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "3"])
def test_bad_numbers_are_refused(bad) -> None:
    with pytest.raises(ValueError, match="price_per_hour"):
        cost_per_million_tokens(bad, 10)
    with pytest.raises(ValueError, match="num_units"):
        unit_cost(10, bad)


def test_cost_table() -> None:
    rows = cost_table({"a": 1000.0, "b": 2000.0}, {"cheap": 3.6, "dear": 36.0})
    assert [r["setup"] for r in rows] == ["a", "b"]
    assert rows[0]["cheap"] == pytest.approx(1.0) and rows[1]["dear"] == pytest.approx(5.0)


def test_measure_throughput_counts_every_token(checkpoints, prompts) -> None:
    llm = LLM(checkpoints["llama"].path)
    batched = measure_throughput(llm, prompts[:3], max_tokens=5, num_repeats=2)
    alone = measure_throughput(llm, prompts[:3], max_tokens=5, one_at_a_time=True)
    for r in (batched, alone):
        assert (r.num_requests, r.num_output_tokens) == (3, 15)
        assert r.num_prompt_tokens == sum(len(llm.tokenizer.encode(p)) for p in prompts[:3])
        assert r.output_tokens_per_s == pytest.approx(15 / r.elapsed_s)
        assert r.total_tokens_per_s > r.output_tokens_per_s
        assert r.mean_tpot_s > 0 and r.tokens_per_s_per_request == pytest.approx(1 / r.mean_tpot_s)
    with pytest.raises(ValueError, match="max_tokens"):
        measure_throughput(llm, prompts, max_tokens=0)
    with pytest.raises(ValueError, match="prompts"):
        measure_throughput(llm, [], max_tokens=3)
    figure = throughput_figure({"alone": alone, "batched": batched}, price_per_hour=1.0)
    assert list(figure.data[0].x) == ["alone", "batched"]


def test_corpus_receipts_add_up() -> None:
    rng = random.Random(0)
    for _ in range(200):
        audit = audit_receipt(make_receipt(rng))
        assert audit.adds_up, audit.problems
        assert audit.lines and audit.stated_total_cents == audit.summed_total_cents


def test_wrong_receipts_are_caught() -> None:
    good = (
        "Receipt #1\n2 x Miso Ramen @ $10.50 = $21.00\n  + 2 x corn @ $1.00 = $2.00\n"
        "1 x Green Tea @ $2.00 = $2.00\nItems: 3\nTotal: $25.00\n"
    )
    assert audit_receipt(good).adds_up
    assert audit_receipt(good).counted_items == 3  # toppings are not items
    cases = {
        "Total: $25.00": ("Total: $26.00", "Total: 26.00 stated, 25.00 summed"),
        "Items: 3": ("Items: 4", "Items: 4 stated, 3 counted"),
        "= $21.00": ("= $20.00", "2 x 10.50 != 20.00"),
        "Green Tea @ $2.00": ("Green Tea @ $2.50", "costs 2.00 on the menu"),
        "Miso Ramen @": ("Moon Ramen @", "not on the menu"),
    }
    for old, (new, problem) in cases.items():
        problems = audit_receipt(good.replace(old, new)).problems
        assert any(problem in p for p in problems), (new, problems)
    assert not audit_receipt("no receipt here").adds_up




def test_rounds_rotate_the_order_and_keep_every_run(checkpoints, prompts, monkeypatch) -> None:
    llm = LLM(checkpoints["llama"].path)
    real = measure_throughput
    order = []

    def spy(llm, prompts, max_tokens, one_at_a_time=False, num_repeats=1):
        order.append((len(prompts), one_at_a_time))
        return real(llm, prompts, max_tokens, one_at_a_time=one_at_a_time, num_repeats=num_repeats)

    monkeypatch.setattr(cost, "measure_throughput", spy)
    setups = {"alone": (prompts[:2], True), "pair": (prompts[:2], False), "one": (prompts[:1], False)}
    runs = measure_throughput_rounds(llm, setups, max_tokens=3, num_repeats=4)
    a, p, o = (2, True), (2, False), (1, False)
    assert order == [a, p, o, p, o, a, o, a, p, a, p, o]  # every setup first once per len(setups) rounds
    assert {name: len(r) for name, r in runs.items()} == {"alone": 4, "pair": 4, "one": 4}
    assert all(r.num_output_tokens == 3 * len(setups[name][0]) for name, rs in runs.items() for r in rs)
    with pytest.raises(ValueError, match="num_repeats"):
        measure_throughput_rounds(llm, setups, max_tokens=3, num_repeats=0)
    with pytest.raises(ValueError, match="setups"):
        measure_throughput_rounds(llm, {}, max_tokens=3)


def test_the_median_run_is_a_real_run() -> None:
    runs = [cost.Throughput(1, 1, 10, t, None) for t in (3.0, 1.0, 2.0, 9.0)]
    assert median_run(runs).elapsed_s == 2.0  # lower middle of 1, 2, 3, 9
    assert median_run(runs[:3]).elapsed_s == 2.0
    with pytest.raises(ValueError):
        median_run([])
