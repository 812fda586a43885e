"""`bench serve`: its arithmetic against hand-computed cases, its arrival law, its request sets, and
the whole command against our server and against a server that is not ours (`transformers serve`);
a `vllm bench serve` command line runs unchanged, prints vLLM's labels and writes vLLM's JSON keys,
and the initial test request waits for a server that is still starting."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from minilm_engine import LLM
from minilm_engine.bench.datasets import BenchRequest, draw_length, jsonl_requests, noodle_requests
from minilm_engine.bench.metrics import (
    RequestResult,
    Summary,
    meets_slo,
    parse_metric_names,
    parse_percentiles,
    parse_slo,
    peak_throughput,
    summarize,
)
from minilm_engine.bench.serve import BenchConfig, arrival_offsets, run_benchmark, sweep
from minilm_engine.course.ledger import Measurement
from minilm_engine.entrypoints.cli.main import main
from minilm_engine.course.experiments.server_thread import ServerThread, free_port
from minilm_engine.model.loader import CHECKPOINTS_DIR


def result(sent, chunks, num_output=None, num_prompt=5, success=True):
    return RequestResult(success=success, sent_time=sent, chunk_times=list(chunks), num_prompt_tokens=num_prompt,
                         num_output_tokens=len(chunks) if num_output is None else num_output)


def test_request_latencies_from_timestamps():
    r = result(10.0, [10.5, 10.6, 10.8, 11.1])
    assert r.ttft == pytest.approx(0.5) and r.e2e_latency == pytest.approx(1.1)
    assert r.itls == pytest.approx([0.1, 0.2, 0.3])
    assert r.tpot == pytest.approx(0.6 / 3)
    assert result(0.0, [0.2], num_output=1).tpot is None  # one token: no time per output token


def test_summarize_by_hand():
    # Ten requests, TTFT 100..1000 ms, each 3 tokens 50 ms apart, sent one per second.
    results = [result(float(i), [i + 0.1 * (i + 1), i + 0.1 * (i + 1) + 0.05, i + 0.1 * (i + 1) + 0.1])
               for i in range(10)]
    results.append(result(3.0, [], success=False))
    m = summarize(results, duration_s=12.0, slo={"ttft": 450, "tpot": 60})
    assert m.num_completed == 10 and m.num_failed == 1
    assert m.request_throughput == pytest.approx(10 / 12)
    assert m.output_throughput == pytest.approx(30 / 12)
    assert m.total_token_throughput == pytest.approx(80 / 12)
    assert m.ttft_ms.mean == pytest.approx(550) and m.ttft_ms.median == pytest.approx(550)
    # P99 of 100, 200, ..., 1000 with linear interpolation: 900 + 0.91 * 100.
    assert m.ttft_ms.p99 == pytest.approx(991) and m.ttft_ms.p90 == pytest.approx(910)
    assert m.itl_ms.mean == pytest.approx(50) and m.tpot_ms.p99 == pytest.approx(50)
    assert m.goodput == pytest.approx(4 / 12)  # TTFT 100..400 ms meet 450 ms
    assert summarize(results, 12.0).goodput is None
    assert Summary.of([]) == Summary(None, None, None, None)
    assert m.ttft_ms.std == pytest.approx(np.std(np.arange(100, 1001, 100)))
    assert m.ttft_ms.percentiles == pytest.approx({90.0: 910, 99.0: 991})
    asked = summarize(results, 12.0, percentiles=(25, 99.9)).ttft_ms.percentiles
    assert asked == pytest.approx({25.0: 325, 99.9: 999.1})
    # Sent at 0..9 s, each in flight 0.2..1.1 s: at most 2 in the same second, 3 chunks a second.
    assert (m.max_output_tokens_per_s, m.max_concurrent_requests) == (3.0, 2)


def test_peak_throughput_and_report_options_by_hand():
    # Three requests sent at 0 s; chunks at 0.1, 0.2 (both), 0.5, 1.5 and 2.2 s.
    results = [result(0.0, [0.1, 0.5]), result(0.0, [0.2, 1.5]), result(0.0, [0.2, 2.2])]
    assert peak_throughput(results) == (4.0, 3)  # 4 chunks in [0, 1); all 3 in flight then
    assert peak_throughput([result(0.0, [], success=False)]) == (0.0, 0)
    assert parse_percentiles("50,99,99.9") == (50.0, 99.0, 99.9)
    assert parse_metric_names("ttft,e2el") == ("ttft", "e2el")
    for bad in ("0", "101", "p99", ""):
        with pytest.raises(ValueError):
            parse_percentiles(bad)
    with pytest.raises(ValueError, match="latency"):
        parse_metric_names("ttft,latency")


def test_slo_parsing_and_checks():
    assert parse_slo(["ttft:500", "tpot:50", "e2el:2000"]) == {"ttft": 500.0, "tpot": 50.0, "e2el": 2000.0}
    for bad in (["ttft"], ["latency:5"], ["ttft:fast"], ["tpot:-1"]):
        with pytest.raises(ValueError):
            parse_slo(bad)
    r = result(0.0, [0.3, 0.35, 0.4])
    assert meets_slo(r, {"ttft": 300.1}) and not meets_slo(r, {"ttft": 299.9})
    assert meets_slo(r, {"tpot": 50.1}) and not meets_slo(r, {"tpot": 49.9})
    assert not meets_slo(result(0.0, [], success=False), {})


def test_arrivals_are_poisson_with_the_asked_rate_and_burstiness_changes_only_the_spread():
    n, rate = 20000, 8.0
    for burstiness in (0.5, 1.0, 4.0):
        gaps = np.diff(arrival_offsets(n, rate, burstiness, seed=1))
        assert gaps.mean() == pytest.approx(1 / rate, rel=0.05)
        # gamma(k, 1/(rate k)): coefficient of variation 1/sqrt(k) (1 for Poisson).
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)
    assert (arrival_offsets(5, math.inf) == 0).all()
    assert arrival_offsets(5, 2.0, seed=3).tolist() == arrival_offsets(5, 2.0, seed=3).tolist()


def test_request_sets(tmp_path):
    llm_tokenizer = LLM("noodle-apprentice", device="cpu").tokenizer
    plain = noodle_requests(6, output_len=10, seed=2)
    assert plain == noodle_requests(6, output_len=10, seed=2)
    assert all(r.prompt.endswith("\n") and r.max_tokens == 10 for r in plain)
    cut = noodle_requests(6, output_len=10, input_len=50, range_ratio=0.2, seed=2, tokenizer=llm_tokenizer)
    lengths = [len(llm_tokenizer.encode(r.prompt)) for r in cut]
    assert all(38 <= n <= 62 for n in lengths), lengths
    assert all(8 <= r.max_tokens <= 12 for r in cut)
    import random
    rng = random.Random(0)
    assert {draw_length(rng, 10, 0.5) for _ in range(500)} == set(range(5, 16))
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a", "max_tokens": 3}\n\n{"prompt": "b"}\n')
    assert jsonl_requests(path, 3, output_len=7) == [BenchRequest("a", 3), BenchRequest("b", 7), BenchRequest("a", 3)]
    path.write_text('{"text": "a"}\n')
    with pytest.raises(ValueError, match="string 'prompt'"):
        jsonl_requests(path)
    with pytest.raises(ValueError):
        BenchConfig(base_url="http://x", model="m", request_rate=0)


@pytest.fixture(scope="module")
def server():
    with ServerThread(LLM("noodle-apprentice", device="cpu", record_trace=False)) as running:
        yield running


def test_benchmark_against_our_server_counts_what_the_server_counts(server):
    requests = noodle_requests(12, output_len=8, seed=1)
    config = BenchConfig(base_url=server.url, model="noodle-apprentice", request_rate=50.0, ignore_eos=True,
                         slo={"ttft": 60_000})
    before = server.engine.stats.num_steps
    bench = run_benchmark(config, requests, progress=False)
    m = bench.metrics
    assert m.num_completed == 12 and m.num_failed == 0
    assert m.total_output_tokens == 12 * 8  # exactly max_tokens each (ignore_eos), from usage
    assert m.goodput == pytest.approx(m.request_throughput)
    assert all(len(r.chunk_times) == 8 for r in bench.results)  # one chunk per token: really streamed
    assert server.engine.stats.num_steps > before
    # Chat, not streamed: TTFT is the whole wait.
    chat = run_benchmark(BenchConfig(base_url=server.url, model="noodle-apprentice", endpoint="/v1/chat/completions",
                                     stream=False, max_concurrency=2), requests[:4], progress=False)
    assert chat.metrics.num_completed == 4
    assert all(r.ttft == r.e2e_latency for r in chat.results)
    # A server that refuses: failures are recorded, not raised; with the initial test, it stops before.
    wrong = run_benchmark(BenchConfig(base_url=server.url, model="nope"), requests[:2], progress=False)
    assert wrong.metrics.num_failed == 2 and "404" in wrong.results[0].error
    started = time.monotonic()
    with pytest.raises(ValueError, match="initial test request failed.*404"):
        run_benchmark(BenchConfig(base_url=server.url, model="nope", initial_test=True), requests[:2], progress=False)
    assert time.monotonic() - started < 10  # a 4xx is not retried until the ready timeout
    curve = sweep(config, requests[:6], [5.0, math.inf], progress=False)
    assert [c.config.request_rate for c in curve] == [5.0, math.inf]


def test_cli_writes_a_json_result(server, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["bench", "serve", "--base-url", server.url, "--model", "noodle-apprentice", "--num-prompts", "6",
                 "--output-len", "6", "--ignore-eos", "--max-concurrency", "3", "--goodput", "ttft:60000",
                 "--result-file", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "P99 TTFT (ms)" in printed and "goodput" in printed
    data = json.loads(out.read_text())
    assert data["completed"] == 6 and data["output_lens"] == [6] * 6 and data["max_concurrency"] == 3
    assert len(data["ttfts"]) == 6 and "api_key" not in data
    code = main(["bench", "serve", "--base-url", server.url, "--model", "noodle-apprentice", "--num-prompts", "4",
                 "--output-len", "4", "--sweep", "20,inf", "--result-file", str(out), "--no-progress"])
    assert code == 0 and len(json.loads(out.read_text())["sweep"]) == 2
    assert main(["bench", "serve", "--model", "m", "--goodput", "speed:3"]) == 2


VLLM_LABELS = ["Successful requests:", "Failed requests:", "Maximum request concurrency:", "Benchmark duration (s):",
               "Total input tokens:", "Total generated tokens:", "Request throughput (req/s):",
               "Request goodput (req/s):", "Output token throughput (tok/s):",
               "Peak output token throughput (tok/s):", "Peak concurrent requests:", "Total Token throughput (tok/s):"]


def test_random_defaults_fit_the_served_models_context(server):
    from minilm_engine.bench.cli import RANDOM_LENS, random_lengths, served_max_model_len
    from minilm_engine.bench.serve import BenchConfig

    assert random_lengths(None, None, 0.0, None) == RANDOM_LENS  # unknown context: vLLM's defaults
    assert random_lengths(None, None, 0.0, 100_000) == RANDOM_LENS  # they fit
    for context, ratio in ((1024, 0.0), (1024, 0.25), (256, 0.5), (40, 0.0)):
        input_len, output_len = random_lengths(None, None, ratio, context)
        assert (input_len + output_len) * (1 + ratio) <= context + 1  # the longest draws fit
        assert 1 <= output_len <= RANDOM_LENS[1] and 1 <= input_len <= RANDOM_LENS[0]
    assert random_lengths(24, 6, 0.0, 16) == (24, 6)  # given lengths are the caller's
    assert random_lengths(None, 6, 0.0, 64)[0] == 58 and random_lengths(24, None, 0.0, 64) == (24, 8)
    config = BenchConfig(base_url=server.url, model="noodle-apprentice")
    assert served_max_model_len(config) == server.engine.max_model_len
    assert served_max_model_len(BenchConfig(base_url=server.url, model="other")) is None


def test_a_vllm_bench_serve_command_line_runs_unchanged(server, tmp_path, capsys):
    """The flags of `vllm bench serve --backend vllm ...`, its labels, its JSON keys, and an
    initial test plus warm-ups before the timed run."""
    seen = []
    observe = server.engine.on_request_added
    server.engine.on_request_added = lambda request: seen.append(request.request_id)
    try:
        code = main(["bench", "serve", "--backend", "vllm", "--model", "noodle-apprentice", "--host", "127.0.0.1",
                     "--port", str(server.port), "--dataset-name", "random", "--random-input-len", "24",
                     "--random-output-len", "6", "--random-range-ratio", "0.25", "--num-prompts", "8",
                     "--max-concurrency", "4", "--request-rate", "inf", "--num-warmups", "2", "--seed", "3",
                     "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99,99.9",
                     "--goodput", "ttft:60000", "--save-result", "--result-dir", str(tmp_path / "results"),
                     "--result-filename", "run.json", "--save-detailed", "--label", "ours",
                     "--metadata", "tp=1", "note=cpu", "--trust-remote-code", "--disable-tqdm"])
    finally:
        server.engine.on_request_added = observe
    assert code == 0
    assert len(seen) == 1 + 2 + 8  # the initial test, the warm-ups, the run
    printed = capsys.readouterr().out
    for label in VLLM_LABELS:
        assert label in printed, label
    for short in ("TTFT", "TPOT", "ITL", "E2EL"):
        for stat in ("Mean", "Median", "P50", "P99", "P99.9"):
            assert f"{stat} {short} (ms):" in printed, (stat, short)
    assert printed.index("Time to First Token") < printed.index("Inter-token Latency") < printed.index("End-to-end")

    data = json.loads((tmp_path / "results" / "run.json").read_text())
    for key in ("date", "backend", "label", "model_id", "tokenizer_id", "num_prompts", "request_rate",
                "burstiness", "max_concurrency", "duration", "completed", "failed", "total_input_tokens",
                "total_output_tokens", "request_throughput", "request_goodput", "output_throughput",
                "total_token_throughput", "max_output_tokens_per_s", "max_concurrent_requests",
                "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors"):
        assert key in data, key
    assert (data["backend"], data["label"], data["tp"], data["note"]) == ("vllm", "ours", "1", "cpu")
    assert data["completed"] == 8 and data["failed"] == 0 and data["request_rate"] == "inf"
    # --dataset-name random: exactly max_tokens each (ignore_eos, as vLLM sets it), lengths 6 +- 25 %.
    assert data["ignore_eos"] and all(4 <= n <= 8 for n in data["output_lens"])
    assert data["total_output_tokens"] == sum(data["output_lens"])
    assert data["request_goodput"] == pytest.approx(data["request_throughput"])
    ttfts_ms = 1000 * np.asarray(data["ttfts"])
    assert data["mean_ttft_ms"] == pytest.approx(ttfts_ms.mean())
    assert data["median_ttft_ms"] == pytest.approx(np.median(ttfts_ms))
    assert data["std_ttft_ms"] == pytest.approx(ttfts_ms.std())
    for word, p in (("50", 50), ("99", 99), ("99.9", 99.9)):
        assert data[f"p{word}_ttft_ms"] == pytest.approx(np.percentile(ttfts_ms, p))
    itls_ms = 1000 * np.asarray([gap for gaps in data["itls"] for gap in gaps])
    assert data["p99_itl_ms"] == pytest.approx(np.percentile(itls_ms, 99))
    for name in ("tpot", "e2el"):
        assert data[f"mean_{name}_ms"] > 0 and data[f"p99.9_{name}_ms"] >= data[f"median_{name}_ms"]
    assert "p90_ttft_ms" not in data  # only the percentiles asked for
    # The ledger reads it as it reads vLLM's own result files.
    m = Measurement.from_bench_json(data)
    assert m.num_requests == 8 and m.duration_s == data["duration"]
    assert m.ttft_s[99] == pytest.approx(data["p99_ttft_ms"] / 1000)


def test_vllm_backends_datasets_and_default_result_name(server, tmp_path, capsys, monkeypatch):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"prompt": "Two bowls, please.", "max_tokens": 4}\n{"prompt": "Receipt #1\\n"}\n')
    monkeypatch.chdir(tmp_path)
    code = main(["bench", "serve", "--backend", "openai-chat", "--base-url", server.url, "--model", "noodle-apprentice",
                 "--dataset-name", "custom", "--dataset-path", str(path), "--custom-output-len", "3",
                 "--num-prompts", "4", "--percentile-metrics", "ttft,e2el", "--metric-percentiles", "99",
                 "--save-result", "--disable-tqdm"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "P99 TTFT (ms):" in printed and "P99 E2EL (ms):" in printed and "ITL" not in printed
    (written,) = tmp_path.glob("openai-chat-infqps-noodle-apprentice-*.json")  # vLLM's default name
    data = json.loads(written.read_text())
    assert data["endpoint"] == "/v1/chat/completions" and data["completed"] == 4
    assert "mean_itl_ms" not in data and "p99_e2el_ms" in data
    # Both spellings of one choice at once: an error, exit code 2.
    assert main(["bench", "serve", "--model", "m", "--dataset", "noodle", "--dataset-name", "random"]) == 2
    assert main(["bench", "serve", "--model", "m", "--dataset-name", "custom"]) == 2
    assert main(["bench", "serve", "--model", "m", "--metric-percentiles", "0"]) == 2


def test_the_initial_test_waits_for_a_server_that_is_still_starting():
    llm = LLM("noodle-apprentice", device="cpu", record_trace=False)
    port = free_port()
    late = ServerThread(llm, port=port)
    starter = threading.Timer(1.5, late.start)  # the server comes up while bench serve is waiting
    starter.start()
    try:
        config = BenchConfig(base_url=f"http://127.0.0.1:{port}", model="noodle-apprentice", initial_test=True,
                             ready_timeout_s=30, ignore_eos=True)
        bench = run_benchmark(config, noodle_requests(4, output_len=4, seed=0), progress=False)
        assert bench.metrics.num_completed == 4
        # The clock started after the server answered: no request waited for it to start.
        assert max(r.ttft for r in bench.results) < 1.5
    finally:
        starter.join()
        late.stop()
    with pytest.raises(ValueError, match="initial test"):
        run_benchmark(BenchConfig(base_url=f"http://127.0.0.1:{free_port()}", model="m", initial_test=True,
                                  ready_timeout_s=1.0), noodle_requests(1), progress=False)


@pytest.mark.slow
def test_bench_serve_measures_a_server_that_is_not_ours(tmp_path, capsys):
    """`transformers serve` is an independent OpenAI-compatible server: bench serve must work
    against it unchanged (where a server sends no usage, tokens are counted as chunks)."""
    chef = str(CHECKPOINTS_DIR / "noodle-chef")
    port = free_port()
    command = [str(Path(sys.executable).parent / "transformers"), "serve", chef, "--port", str(port), "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                               env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            assert process.poll() is None, process.stderr.read()[-2000:]
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        else:
            pytest.fail("transformers serve did not start within 180 s")
        out = tmp_path / "theirs.json"
        code = main(["bench", "serve", "--base-url", f"http://127.0.0.1:{port}", "--model", chef,
                     "--num-prompts", "6", "--output-len", "8", "--max-concurrency", "2", "--result-file", str(out),
                     "--no-progress"])
        data = json.loads(out.read_text())
        assert code == 0 and data["completed"] == 6, data["errors"]
        assert all(n >= 1 for n in data["output_lens"]) and data["p99_ttft_ms"] > 0
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
