"""Chapter 10's measurements beyond HTTP (course/experiments/user_view.py): jitter as a spread,
attention written out vs fused, the retry policies against the real limiter, the batch tier's
cost at each batch, and goodput per device on two devices."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from minilm_engine.bench.metrics import RequestResult
from minilm_engine.course.experiments import user_view
from minilm_engine.course.known_configs import known_config


def test_gap_spread_is_p90_minus_p10_of_one_request() -> None:
    result = RequestResult(success=True, sent_time=0.0, chunk_times=[0.1 * i for i in range(12)])
    assert user_view.gap_spread_ms(result) == pytest.approx(0.0, abs=1e-9)  # even gaps: no jitter
    uneven = RequestResult(success=True, sent_time=0.0, chunk_times=[0.0, 0.01, 0.02, 0.52, 0.53, 0.54])
    assert user_view.gap_spread_ms(uneven) > 100


def test_attention_written_out_and_fused_agree_and_report_the_score_bytes() -> None:
    table = user_view.attention_seconds(known_config("noodle-chef"), [16, 64], num_repeats=1)
    assert list(table["prompt tokens"]) == [16, 64]
    chef = known_config("noodle-chef")
    assert table["score bytes MiB"].iloc[1] == pytest.approx(chef.num_hidden_layers * chef.num_attention_heads * 64 * 64 * 4 / 2**20)


def test_retry_policies_on_the_real_limiter() -> None:
    storms = {p: user_view.retry_storm(p, num_clients=20, seed=1) for p in user_view.RETRY_POLICIES}
    for storm in storms.values():
        assert storm.num_attempts == 20 + storm.num_refused  # every client gets through in the end
    # 10 fit the bucket at once; the other 1,000 tokens refill at 100 a second: nobody finishes sooner
    assert all(s.last_admitted_s >= 10.0 - 1e-9 for s in storms.values())
    assert storms["Retry-After, no jitter"].last_admitted_s == pytest.approx(10.0)
    # honouring Retry-After alone synchronizes the refused clients: more 429s than with jitter
    assert storms["Retry-After, no jitter"].num_refused > storms["Retry-After + full jitter"].num_refused
    with pytest.raises(ValueError):
        user_view.retry_storm("retry at once")


def test_tier_costs_take_the_largest_batch_within_the_slo() -> None:
    table = pd.DataFrame({"batch": [1, 8, 64], "output tok/s": [100.0, 600.0, 1200.0], "TPOT ms": [10.0, 13.0, 50.0]})
    costs = user_view.tier_costs(table, tpot_slo_ms=20.0, dollars_per_hour=3.6)
    assert costs["interactive batch"] == 8 and costs["batch-tier batch"] == 64
    assert costs["discount"] == pytest.approx(0.5)
    assert costs["interactive $/Mtok"] == pytest.approx(3.6 / (600 * 3600) * 1e6)
    with pytest.raises(ValueError):
        user_view.tier_costs(table, tpot_slo_ms=5.0, dollars_per_hour=1.0)


@pytest.mark.slow
def test_goodput_sweep_runs_every_configuration_on_the_same_requests() -> None:
    torch.manual_seed(0)
    load = user_view.GoodputWorkload(num_requests=4, long_prompt_tokens=32, output_len=4)
    table = user_view.goodput_sweep(None, load, [50.0], [16], slo_ttft_s=60.0, slo_tpot_s=60.0)
    assert set(table["config"]) == {"2 replicas, whole prompts", "2 replicas, chunks of 16", "1 prefill + 1 decode"}
    assert (table["requests"] == 4).all() and (table["SLO met %"] == 100).all()
    assert user_view.highest_rate_meeting(table, "1 prefill + 1 decode") == 50.0


def test_goodput_workload_mixes_long_and_short_prompts_reproducibly() -> None:
    from transformers import AutoTokenizer

    from minilm_engine.model.loader import resolve_model_path

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(None))
    load = user_view.GoodputWorkload(num_requests=8, long_share=0.25, long_prompt_tokens=64)
    a, b = load.arrivals(tokenizer, 4.0), load.arrivals(tokenizer, 4.0)
    assert [x.prompt_token_ids for x in a] == [x.prompt_token_ids for x in b]
    assert sum(len(x.prompt_token_ids) == 64 for x in a) == 2
    assert all(x.time_s <= y.time_s for x, y in zip(a, a[1:]))
