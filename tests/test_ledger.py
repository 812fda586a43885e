"""Tests for minilm_engine.course.ledger: the arithmetic against hand computations, the readers, provenance."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.experiments.cost import cost_per_million_tokens
from minilm_engine.course.ledger import (
    SLO,
    Ledger,
    Measurement,
    Prices,
    Provenance,
    fit_token_seconds,
    gpus_needed,
    monthly_cost,
    plan_fleet,
    throughput_at_slo,
)

PROV = Provenance(machine="test box", model="m", settings={"max_num_seqs": 4}, date="2026-12-01",
                  source="hand")


def measurement(**kw) -> Measurement:
    base = dict(provenance=PROV, num_requests=10, num_input_tokens=1000, num_output_tokens=2000,
                duration_s=10.0, num_cached_input_tokens=200)
    base.update(kw)
    return Measurement(**base)


PRICES = Prices(gpu_cost_per_hour=3.6, utilization=0.5, input_price_per_mtok=1.0,
                output_price_per_mtok=4.0, cached_input_discount=0.5, batch_discount=0.5)


def test_the_books_by_hand() -> None:
    books = Ledger(measurement(), PRICES, input_token_weight=0.1)
    # 10 s of serving at 50% utilization is 20 paid seconds of a $3.60/h machine: $0.02.
    assert books.paid_seconds == 20
    assert books.run_cost == pytest.approx(0.02)
    # $0.02 over 2,000 output tokens = $10 per million (= chapter 00's formula at $7.20/h, 200/s).
    assert books.blended_cost_per_mtok == pytest.approx(10.0)
    assert books.blended_cost_per_mtok == pytest.approx(cost_per_million_tokens(7.2, 200))
    # 800 computed prompt tokens weigh 80 output tokens: $0.02 / 2,080 tokens.
    assert books.output_cost_per_mtok == pytest.approx(0.02 / 2080 * 1e6)  # 9.615...
    assert books.input_cost_per_mtok == pytest.approx(0.02 / 2080 * 1e6 * 0.1)
    # Revenue: 800 * $1 + 200 cached * $0.50 + 2,000 * $4 = $8,900 per million = $0.0089.
    assert books.revenue() == pytest.approx(0.0089)
    assert books.revenue(batch_tier=True) == pytest.approx(0.00445)
    assert books.margin() == pytest.approx((0.0089 - 0.02) / 0.0089)  # -1.247: losing money
    assert books.break_even_scale() == pytest.approx(0.02 / 0.0089)
    b_in, b_out = books.break_even_prices()
    assert (b_in, b_out) == (pytest.approx(2.2472, abs=1e-4), pytest.approx(8.9888, abs=1e-4))
    # Input price kept at $1: ($0.02 - $0.0009) / 2,000 tokens = $9.55 per million.
    assert books.break_even_output_price() == pytest.approx(9.55)


def test_break_even_prices_earn_exactly_the_cost() -> None:
    books = Ledger(measurement(), PRICES, input_token_weight=0.1)
    b_in, b_out = books.break_even_prices()
    at_break_even = Ledger(measurement(), Prices(
        3.6, utilization=0.5, input_price_per_mtok=b_in, output_price_per_mtok=b_out,
        cached_input_discount=0.5), input_token_weight=0.1)
    assert at_break_even.margin() == pytest.approx(0.0, abs=1e-12)


positive = st.floats(min_value=1e-2, max_value=1e4, allow_nan=False)


@given(price=positive, weight=st.floats(0, 2), cached=st.integers(0, 1000))
def test_split_costs_add_up_to_the_run_cost(price: float, weight: float, cached: int) -> None:
    m = measurement(num_cached_input_tokens=cached)
    books = Ledger(m, Prices(price), input_token_weight=weight)
    computed = m.num_input_tokens - cached
    total = (books.output_cost_per_mtok * m.num_output_tokens
             + books.input_cost_per_mtok * computed) / 1e6
    assert math.isclose(total, books.run_cost, rel_tol=1e-9)
    assert books.output_cost_per_mtok <= books.blended_cost_per_mtok * (1 + 1e-12)


def test_without_a_split_the_input_output_costs_say_why() -> None:
    books = Ledger(measurement(), Prices(2.0))
    assert books.input_token_weight is None
    with pytest.raises(ValueError, match="input_token_weight"):
        _ = books.output_cost_per_mtok
    labels = [e.label for e in books.entries()]
    assert "blended cost per Mtok output" in labels and "cost per Mtok output" not in labels
    with pytest.raises(ValueError, match="input_price_per_mtok"):
        books.revenue()


def test_entries_carry_their_provenance() -> None:
    frame = Ledger(measurement(), PRICES, input_token_weight=0.1).to_dataframe()
    assert len(frame) == 10 and set(frame.measured) == {PROV.describe()}
    assert "test box" in PROV.describe() and "max_num_seqs=4" in PROV.describe()
    assert frame.set_index("figure").loc["margin, batch tier", "value"] == pytest.approx(
        (0.00445 - 0.02) / 0.00445)


@pytest.mark.parametrize(
    "field, bad",
    [("gpu_cost_per_hour", 0), ("gpu_cost_per_hour", float("nan")), ("utilization", 0),
     ("utilization", 1.5), ("input_price_per_mtok", -1), ("cached_input_discount", 1.1),
     ("batch_discount", 1.0), ("gpu_cost_per_hour", "3"), ("utilization", True)],
)
def test_bad_prices_are_refused(field: str, bad) -> None:
    kwargs = {"gpu_cost_per_hour": 1.0, field: bad}
    with pytest.raises(ValueError, match=field):
        Prices(**kwargs)


def test_bad_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="duration_s"):
        measurement(duration_s=0)
    with pytest.raises(ValueError, match="num_cached_input_tokens"):
        measurement(num_cached_input_tokens=5000)
    with pytest.raises(ValueError, match="num_output_tokens"):
        measurement(num_output_tokens=-1)
    with pytest.raises(ValueError, match="no output tokens"):
        Ledger(measurement(num_output_tokens=0), PRICES)
    with pytest.raises(TypeError, match="Prices"):
        Ledger(measurement(), 3.6)
    with pytest.raises(ValueError, match="input_token_weight"):
        Ledger(measurement(), PRICES, input_token_weight=-1)


def test_money_and_currencies() -> None:
    assert Prices(1.0, currency="¥").money(30) == "¥30.00"
    assert Prices(1.0, currency="EUR").money(1234.5) == "1,234.50 EUR"


# -- capacity -----------------------------------------------------------------------------------


def sweep_point(rate: float, tokens_per_s: float, p99_ttft: float, p99_tpot: float) -> Measurement:
    return measurement(num_output_tokens=int(tokens_per_s * 10), request_rate=rate,
                       ttft_s={50: p99_ttft / 2, 99: p99_ttft}, tpot_s={50: p99_tpot / 2, 99: p99_tpot})


SWEEP = [sweep_point(1, 100, 0.1, 0.02), sweep_point(4, 380, 0.3, 0.04),
         sweep_point(16, 900, 2.0, 0.09), sweep_point(64, 1000, 9.0, 0.2)]


def test_throughput_at_slo_picks_the_best_point_within_the_limits() -> None:
    assert throughput_at_slo(SWEEP, SLO(ttft_s=0.5)).request_rate == 4
    assert throughput_at_slo(SWEEP, SLO(ttft_s=5, tpot_s=0.1)).request_rate == 16
    assert throughput_at_slo(SWEEP, SLO()).request_rate == 64
    with pytest.raises(ValueError, match="no point"):
        throughput_at_slo(SWEEP, SLO(ttft_s=0.01))
    with pytest.raises(ValueError, match="no p95"):
        throughput_at_slo(SWEEP, SLO(ttft_s=1, percentile=95))
    with pytest.raises(ValueError, match="ttft_s"):
        SLO(ttft_s=-1)


def test_gpus_and_monthly_cost_by_hand() -> None:
    assert gpus_needed(1000, 380) == 3  # 2.63 GPUs cannot be rented
    assert gpus_needed(760, 380) == 2  # exactly 2, not 3 from float noise
    assert monthly_cost(3, 2.5) == pytest.approx(3 * 2.5 * 730)
    plan = plan_fleet(SWEEP, SLO(ttft_s=0.5), target_output_tokens_per_s=1000, gpu_cost_per_hour=2.5)
    assert plan.num_gpus == 3 and plan.monthly_cost == pytest.approx(5475)
    # $5,475 a month over 1,000 tokens/s * 730 h * 3,600 s = 2,628 M tokens: $2.083 per million.
    assert plan.cost_per_mtok == pytest.approx(5475 / 2628)
    assert "3 GPUs" in plan.describe() and "test box" in plan.describe()
    for bad in (0, -5, float("inf"), "10"):
        with pytest.raises(ValueError, match="target_output_tokens_per_s"):
            gpus_needed(bad, 100)
    with pytest.raises(ValueError, match="num_gpus"):
        monthly_cost(1.5, 2.0)


# -- readers --------------------------------------------------------------------------------------

VLLM_STYLE = {  # the keys vLLM's benchmark_serving writes (a subset), as a bench serve may
    "date": "20261201-010203", "backend": "minilm-engine", "model_id": "noodle-chef",
    "request_rate": "inf", "max_concurrency": 8, "duration": 12.5, "completed": 64,
    "total_input_tokens": 3200, "total_output_tokens": 6400, "request_throughput": 5.12,
    "output_throughput": 512.0, "mean_ttft_ms": 40.0, "median_ttft_ms": 35.0, "p99_ttft_ms": 120.0,
    "mean_tpot_ms": 9.0, "median_tpot_ms": 8.5, "p99_tpot_ms": 20.0, "p99_e2el_ms": 900.0,
    "percentiles_ttft_ms": [[90, 80.0]], "generated_texts": ["a very long text " * 20],
}


def test_bench_serve_json_vllm_style(tmp_path) -> None:
    m = Measurement.from_bench_json(VLLM_STYLE, machine="a box")
    assert (m.num_requests, m.num_input_tokens, m.num_output_tokens) == (64, 3200, 6400)
    assert m.duration_s == 12.5 and m.output_tokens_per_s == pytest.approx(512.0)
    assert m.request_rate is None  # "inf": all requests at once
    assert m.ttft_s == {50: 0.035, 90: 0.08, 99: 0.12} and m.mean_ttft_s == pytest.approx(0.04)
    assert m.tpot_s[99] == pytest.approx(0.02) and m.e2e_s == {99: 0.9}
    prov = m.provenance
    assert (prov.machine, prov.model, prov.source) == ("a box", "noodle-chef", "bench serve")
    assert prov.settings["max_concurrency"] == 8 and "generated_texts" not in prov.settings
    path = tmp_path / "result.json"
    path.write_text(json.dumps(VLLM_STYLE))
    assert Measurement.from_bench_json(path, machine="a box") == m


def test_bench_serve_json_minimal_and_tolerant() -> None:
    m = Measurement.from_bench_json({"duration_s": "2", "num_requests": 3, "total_input_tokens": 30,
                                     "total_output_tokens": 60.0, "request_rate": 1.5})
    assert (m.duration_s, m.num_output_tokens, m.request_rate) == (2.0, 60, 1.5)
    assert m.ttft_s == {} and m.provenance.model == "unknown model"


@pytest.mark.parametrize(
    "change, message",
    [({"duration": None}, "no 'duration'"), ({"duration": 0}, "duration"),
     ({"duration": "fast"}, "duration must be a number"), ({"completed": 2.5}, "completed"),
     ({"total_output_tokens": None}, "total_output_tokens"), ({"total_input_tokens": True}, "number")],
)
def test_bench_serve_json_errors_name_the_key(change, message) -> None:
    result = {**VLLM_STYLE, **change}
    result = {k: v for k, v in result.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        Measurement.from_bench_json(result)


def test_bench_serve_json_not_an_object(tmp_path) -> None:
    path = tmp_path / "bad.json"
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="JSON object"):
        Measurement.from_bench_json(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not JSON"):
        Measurement.from_bench_json(path)


def test_to_dict_round_trip_through_json() -> None:
    m = sweep_point(4, 380, 0.3, 0.04)
    assert Measurement.from_dict(json.loads(json.dumps(m.to_dict()))) == m


def test_fit_token_seconds_recovers_known_costs() -> None:
    # Steps built from 1 ms per prompt token and 20 ms per decode token.
    steps = [(p, d) for p, d in [(100, 0), (0, 4), (50, 2), (0, 8), (200, 1), (0, 3)]]
    records = [SimpleNamespace(num_prefill_tokens=p, num_decode_tokens=d,
                               duration_s=0.001 * p + 0.02 * d) for p, d in steps]
    a, b = fit_token_seconds(records)
    assert a == pytest.approx(0.001) and b == pytest.approx(0.02)
    assert fit_token_seconds(records[1:2]) == (None, None)  # decode only: cannot tell


def test_from_outputs_of_the_engine(checkpoints, prompts) -> None:
    llm = LLM(checkpoints["llama"].path, max_num_seqs=4, num_kv_blocks=64)
    shared = "the same long opening of every prompt, " * 3
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    llm.generate([shared + prompts[0]], params, use_tqdm=False)  # warm the prefix cache
    llm.engine.trace.clear()
    batch = [shared + p for p in prompts[:4]]
    outputs = llm.generate(batch, params, use_tqdm=False)
    m = Measurement.from_outputs(outputs, 0.5, model="tiny llama", settings={"max_num_seqs": 4},
                                 trace_records=llm.engine.trace.records)
    assert (m.num_requests, m.num_output_tokens) == (4, 24)
    assert m.num_input_tokens == sum(len(llm.tokenizer.encode(p)) for p in batch)
    assert 0 < m.num_cached_input_tokens < m.num_input_tokens  # the shared opening hit the cache
    assert set(m.ttft_s) == {50, 90, 99} and m.ttft_s[50] <= m.ttft_s[99]
    assert m.mean_tpot_s > 0 and m.provenance.source == "generate"
    assert m.provenance.settings == {"max_num_seqs": 4} and m.provenance.date.endswith("Z")
    assert m.input_token_weight is not None and m.input_token_weight > 0
    assert Ledger(m, Prices(1.0)).output_cost_per_mtok > 0
    with pytest.raises(ValueError, match="outputs"):
        Measurement.from_outputs([], 1.0, model="x")


# -- the chapter's exercises ----------------------------------------------------------------------


def test_break_even_exercise_by_hand_and_its_checker() -> None:
    from minilm_engine.course.teaching.exercises_ledger import BREAK_EVEN
    from minilm_engine.course.teaching.exercises_ledger import (
        engine_break_even_output_price as break_even_output_price,
    )

    # $3.60/h at 50% utilization = $7.20 per serving hour; inputs earn 3.6 M * $0.10 = $0.36;
    # ($7.20 - $0.36) / 3.6 M output tokens = $1.90 per million.
    assert break_even_output_price(3.6, 0.5, 1000, 1000, 0.1) == pytest.approx(1.9)
    nudge = BREAK_EVEN.check(break_even_output_price)  # the package's own: a nudge, not a pass
    assert not nudge.passed and "package's own" in nudge.message

    def by_hand(gpu_cost_per_hour, utilization, output_tokens_per_s, input_tokens_per_s,
                input_price_per_mtok):
        hour_in, hour_out = input_tokens_per_s * 3600 / 1e6, output_tokens_per_s * 3600 / 1e6
        return (gpu_cost_per_hour / utilization - hour_in * input_price_per_mtok) / hour_out

    assert BREAK_EVEN.check(by_hand).passed

    def forgets_utilization(gpu_cost_per_hour, utilization, output_tokens_per_s,
                            input_tokens_per_s, input_price_per_mtok):
        hour_in = input_tokens_per_s * 3600 / 1e6
        return (gpu_cost_per_hour - hour_in * input_price_per_mtok) / (output_tokens_per_s * 3600 / 1e6)

    result = BREAK_EVEN.check(forgets_utilization)
    assert not result.passed and "expected" in result.message
    assert not BREAK_EVEN.check(lambda **kw: "1.9").passed  # a string, not a crash
    assert "raised" in BREAK_EVEN.check(lambda **kw: 1 / 0).message


def test_gpus_for_load_exercise_and_its_checker() -> None:
    from minilm_engine.course.teaching.exercises_ledger import GPUS_FOR_LOAD
    from minilm_engine.course.teaching.exercises_ledger import engine_gpus_for_load as gpus_for_load

    sweep = [{"tokens_per_s": 300, "p99_ttft_s": 0.05}, {"tokens_per_s": 900, "p99_ttft_s": 0.4},
             {"tokens_per_s": 1200, "p99_ttft_s": 3.0}]
    assert gpus_for_load(2000, sweep, 0.5) == 3  # 900 per GPU within 0.5 s: 2.2 -> 3
    assert gpus_for_load(2000, sweep, 0.01) is None
    nudge = GPUS_FOR_LOAD.check(gpus_for_load)  # the package's own: a nudge, not a pass
    assert not nudge.passed and "package's own" in nudge.message

    def by_hand(target_tokens_per_s, sweep, p99_ttft_limit_s):
        ok = [p["tokens_per_s"] for p in sweep if p["p99_ttft_s"] <= p99_ttft_limit_s]
        return math.ceil(target_tokens_per_s / max(ok)) if ok else None

    assert GPUS_FOR_LOAD.check(by_hand).passed

    def fastest_point(target_tokens_per_s, sweep, p99_ttft_limit_s):
        return math.ceil(target_tokens_per_s / max(p["tokens_per_s"] for p in sweep))

    def rounds_down(target_tokens_per_s, sweep, p99_ttft_limit_s):
        ok = [p["tokens_per_s"] for p in sweep if p["p99_ttft_s"] <= p99_ttft_limit_s]
        return int(target_tokens_per_s // max(ok)) if ok else None

    for wrong in (fastest_point, rounds_down, lambda **kw: 2.0):
        assert not GPUS_FOR_LOAD.check(wrong).passed


OUR_BENCH = {  # the shape minilm-engine's `bench serve --result-file` wrote before it took vLLM's keys
    "date": "2026-12-01T01:00:00+00:00", "base_url": "http://127.0.0.1:8000", "model": "noodle-chef",
    "endpoint": "/v1/completions", "request_rate": 4.0, "burstiness": 1.0, "max_concurrency": None,
    "slo": {"ttft": 500.0}, "num_prompts": 20, "num_completed": 20, "num_failed": 0,
    "duration_s": 5.0, "total_input_tokens": 400, "total_output_tokens": 1000,
    "request_throughput": 4.0, "output_throughput": 200.0, "total_token_throughput": 280.0,
    "goodput": 3.8, "ttft_ms": {"mean": 30.0, "median": 25.0, "p90": 60.0, "p99": 90.0},
    "tpot_ms": {"mean": 10.0, "median": 9.0, "p90": 14.0, "p99": 20.0},
    "itl_ms": {"mean": 10.0, "median": 9.0, "p90": 14.0, "p99": 25.0},
    "e2el_ms": {"mean": None, "median": None, "p90": None, "p99": None},
    "input_lens": [20] * 20, "output_lens": [50] * 20, "errors": [],
}


def test_bench_serve_json_of_this_package_and_its_sweeps(tmp_path) -> None:
    m = Measurement.from_bench_json(OUR_BENCH)
    assert (m.num_requests, m.duration_s, m.request_rate) == (20, 5.0, 4.0)
    assert m.ttft_s == {50: 0.025, 90: 0.06, 99: 0.09} and m.mean_ttft_s == pytest.approx(0.03)
    assert m.tpot_s[99] == pytest.approx(0.02) and m.e2e_s == {} and m.mean_e2e_s is None
    assert m.provenance.model == "noodle-chef" and m.provenance.settings["endpoint"] == "/v1/completions"
    path = tmp_path / "sweep.json"
    points = [{**OUR_BENCH, "request_rate": r, "total_output_tokens": 500 * r} for r in (1, 2, 8)]
    path.write_text(json.dumps({"sweep": points}))
    sweep = Measurement.sweep_from_bench_json(path)
    assert [p.request_rate for p in sweep] == [1, 2, 8]
    assert throughput_at_slo(sweep, SLO(ttft_s=0.1)).request_rate == 8
    assert Measurement.sweep_from_bench_json(OUR_BENCH) == [m]
