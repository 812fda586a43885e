"""Tests for minilm_engine.course.experiments.disaggregation (chapter 10) on the shipped noodle-apprentice:
the three configurations compute the same tokens, the disaggregated run moves exactly the
prompts' KV that the consumer lacked, the clocks are causal (a token after its request
arrived, each after the one before), and the summary's spreads hold their medians.  Timings
themselves are not checked (noise)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from minilm_engine.course.experiments import disaggregation as dis

MODEL = "noodle-apprentice"
WORKLOAD = dis.DisaggWorkload(
    num_streams=3, stream_max_tokens=12, num_long_prompts=2, long_prompt_tokens=80, long_max_tokens=4,
    long_arrivals_s=(0.002, 0.01),
)


@pytest.fixture(scope="module")
def configs():
    return dis.build_configs(MODEL, device="cpu", chunk_tokens=16, max_num_seqs=5, max_model_len=256)


def kv_bytes_per_token(llm) -> int:
    c = llm.config
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4  # fp32


def test_the_table_compares_the_same_tokens_and_counts_the_kv_moved(configs):
    table, workload = dis.compare_disaggregation(workload=WORKLOAD, num_repeats=2, configs=configs)
    assert workload == WORKLOAD
    assert list(table["config"]) == list(dis.CONFIGS) * 2 and list(table["repeat"]) == [0, 0, 0, 1, 1, 1]
    assert table["same_tokens"].all()
    arrivals = WORKLOAD.requests(configs["mixed"].tokenizer)
    prompt_tokens = sum(len(a.prompt_token_ids) for a in arrivals)
    bpt = kv_bytes_per_token(configs["mixed"])
    for _, row in table.iterrows():
        assert row["itl_p50_ms"] <= row["itl_p99_ms"] <= row["itl_max_ms"]
        assert all(math.isfinite(row[m]) and row[m] >= 0 for m in dis.METRICS)
        if row["config"] == "disagg":
            # Every prompt reached the consumer: sent, or found in its prefix cache.
            assert row["kv_tokens"] + row["kv_cached_tokens"] == prompt_tokens
            assert row["kv_mib"] * 2**20 == row["kv_tokens"] * bpt and row["kv_transfer_ms"] > 0
        else:
            assert row["kv_tokens"] == row["kv_mib"] == row["kv_transfer_ms"] == 0
            assert row["device_s"] == pytest.approx(row["makespan_s"])  # never idle: all arrive early
    summary = dis.summarize(table)
    assert list(summary["config"]) == list(dis.CONFIGS) and summary["same_tokens"].all()
    for metric in dis.METRICS:
        assert (summary[f"{metric}_min"] <= summary[metric]).all() and (summary[metric] <= summary[f"{metric}_max"]).all()
    for llm in (configs["mixed"], configs["chunked"], configs["disagg"].kv_producer, configs["disagg"].kv_consumer):
        assert llm.engine.block_pool.num_used_blocks == 0


@pytest.mark.parametrize("label", dis.CONFIGS)
def test_every_clock_is_causal(configs, label):
    late = dis.DisaggWorkload(**{**WORKLOAD.__dict__, "long_arrivals_s": (0.0, 30.0)})  # l1 comes after an idle gap
    arrivals = late.requests(configs["mixed"].tokenizer)
    run = dis.run_config(configs[label], arrivals, label, f"causal-{label}")
    by_name = {a.name: a for a in arrivals}
    assert len(run.token_times_s) == len(arrivals)
    for rid, times in run.token_times_s.items():
        arrival = by_name[rid.rsplit("-", 1)[1]]
        assert len(times) == arrival.params.max_tokens == len(run.tokens[arrival.name])
        assert times[0] > run.arrival_s[rid] == arrival.time_s
        assert all(b > a for a, b in zip(times, times[1:]))
    # The idle gap is skipped on the clock, not counted as work.
    assert run.row()["makespan_s"] > 30.0 > run.device_s


def test_percentile_is_numpys():
    values = sorted(np.random.default_rng(0).exponential(size=101).tolist())
    for q in (0, 50, 90, 99, 100):
        assert dis.percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_a_bad_workload_is_refused():
    with pytest.raises(ValueError, match="num_streams"):
        dis.DisaggWorkload(num_streams=0)
    with pytest.raises(ValueError, match="2 times for 3 long prompts"):
        dis.DisaggWorkload(num_long_prompts=3, long_arrivals_s=(1.0, 2.0))
    with pytest.raises(ValueError, match="with_arrivals"):
        dis.DisaggWorkload().requests(None)
    spread = dis.DisaggWorkload(stream_max_tokens=100, num_long_prompts=3).with_arrivals(0.01)
    assert spread.long_arrivals_s == pytest.approx((0.25, 0.5, 0.75))
