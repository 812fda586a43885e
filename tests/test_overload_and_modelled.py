"""Chapter 07's overload-over-time readings and chapter 08's modelled GPU ladder: the arithmetic on
hand-made timestamps and hand-computed roofline steps, and one real run against a small server."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minilm_engine.bench.metrics import RequestResult, summarize
from minilm_engine.bench.serve import BenchConfig, BenchResult, arrival_offsets
from minilm_engine.course.experiments import overload, serving
from minilm_engine.course.experiments.roofline import DATASHEETS
from minilm_engine.course.known_configs import known_config
from minilm_engine.course.ledger import modelled
from minilm_engine.course.teaching.predictions import guess_vs_measured


def _result(rate: float, waits_s: list[float], service_s: float = 0.5, seed: int = 3) -> BenchResult:
    """A run whose i-th request is due on the clock, sent on time, waits waits_s[i], then streams for service_s."""
    config = BenchConfig(base_url="http://x", model="m", request_rate=rate, seed=seed)
    start = 100.0
    due = arrival_offsets(len(waits_s), rate, seed=seed)
    results = [RequestResult(success=True, sent_time=start + d, num_output_tokens=2,
                             chunk_times=[start + d + w, start + d + w + service_s]) for d, w in zip(due, waits_s)]
    return BenchResult(config, summarize(results, 10.0), results, start)


def test_request_frame_times_from_the_due_time_and_the_send() -> None:
    result = _result(4.0, [0.1] * 8)
    result.results[3].sent_time += 0.4  # held back by the client: sent late
    frame = overload.request_frame(result)
    assert len(frame) == 8 and frame["due s"].iloc[0] == 0.0
    assert np.allclose(frame["TTFT ms"].drop(index=3), 100.0)
    assert math.isclose(frame.loc[3, "TTFT from due ms"] - frame.loc[3, "TTFT ms"], 400.0, rel_tol=1e-9)


def test_in_flight_counts_sent_and_unfinished() -> None:
    frame = overload.request_frame(_result(2.0, [0.0, 0.0, 0.0]))
    sent, last = frame["sent s"].to_numpy(), frame["last s"].to_numpy()
    assert overload.in_flight(frame, [sent[0] - 1e-6]).tolist() == [0]
    assert overload.in_flight(frame, [last.max() + 1]).tolist() == [0]
    t = sent[1] + 1e-9
    assert overload.in_flight(frame, [t])[0] == sum((sent <= t) & (t < last))


def test_littles_law_holds_in_a_steady_state_and_fails_while_a_queue_grows() -> None:
    steady = overload.littles_law(_result(5.0, [0.05] * 400, seed=1))
    assert 0.85 < steady["L measured"] / steady["lambda x W"] < 1.15
    growing = overload.littles_law(_result(5.0, [0.1 * i for i in range(400)], seed=1))
    assert growing["L measured"] / growing["lambda x W"] < 0.85


def test_ttft_slope_is_flat_when_steady_and_positive_while_a_queue_grows() -> None:
    flat = overload.ttft_slope(overload.request_frame(_result(5.0, [0.05] * 60)))
    assert flat.low <= 1e-6 and flat.high >= -1e-6
    rising = overload.ttft_slope(overload.request_frame(_result(5.0, [0.02 * i for i in range(60)])))
    assert rising.low > 0 and math.isclose(rising.value, 100.0, rel_tol=0.25)  # 20 ms per request, 5 requests/s


def test_a_capped_client_hides_the_queue_it_keeps(tmp_path) -> None:
    server = serving.start_server("noodle-apprentice", "cpu", max_num_seqs=2)
    try:
        frame = overload.request_frame(overload.closed_loop_at_rate(server, 200.0, max_concurrency=1, seconds=0.04,
                                                                    output_len=4))
    finally:
        server.stop()
    assert len(frame) == 8
    # one at a time: every request after the first waited in the client, unsent and untimed
    assert (frame["TTFT from due ms"] >= frame["TTFT ms"]).all()
    assert frame["TTFT from due ms"].iloc[-1] > 2 * frame["TTFT ms"].iloc[-1]
    assert len(overload.transient_figure({"capped": frame}).data) == 2


def test_modelled_ridge_of_bf16_weights_on_an_h100() -> None:
    sheet = DATASHEETS["H100"]
    expected = 2 * sheet.roofline.matmul_flops / (2 * sheet.roofline.read_bandwidth)  # 2 bytes a parameter
    for name in ("Qwen/Qwen3-8B", "meta-llama/Meta-Llama-3-70B"):
        assert math.isclose(serving.modelled_ridge(known_config(name), sheet), expected, rel_tol=1e-12)


def test_engine_args_of_serve_flags() -> None:
    assert serving._engine_args(["--max-num-seqs", "8", "--speculative-config", '{"model": "d", "num_speculative_tokens": 3}']) == {
        "max_num_seqs": 8, "speculative_config": {"model": "d", "num_speculative_tokens": 3}}
    with pytest.raises(ValueError, match="--port"):
        serving._engine_args(["--port", "1"])


def test_modelled_ladder_by_hand() -> None:
    config, sheet = known_config("meta-llama/Meta-Llama-3-70B"), DATASHEETS["H100"]
    table = modelled.modelled_ladder(config, sheet, num_gpus=8, price_per_gpu_hour=4.0, prompt_len=8, output_len=2,
                                     rungs=(modelled.ModelledRung("b1", 1), modelled.ModelledRung("b1 8-bit", 1, bytes_per_param=1)))
    params, kv = modelled._params(config)
    bw, flops = 8 * sheet.roofline.read_bandwidth, 8 * sheet.roofline.matmul_flops
    decode = sum(max((2 * params + (8 + t) * kv) / bw, 2 * params / flops) for t in range(2))
    tokens_per_s = 2 / (2 * params * 8 / flops + decode)
    assert math.isclose(table.loc["b1", "output tok/s"], tokens_per_s, rel_tol=1e-12)
    assert math.isclose(table.loc["b1", "$/Mtok output"], 8 * 4.0 / (tokens_per_s * 3600) * 1e6, rel_tol=1e-12)
    assert table.loc["b1 8-bit", "output tok/s"] > table.loc["b1", "output tok/s"]
    assert kv == 2 * 80 * 8 * 128 * 2  # Llama-3-70B: 320 KiB of bf16 KV a token


def test_the_default_ladder_gets_cheaper_rung_by_rung() -> None:
    table = modelled.modelled_ladder(known_config("meta-llama/Meta-Llama-3-70B"), DATASHEETS["H100"], 8, 3.99)
    assert table["$/Mtok output"].is_monotonic_decreasing
    assert all(q.source.startswith("https://") and q.read for q in modelled.QUOTED.values())


def test_guess_vs_measured() -> None:
    assert "no guess written" in guess_vs_measured("x", ..., 2.0)
    assert "2x your guess" in guess_vs_measured("x", 1.0, 2.0)
    assert "(right)" in guess_vs_measured("c", "a", "a")
