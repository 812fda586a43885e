"""Context limits from memory: the KV pool's arithmetic, the longest context at a concurrency,
max_model_len derived from the pool when unset (kept when set), and a server request above it
refused with a 400 that gives the numbers, before any engine work."""

from __future__ import annotations

import httpx
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine import LLM
from minilm_engine.entrypoints.cli.main import main
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.core.kv_cache_utils import cdiv
from minilm_engine.core.kv_cache_sizing import KVCacheBudget, max_context_len
from minilm_engine.course.known_configs import known_config

MODEL = "noodle-chef"


def test_the_budget_of_a_known_model_is_its_shape_times_the_pool():
    config = known_config("Qwen/Qwen3-0.6B")  # 28 layers, 8 kv heads of 128
    budget = KVCacheBudget.of(config, torch.bfloat16, block_size=16, num_blocks=1000)
    assert budget.bytes_per_token_per_layer == 2 * 8 * 128 * 2 == 4096
    assert budget.bytes_per_token == 28 * 4096 == config.kv_bytes_per_token(2)
    assert budget.num_tokens == 16_000 and budget.num_bytes == 16_000 * 28 * 4096
    assert [budget.max_context_len(c) for c in (1, 4, 16, 3000)] == [16_000, 4000, 992, 0]
    text = budget.describe((1, 16))
    for piece in ("4,096 B per token per layer", "x 28 layers = 114,688 B per token", "1,000 blocks x 16 tokens",
                  "each of 16 requests at once: min(40,960, (1,000 // 16) x 16) = 992 tokens",
                  "one request alone: min(40,960, (1,000 // 1) x 16) = 16,000 tokens (the cap on any request)"):
        assert piece in text
    assert "longer ones still run" in text  # concurrency is how many fit at once, not a cap


@given(num_blocks=st.integers(1, 5000), block_size=st.integers(1, 64), concurrency=st.integers(1, 300),
       max_positions=st.integers(1, 100_000))
def test_the_context_at_a_concurrency_fits_that_many_requests_and_one_more_block_would_not(
        num_blocks, block_size, concurrency, max_positions):
    length = max_context_len(num_blocks, block_size, concurrency, max_positions)
    assert 0 <= length <= max_positions
    assert concurrency * cdiv(length, block_size) <= num_blocks  # all of them at once fit
    if length < max_positions:  # memory, not the architecture, is the limit: a block more does not fit
        assert concurrency * cdiv(length + 1, block_size) > num_blocks


def test_max_model_len_is_derived_from_the_pool_when_unset_and_kept_when_set():
    small = LLM(MODEL, device="cpu", num_kv_blocks=40, block_size=8, record_trace=False)
    assert small.max_model_len == small.engine.max_model_len == 320 == small.max_context_len(1)
    assert small.max_context_len(16) == 16
    assert "40 blocks x 8 tokens" in small.input_processor.max_model_len_reason
    with pytest.raises(ValueError, match=r"holds 320 .*derived from the KV cache: 40 blocks x 8"):
        small.generate({"prompt_token_ids": [5] * 330}, use_tqdm=False)
    roomy = LLM(MODEL, device="cpu", num_kv_blocks=200, block_size=8, record_trace=False)
    assert roomy.max_model_len == 1024 and roomy.input_processor.max_model_len_reason is None  # the architecture
    asked = LLM(MODEL, device="cpu", num_kv_blocks=40, block_size=8, max_model_len=512, record_trace=False)
    assert asked.max_model_len == 512  # the caller's, kept; requests above the pool refused one by one
    with pytest.raises(ValueError, match="whole pool has 40 blocks"):
        asked.generate({"prompt_token_ids": [5] * 330}, use_tqdm=False)


def test_the_server_refuses_a_request_above_the_context_with_the_numbers_before_any_work():
    llm = LLM(MODEL, device="cpu", num_kv_blocks=40, block_size=8, record_trace=False)
    with ServerThread(llm) as server:
        assert httpx.get(server.url + "/v1/models").json()["data"][0]["max_model_len"] == 320
        engine = server.engine.engine
        steps = engine.num_steps
        body = {"model": MODEL, "prompt": [5] * 300, "max_tokens": 30}  # token ids, as OpenAI takes them
        reply = httpx.post(server.url + "/v1/completions", json=body, timeout=30)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["code"] == "context_length_exceeded" and error["param"] == "max_tokens"
        for piece in ("maximum context length is 320", "requested 330 tokens", "300 in the prompt",
                      "30 for the completion", "derived from the KV cache: 40 blocks x 8 tokens"):
            assert piece in error["message"]
        assert engine.num_steps == steps and engine.block_pool.num_used_blocks == 0 and not engine.requests
        body["max_tokens"] = 20
        assert httpx.post(server.url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_serve_prints_the_arithmetic_at_startup(monkeypatch, capsys):
    monkeypatch.setattr("minilm_engine.entrypoints.openai.api_server.serve", lambda *args, **kwargs: None)
    assert main(["serve", "noodle-apprentice", "--device", "cpu", "--num-kv-blocks", "40", "--block-size", "8",
                 "--max-num-seqs", "4"]) == 0
    err = capsys.readouterr().err
    for piece in ("B per token per layer", "40 blocks x 8 tokens = 320 tokens", "each of 4 requests at once:",
                  "= 80 tokens", "max_model_len: 320 (derived from the KV cache"):
        assert piece in err


@pytest.mark.parametrize("num_kv_blocks, block_size, concurrency", [(64, 16, 4), (40, 8, 3)])
def test_the_engine_runs_all_requests_side_by_side_exactly_up_to_the_limit(num_kv_blocks, block_size, concurrency):
    from minilm_engine.course.experiments.context_limits import context_at_concurrency

    limit = max_context_len(num_kv_blocks, block_size, concurrency, 1024)
    table = context_at_concurrency(num_kv_blocks=num_kv_blocks, block_size=block_size, concurrency=concurrency,
                                   lengths=[limit - block_size, limit, limit + block_size + 1, 2 * limit])
    within, above = table[table["within limit"]], table[~table["within limit"]]
    assert len(within) == 2 and len(above) == 2
    assert (within["most running at once"] == concurrency).all() and (within["preemptions"] == 0).all()
    # Above it the pool runs out: fewer at once, or preempted mid-generation, and more steps.
    assert ((above["most running at once"] < concurrency) | (above["preemptions"] > 0)).all()
    assert above["steps"].min() > within["steps"].max()
    assert f"each of {concurrency} requests at once:" in table.attrs["arithmetic"]
