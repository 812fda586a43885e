"""Tests for minilm_engine.course.experiments.batching and chapter 01's exercises.

The engines run a tiny random Llama (from conftest) so the tests stay fast.  The central check:
the real static and continuous engines take exactly the steps the toy simulator predicts, with
exactly as many requests producing a token in each step, so the chapter may put the toy's
prediction next to the engines' measurement.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.experiments import batching
from minilm_engine.course.experiments.batching import (
    DecodeCostModel,
    DecodeTiming,
    compare_serving,
    decode_sweep,
    engine_decode_sweep,
    latency_vs_neighbours,
    percentile,
    probe_latency,
    run_workload,
    time_decode_step,
    time_engine_decode_step,
)
from minilm_engine.course.experiments.toy_simulator import continuous_num_steps, simulate
from minilm_engine.course.experiments.workloads import LengthMix, mixed_workload

MIX = LengthMix(short=(1, 6), long=(14, 20), long_fraction=0.25)
NUM_SEATS = 4


@pytest.fixture(scope="module")
def llms(checkpoints):
    path = checkpoints["llama"].path
    return {
        "static": BaselineLLM(path, strategy="static_batch", max_num_seqs=NUM_SEATS),
        "continuous": BaselineLLM(path, strategy="continuous", max_num_seqs=NUM_SEATS),
    }


@pytest.fixture(scope="module")
def workload():
    return mixed_workload(11, seed=5, mix=MIX)


def test_static_engine_takes_the_toys_steps(llms, workload):
    llm = llms["static"]
    requests = llm.make_requests(workload.prompts, workload.sampling_params)
    busy = [len(advanced) for advanced in llm.run_steps(requests)]
    toy = simulate(workload.output_lens, NUM_SEATS, "static")
    assert [len(r.output_token_ids) for r in requests] == workload.output_lens
    assert len(busy) == toy.num_steps
    assert busy == toy.busy_seats_per_step()


def test_continuous_engine_takes_the_toys_steps(llms, workload):
    llm = llms["continuous"]
    run = run_workload(llm, workload)
    toy = simulate(workload.output_lens, NUM_SEATS, "continuous")
    assert run.output_lens == workload.output_lens
    assert run.num_steps == toy.num_steps == continuous_num_steps(workload.output_lens, NUM_SEATS)
    records = llm.engine.trace.records
    assert len(records) == run.num_steps  # the trace holds exactly this run
    assert [len(r.chunks) for r in records] == toy.busy_seats_per_step()


def test_serving_run_numbers(llms, workload):
    runs = compare_serving(llms, workload, num_repeats=2)
    assert set(runs) == {"static", "continuous"}
    for run in runs.values():
        assert run.num_output_tokens == workload.num_output_tokens
        assert run.throughput == pytest.approx(run.num_output_tokens / run.wall_s)
        assert all(0 < t <= e for t, e in zip(run.ttfts, run.e2e_latencies))
        assert max(run.e2e_latencies) <= run.wall_s
        summary = run.summary()
        assert summary["requests"] == workload.num_requests
        assert summary["p50 latency s"] <= summary["p99 latency s"]
    assert runs["static"].strategy == "static_batch" and runs["static"].num_steps is None


def test_percentile_matches_numpy():
    rng = random.Random(0)
    for _ in range(50):
        values = [rng.random() for _ in range(rng.randint(1, 30))]
        for q in (0, 37, 50, 99, 100):
            assert percentile(values, q) == pytest.approx(np.percentile(values, q))
    with pytest.raises(ValueError):
        percentile([], 50)


def test_decode_timings(llms):
    model = llms["static"].model
    timing = time_decode_step(model, batch_size=3, context_len=5, num_steps=3)
    assert timing.batch_size == 3 and 0 < timing.min_step_s <= timing.step_s
    assert timing.tokens_per_s == pytest.approx(3 / timing.step_s)
    sweep = decode_sweep(model, [4, 1, 2], context_len=4, num_steps=2, num_rounds=2)
    assert [t.batch_size for t in sweep] == [1, 2, 4]


def test_engine_decode_timing_leaves_the_engine_idle(llms):
    llm = llms["continuous"]
    timing = time_engine_decode_step(llm, batch_size=NUM_SEATS, num_steps=3)
    assert timing.step_s > 0 and not llm.engine.has_unfinished_requests()
    assert [t.batch_size for t in engine_decode_sweep(llm, [2, 1], num_steps=2)] == [1, 2]
    with pytest.raises(ValueError, match="max_num_seqs"):
        time_engine_decode_step(llm, batch_size=NUM_SEATS + 1)


def test_cost_model_floors():
    cost = DecodeCostModel(num_params=1000, weight_bytes=4000, bandwidth=1e6, flops=1e7)
    assert cost.memory_floor_s(1) == cost.memory_floor_s(64) == pytest.approx(4e-3)
    assert cost.compute_floor_s(8) == pytest.approx(2 * 1000 * 8 / 1e7)
    b = cost.crossover_batch  # 4000 * 1e7 / (2 * 1000 * 1e6) = 20
    assert b == pytest.approx(20)
    assert cost.memory_floor_s(b) == pytest.approx(cost.compute_floor_s(b))
    assert cost.floor_s(1) == cost.memory_floor_s(1)
    assert cost.floor_s(40) == cost.compute_floor_s(40)


def test_hardware_measurements_are_positive(llms):
    assert batching.measure_copy_bandwidth(num_bytes=1 << 20, num_repeats=2) > 0
    assert batching.measure_matmul_flops(n=64, num_repeats=2) > 0
    model = llms["static"].model
    bytes_per_weight = torch.empty((), dtype=model.dtype).element_size()  # 4 in fp32, 2 in bf16
    num_params = sum(p.numel() for p in model.parameters())
    assert batching.weight_bytes(model) == bytes_per_weight * num_params
    assert "torch" in batching.hardware_summary("cpu")


def test_probe_latency(llms):
    llm = llms["continuous"]
    probe = mixed_workload(1, seed=1, mix=LengthMix(short=(4, 4), long_fraction=0))
    others = mixed_workload(3, seed=2, mix=LengthMix(short=(6, 6), long_fraction=0))
    results = latency_vs_neighbours(llm, probe, others, [0, 3], num_repeats=2)
    assert [r.num_others for r in results] == [0, 3]
    for r in results:
        assert len(r.ttft_runs) == 2 and r.ttft_s > 0 and r.tpot_s > 0 and r.e2e_s >= r.ttft_s
    with pytest.raises(ValueError):
        probe_latency(llm, others, probe)
    with pytest.raises(ValueError):
        latency_vs_neighbours(llm, probe, others, [4])


def test_figures_show_the_numbers():
    timings = [DecodeTiming(1, 0.002, 0.002), DecodeTiming(8, 0.004, 0.003)]
    cost = DecodeCostModel(num_params=1000, weight_bytes=4000, bandwidth=1e6, flops=1e7)
    fig = batching.decode_sweep_figure(timings, cost, engine_timings=timings)
    assert list(fig.data[0].y) == [2.0, 4.0] and list(fig.data[1].y) == [2.0, 4.0]
    assert list(fig.data[-1].y) == pytest.approx([1 / cost.floor_s(1), 8 / cost.floor_s(8)])
    toy = [simulate([3, 1, 4, 1, 5, 2], 3, p) for p in ("static", "continuous")]
    occ = batching.occupancy_figure(toy)
    z = [list(row) for row in occ.data[0].z]
    assert z[1] == [1, -1, -1, -1, 4, 4, 4, 4, 4]  # seat 1 of the static table
    assert "9 steps" in occ.layout.annotations[0].text
    run = batching.ProbeLatency(4, 0.01, 0.002, 0.1)
    assert list(batching.neighbours_figure([run]).data[1].y) == [2.0]


def test_batching_gain():
    timings = [DecodeTiming(1, 0.004, 0.004), DecodeTiming(32, 0.008, 0.007)]
    step_ratio, token_ratio = batching.batching_gain(timings)
    assert step_ratio == pytest.approx(2.0) and token_ratio == pytest.approx(16.0)
    with pytest.raises(ValueError, match="no timing"):
        batching.batching_gain(timings, 1, 64)


def test_cost_model_with_kv_reads():
    # 1000 parameters of 4 bytes, 10 bytes of KV per token, 1 MB/s, 10 MFLOP/s.
    cost = DecodeCostModel(num_params=1000, weight_bytes=4000, bandwidth=1e6, flops=1e7, kv_bytes_per_token=10)
    assert cost.memory_floor_s(8) == cost.memory_floor_s(8, context_len=0) == pytest.approx(4e-3)
    assert cost.memory_floor_s(8, context_len=100) == pytest.approx((4000 + 8 * 100 * 10) / 1e6)
    assert cost.floor_s(1, 100) == pytest.approx(5e-3)
    # Short context: batching is nearly free up to B*; long context: each request adds its KV.
    assert cost.slowdown(8, 0) == 1.0 and cost.slowdown(8, 1000) == pytest.approx(84_000 / 14_000)
    assert cost.batch_at_slowdown(0) == 40  # the compute floor: 2 x 1000 x B / 1e7 >= 8 ms
    long = cost.batch_at_slowdown(1000)
    assert long is not None and long < cost.crossover_batch
    assert cost.slowdown(long, 1000) >= 2.0 > cost.slowdown(long - 1, 1000)
    assert DecodeCostModel(1000, 4000, 1e6, 1e12).batch_at_slowdown(0, max_batch=64) is None


def test_cost_model_for_real_shapes_reproduces_the_issue_claim():
    from minilm_engine.course.known_configs import known_config

    llama3 = known_config("Meta-Llama-3-8B")
    h100 = DecodeCostModel.for_shapes(llama3, bandwidth=3.35e12, flops=989e12)
    assert h100.kv_bytes_per_token == 128 * 1024 and h100.weight_bytes == 2 * llama3.num_parameters()
    assert h100.kv_read_bytes(32, 4096) == pytest.approx(h100.weight_bytes, rel=0.1)
    assert h100.slowdown(32, 512) < 1.2 and h100.slowdown(32, 32768) > 5
    assert h100.batch_at_slowdown(32768) < 8 < 100 < h100.batch_at_slowdown(512)


def test_context_sweep_measures_and_draws(checkpoints):
    from minilm_engine import LLM

    llm = LLM(checkpoints["llama"].path)
    runs = batching.context_sweep(llm.model, [1, 2], [4, 16], num_steps=1)
    assert [r.context_len for r in runs] == [4, 16] and all(len(r.timings) == 2 for r in runs)
    cost = DecodeCostModel(1000, 4000, 1e6, 1e7, 10)
    fig = batching.context_sweep_figure(cost, [1, 2], [4, 16], runs)
    assert len(fig.data) == 4 and list(fig.data[0].y)[0] == 1.0
