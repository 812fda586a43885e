"""Tests for minilm_engine.course.experiments.kv_growth: token-pass counts, KV sizes, measured growth."""

from __future__ import annotations

import random

import pytest
import torch

from minilm_engine import LLM
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.experiments.kv_growth import (
    GiB,
    compare_strategies,
    kv_bytes_per_token,
    kv_capacity_rows,
    kv_growth_figure,
    max_cached_tokens,
    measure_kv_growth,
    measure_token_times,
    num_token_passes,
    strategy_times_figure,
    time_generation,
    token_times_figure,
    weight_bytes,
)
from minilm_engine.course.baselines.contiguous_cache import ContiguousKVCache
from minilm_engine.course.known_configs import KNOWN_CONFIGS, known_config
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.teaching.exercises_cost_kv import model_config, random_shapes


@pytest.mark.parametrize("num_prompt_tokens", [1, 7])
def test_num_token_passes_counts_every_forward(num_prompt_tokens: int) -> None:
    P = num_prompt_tokens
    for n in range(0, 30):
        assert num_token_passes(P, n, cached=False) == sum(P + i for i in range(n))
        assert num_token_passes(P, n, cached=True) == (P + n - 1 if n else 0)


def test_kv_bytes_per_token_is_the_engines() -> None:
    rng = random.Random(0)
    configs = [known_config(name) for name in KNOWN_CONFIGS]
    configs += [model_config(random_shapes(rng)) for _ in range(50)]
    for config in configs:
        for b in (1, 2, 4):
            assert kv_bytes_per_token(config, b) == config.kv_bytes_per_token(b)


def test_max_cached_tokens() -> None:
    llama3 = known_config("Meta-Llama-3-8B")
    free = 80 * GiB - 8_030_261_248 * 2
    assert max_cached_tokens(llama3, 80 * GiB) == free // (128 * 1024) == 532_827
    assert max_cached_tokens(llama3, 10 * GiB) == 0  # the weights alone do not fit
    assert max_cached_tokens(llama3, weight_bytes(llama3)) == 0
    assert max_cached_tokens(llama3, 80 * GiB, bytes_per_element=1) > 2 * 532_827
    rows = kv_capacity_rows({"llama3": llama3}, [16, 80])
    assert rows[0]["tokens in 80 GiB"] == 532_827 and rows[0]["KV KiB/token"] == 128


