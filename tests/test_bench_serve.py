"""`bench serve`: its arithmetic against hand-computed cases, its arrival law, its request sets, and
the whole command against our server and against a server that is not ours (`transformers serve`)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from minilm_engine import LLM
from minilm_engine.bench.datasets import BenchRequest, draw_length, jsonl_requests, noodle_requests
from minilm_engine.bench.metrics import RequestResult, Summary, meets_slo, parse_slo, summarize
from minilm_engine.bench.serve import BenchConfig, arrival_offsets, run_benchmark, sweep
from minilm_engine.cli import main
from minilm_engine.entrypoints.openai import ServerThread
from minilm_engine.entrypoints.openai.api_server import free_port
from minilm_engine.models.loader import CHECKPOINTS_DIR


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
    # A server that refuses: failures are recorded, not raised.
    wrong = run_benchmark(BenchConfig(base_url=server.url, model="nope"), requests[:2], progress=False)
    assert wrong.metrics.num_failed == 2 and "404" in wrong.results[0].error
    curve = sweep(config, requests[:6], [5.0, math.inf], progress=False)
    assert [c.config.request_rate for c in curve] == [5.0, math.inf]


def test_cli_writes_a_json_result(server, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(["bench", "serve", "--base-url", server.url, "--model", "noodle-apprentice", "--num-prompts", "6",
                 "--output-len", "6", "--ignore-eos", "--max-concurrency", "3", "--goodput", "ttft:60000",
                 "--result-file", str(out), "--no-progress"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "Serving Benchmark Result" in printed and "P99 (ms)" in printed and "goodput" in printed
    data = json.loads(out.read_text())
    assert data["num_completed"] == 6 and data["output_lens"] == [6] * 6 and data["max_concurrency"] == 3
    assert len(data["ttfts"]) == 6 and "api_key" not in data
    code = main(["bench", "serve", "--base-url", server.url, "--model", "noodle-apprentice", "--num-prompts", "4",
                 "--output-len", "4", "--sweep", "20,inf", "--result-file", str(out), "--no-progress"])
    assert code == 0 and len(json.loads(out.read_text())["sweep"]) == 2
    assert main(["bench", "serve", "--model", "m", "--goodput", "speed:3"]) == 2


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
        assert code == 0 and data["num_completed"] == 6, data["errors"]
        assert all(n >= 1 for n in data["output_lens"]) and data["ttft_ms"]["p99"] > 0
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
