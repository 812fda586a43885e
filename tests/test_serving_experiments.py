"""Chapter 07's pieces: the serving experiments (tiny loads), the request timeline view, and the
tail-and-goodput exercise's checker."""

from __future__ import annotations

import math
import random

import numpy as np
import pandas as pd
import pytest

from minilm_engine.bench.datasets import noodle_requests
from minilm_engine.bench.serve import BenchConfig, run_benchmark
from minilm_engine.core.config import EngineConfig
from minilm_engine.course.experiments import serving
from minilm_engine.course.teaching.exercises_serving import (
    engine_tail_and_goodput,
    make_case,
    tail_and_goodput_exercise,
)
from minilm_engine.course.viz.serving_view import ServingView, occupancy, request_spans


@pytest.fixture(scope="module")
def server():
    running = serving.start_server("noodle-apprentice", "cpu", max_num_seqs=4)
    yield running
    running.stop()


def test_rate_sweep_and_knee(server):
    table, results = serving.rate_sweep(server, [20.0, math.inf], output_len=4, seconds_per_rate=0.2,
                                        min_requests=4, max_requests=6, slo={"ttft": 60_000})
    assert list(table["offered req/s"]) == [20.0, math.inf] and list(table["requests"]) == [4, 6]
    assert (table["completed"] == table["requests"]).all() and (table["failed"] == 0).all()
    assert table.loc[0, "sent req/s"] > 0 and math.isinf(table.loc[1, "sent req/s"])
    assert np.allclose(table["output tok/s"], table["achieved req/s"] * 4)
    assert np.allclose(table["goodput req/s"], table["achieved req/s"])
    assert len(serving.sweep_figure(table).data) == 6


def test_rate_sweep_sends_the_same_prompts_with_an_arrival_seed_per_rate(monkeypatch):
    seen = []  # (arrival seed, prompts) of each rate's benchmark run
    monkeypatch.setattr(serving, "run_benchmark",
                        lambda config, requests, progress: seen.append((config.seed, [r.prompt for r in requests])))
    monkeypatch.setattr(serving, "model_name", lambda server: "m")
    monkeypatch.setattr(serving, "_row", lambda head, result: head)  # nothing was run: no metrics to read
    fake_server = type("Server", (), {"url": "http://localhost:1"})()
    serving.rate_sweep(fake_server, [2.0, 4.0, 8.0], min_requests=4, max_requests=4, seed=7)
    assert [s for s, _ in seen] == [7, 8, 9], "every rate draws its own arrival gaps"
    assert seen[0][1] == seen[1][1] == seen[2][1], "from the same prompts"


def test_knee_is_the_last_rate_kept_up_with():
    table = pd.DataFrame({"offered req/s": [1.0, 2.0, 4.0, 8.0, math.inf],
                          "sent req/s": [0.8, 2.1, 4.0, 7.5, math.inf],  # Poisson draws, off their mean
                          "achieved req/s": [0.78, 1.95, 3.7, 4.1, 4.2]})
    assert serving.knee(table)["offered req/s"] == 4.0
    assert serving.knee(table, keep_up=0.95)["offered req/s"] == 1.0
    assert serving.knee(table, keep_up=0.999)["offered req/s"] == 1.0  # kept up with none: the lowest


def test_latency_under_load_and_streaming(server):
    load = serving.latency_under_load(server, [0, 20], num_probes=2, output_len=4, background_seconds=0.3)
    assert list(load["background req/s"]) == [0, 20]
    assert load.loc[0, "background achieved req/s"] == 0 and load.loc[1, "background achieved req/s"] > 0
    assert (load["your TTFT p50 ms"] > 0).all() and (load["your TTFT max ms"] >= load["your TTFT p50 ms"]).all()
    streams = serving.streaming_vs_not(server, 50.0, num_requests=3, output_len=4)
    whole = streams.set_index("mode").loc["whole answer"]
    assert whole["first text p50 ms"] == whole["last text p50 ms"]  # nothing to see before the end