def test_recompute_and_cache_agree_and_are_timed(checkpoints, prompts) -> None:
    path = checkpoints["qwen3"].path
    llms = {name: BaselineLLM(path, strategy=name) for name in ("no_cache", "kv_cache")}
    runs = {name: measure_token_times(llm, prompts[0], 12, 2) for name, llm in llms.items()}
    assert runs["no_cache"].token_ids == runs["kv_cache"].token_ids
    for run in runs.values():
        assert len(run.latencies_s) == 12 and all(t > 0 for t in run.latencies_s)
        assert run.positions[0] == run.num_prompt_tokens - 1
        assert run.positions[-1] == run.num_prompt_tokens + 10
        assert run.total_s == pytest.approx(sum(run.latencies_s))
    assert time_generation(llms["kv_cache"], prompts[1], 5) > 0
    rows = compare_strategies(llms, prompts[0], [2, 4], num_repeats=2)
    assert [r["num_new_tokens"] for r in rows] == [2, 4] and all(r["no_cache"] > 0 for r in rows)
    for r in rows:  # every repeat kept, the row's value the fastest of them
        assert {name: len(times) for name, times in r["repeats_s"].items()} == {"no_cache": 2, "kv_cache": 2}
        assert r["kv_cache"] == min(r["repeats_s"]["kv_cache"])
    token_times_figure(list(runs.values()))
    strategy_times_figure(rows)


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_measure_kv_growth(checkpoints, prompts, ignore_eos: bool) -> None:
    llm = LLM(checkpoints["llama3_rope"].path, block_size=4, max_num_batched_tokens=8)
    points = measure_kv_growth(llm, prompts[2], max_tokens=20, ignore_eos=ignore_eos)
    per_token = llm.config.kv_bytes_per_token(torch.empty((), dtype=llm.dtype).element_size())
    request_tokens = len(llm.tokenizer.encode(prompts[2]))
    assert points, "the request must hold blocks for at least one step"
    for p in points:
        assert p.exact_bytes == p.num_tokens * per_token
        assert p.paged_bytes == -(-p.num_tokens // 4) * 4 * per_token  # whole blocks
        assert p.exact_bytes <= p.paged_bytes < p.exact_bytes + 4 * per_token
        assert p.contiguous_bytes == (request_tokens + 20) * per_token
    # chunked prefill (8 tokens a step), then one more token per decode step
    decode = [p.num_tokens for p in points if p.num_tokens > request_tokens]
    assert decode == list(range(request_tokens + 1, request_tokens + 1 + len(decode)))
    if ignore_eos:
        # The step that samples token 20 (feeding token 19) finishes the request and frees
        # its blocks: the last point recorded is the step before, with token 18 fed.
        assert points[-1].num_tokens == request_tokens + 20 - 2
    reserved = ContiguousKVCache(llm.config, 1, request_tokens + 20, llm.dtype, llm.device)
    assert reserved.num_bytes == points[0].contiguous_bytes
    assert not llm.engine.has_unfinished_requests()
    assert llm.engine.block_pool.num_used_blocks == 0
    kv_growth_figure(points)


def test_measure_kv_growth_needs_an_idle_engine(checkpoints, prompts) -> None:
    llm = LLM(checkpoints["llama"].path)
    llm.engine.add_request("busy", prompts[0], SamplingParams(max_tokens=3))
    with pytest.raises(RuntimeError, match="idle engine"):
        measure_kv_growth(llm, prompts[1], 4)
    with pytest.raises(AttributeError):
        measure_kv_growth(BaselineLLM(checkpoints["llama"].path, strategy="kv_cache"), prompts[1], 4)


@pytest.mark.parametrize("num_prompt_tokens", [1, 7])
def test_attention_key_reads_quadratic_with_the_cache_cubic_without(num_prompt_tokens: int) -> None:
    from minilm_engine.course.experiments.kv_growth import num_attention_key_reads

    P = num_prompt_tokens
    causal = lambda T: T * (T + 1) // 2  # noqa: E731 - keys a causal pass over T tokens reads
    for n in range(1, 25):
        # With the cache: the prompt's square once, then one query over P+i+1 keys per new token.
        assert num_attention_key_reads(P, n, cached=True) == causal(P) + sum(P + i + 1 for i in range(1, n))
        # Without: the whole causal square of every step's sequence.
        assert num_attention_key_reads(P, n, cached=False) == sum(causal(P + i) for i in range(n))
    assert num_attention_key_reads(P, 0, cached=True) == 0
    # Doubling a long generation: about 4x the key reads with the cache, about 8x without.
    assert 3.5 < num_attention_key_reads(P, 800, True) / num_attention_key_reads(P, 400, True) < 4.1
    assert 7.0 < num_attention_key_reads(P, 800, False) / num_attention_key_reads(P, 400, False) < 8.1


def test_latent_attention_and_sliding_windows() -> None:
    from minilm_engine.course.experiments.kv_growth import mla_kv_bytes_per_token, sequence_kv_bytes

    # DeepSeek-V3: 61 layers x (512 latent + 64 rope) numbers x 2 bytes
    assert mla_kv_bytes_per_token(61, 512, 64) == 61 * 576 * 2 == 70_272
    assert sequence_kv_bytes(100, 10) == 1000
    assert sequence_kv_bytes(100, 10, sliding_window=4) == 400
    assert sequence_kv_bytes(100, 3, sliding_window=4) == 300