def test_latency_under_load_probes_on_a_clock_keep_sending_while_earlier_ones_run(server):
    # A user on a fixed clock does not wait for an answer before the next request (a user who did
    # would, above capacity, only get her later requests through once the background had stopped).
    interval = 0.001
    load = serving.latency_under_load(server, [0, 20], num_probes=3, output_len=4, background_seconds=0.3,
                                      probe_interval_s=interval)
    by_rate = load.attrs["probe_results"]
    for rate, results in by_rate.items():
        assert len(results) == 3 and all(r.success for r in results), rate
        assert results[1].sent_time < results[0].chunk_times[-1], rate  # sent before the first had finished
    # Request i is the same request at every rate (paired comparisons read them by index).
    assert [r.num_prompt_tokens for r in by_rate[0]] == [r.num_prompt_tokens for r in by_rate[20]]
    assert load.loc[1, "background achieved req/s"] > 0
    with pytest.raises(ValueError, match="probe_interval_s"):
        serving.latency_under_load(server, [0], num_probes=1, probe_interval_s=0)


def test_max_num_seqs_dial_runs_a_server_process_each_with_repeats():
    dial = serving.max_num_seqs_dial("noodle-apprentice", "cpu", [1, 4], num_requests=4, output_len=3, concurrency=4,
                                     num_repeats=2)
    assert list(dial["max_num_seqs"]) == [1, 4] and (dial["completed"] == 4).all() and (dial["repeats"] == 2).all()
    assert all(isinstance(v, int) for v in dial["max_num_seqs"].tolist())
    runs = dial.attrs["runs"]
    assert [len(runs[v]) for v in (1, 4)] == [2, 2] and all(r["failed"] == 0 for v in runs for r in runs[v])
    assert (dial["output tok/s min"] <= dial["output tok/s"]).all() and (dial["output tok/s"] <= dial["output tok/s max"]).all()
    assert len(serving.dial_figure(dial).data) == 3


def test_rates_around_a_capacity_are_dense_near_it():
    rates = serving.rates_around(10.0)
    assert rates[-1] == math.inf and rates[:-1] == sorted(rates[:-1])
    assert sum(8 <= r <= 12 for r in rates) >= 4, "most points near capacity"
    with pytest.raises(ValueError, match="capacity"):
        serving.rates_around(0.0)


def test_slo_crossing_interpolates_between_the_points_either_side():
    table = pd.DataFrame({"offered req/s": [1.0, 2.0, 4.0, 6.0, math.inf],
                          "TTFT p99 ms": [50.0, 100.0, 300.0, 900.0, 5000.0]})
    crossing = serving.slo_crossing(table, 500.0)
    assert crossing["status"] == "crossed" and crossing["below"] == (4.0, 300.0) and crossing["above"] == (6.0, 900.0)
    assert crossing["rate"] == pytest.approx(4.0 + 2.0 * 200 / 600)
    noisy = table.assign(**{"TTFT p99 ms": [50.0, 600.0, 300.0, 900.0, 5000.0]})  # back under: the first crossing counts
    assert serving.slo_crossing(noisy, 500.0)["above"] == (2.0, 600.0)
    assert serving.slo_crossing(table, 1000.0)["status"] == "never"  # the inf row is not a rate
    assert serving.slo_crossing(table, 10.0)["status"] == "from the start"


def test_serving_view_draws_what_the_server_did(server):
    view = ServingView().follow(server.engine)
    config = BenchConfig(base_url=server.url, model="noodle-apprentice", ignore_eos=True)
    result = view.watch(lambda: run_benchmark(config, noodle_requests(8, output_len=3), progress=False),
                        mode="static")
    assert result.metrics.num_completed == 8 and len(view.requests) == 8
    spans = request_spans(view.requests)
    assert [s.arrival for s in spans] == sorted(s.arrival for s in spans) and spans[0].arrival == 0
    for s in spans:
        assert s.arrival <= s.scheduled <= s.first_token <= s.end and not s.aborted
    times, waiting, running = occupancy(spans, now=spans[-1].end + 1)
    assert max(running) <= 4  # max_num_seqs
    assert waiting[-1] == running[-1] == 0 and min(waiting) >= 0
    assert max(waiting) >= 1  # eight at once on four seats: some queued
    figure = view.figure()
    assert [t.name for t in figure.data] == ["queued", "prefill", "decode", "aborted", "running", "waiting"]


def test_occupancy_by_hand():
    from minilm_engine.course.viz.serving_view import RequestSpan

    spans = [RequestSpan("a", 0.0, 0.0, 0.1, 1.0, False), RequestSpan("b", 0.2, 0.5, 0.6, 0.9, False),
             RequestSpan("c", 0.3, None, None, 0.4, True)]  # aborted while queued
    times, waiting, running = occupancy(spans, now=2.0)
    at = {t: (w, r) for t, w, r in zip(times, waiting, running)}
    assert at[0.2] == (1, 1) and at[0.3] == (2, 1) and at[0.4] == (1, 1) and at[0.5] == (0, 2)
    assert at[1.0] == (0, 0) and times[-1] == 2.0


def test_exercise_answers_agree_with_a_plain_computation():
    rng = random.Random(3)
    for _ in range(20):
        case = make_case(rng)
        ttft_ms = [1000 * (f - s) for s, f in zip(case["sent"], case["first_token"])]
        good = sum(
            t <= case["slo_ttft_ms"] and (n == 1 or 1000 * (l - f) / (n - 1) <= case["slo_tpot_ms"])
            for t, f, l, n in zip(ttft_ms, case["first_token"], case["last_token"], case["num_output_tokens"]))
        p99, goodput = engine_tail_and_goodput(**case)
        assert p99 == pytest.approx(np.percentile(ttft_ms, 99))
        assert goodput == pytest.approx(good / case["duration_s"])


def test_exercise_checker_explains_and_never_crashes():
    nudge = tail_and_goodput_exercise.check(engine_tail_and_goodput)  # the package's own: a nudge
    assert not nudge.passed and "package's own" in nudge.message

    def by_hand(sent, first_token, last_token, num_output_tokens, duration_s, slo_ttft_ms, slo_tpot_ms):
        ttft_ms = [1000 * (f - s) for s, f in zip(sent, first_token)]
        good = sum(t <= slo_ttft_ms and (n == 1 or 1000 * (l - f) / (n - 1) <= slo_tpot_ms)
                   for t, f, l, n in zip(ttft_ms, first_token, last_token, num_output_tokens))
        return float(np.percentile(ttft_ms, 99)), good / duration_s

    assert tail_and_goodput_exercise.check(by_hand).passed
    for wrong in (lambda **k: "fast", lambda **k: None, lambda **k: (1.0,), lambda **k: 1 / 0,
                  lambda **k: (float(np.mean([f - s for s, f in zip(k["sent"], k["first_token"])])), 0.0)):
        verdict = tail_and_goodput_exercise.check(wrong)
        assert not verdict.passed and "tail_and_goodput" in verdict.message


@pytest.mark.skipif("speculative_config" not in EngineConfig.__dataclass_fields__,
                    reason="speculative decoding (#9) is not in this checkout yet")
def test_speculation_at_load_runs_both_configurations_under_both_loads():
    table = serving.speculation_at_load("noodle-apprentice", "cpu", {"model": "noodle-apprentice",
                                        "num_speculative_tokens": 2}, num_requests=3, output_len=4,
                                        busy_concurrency=3, num_repeats=2, num_alone_requests=2)
    assert list(table["speculation"]) == ["off", "off", "on (K=2)", "on (K=2)"]
    assert list(table["load"]) == ["one user", "3 users"] * 2
    assert (table["output tok/s"] > 0).all() and (table["TPOT p50 ms"] > 0).all() and (table["repeats"] == 2).all()
    assert all(len(v) == 2 for v in table.attrs["runs"].values()) and len(table.attrs["runs"]) == 4


def test_serving_view_live_mode_redraws_while_the_load_runs(server, capsys):
    view = ServingView().follow(server.engine)
    config = BenchConfig(base_url=server.url, model="noodle-apprentice", ignore_eos=True, request_rate=20.0)
    result = view.watch(lambda: run_benchmark(config, noodle_requests(6, output_len=3), progress=False),
                        interval_s=0.05, mode="widget")
    assert result.metrics.num_completed == 6 and len(view.requests) == 6
    assert "FigureWidget" in capsys.readouterr().out  # displayed (as text, with no frontend here)
    with pytest.raises(ZeroDivisionError):  # the load's own error comes back to the caller
        view.watch(lambda: 1 / 0, mode="static")
