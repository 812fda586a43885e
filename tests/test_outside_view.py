"""Chapter 10's client-side measurements, against a real `minilm-engine serve` process."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from minilm_engine.course.experiments import outside_view
from minilm_engine.course.experiments.outside_view import (
    ServerProcess,
    stable_prefix_first,
    ttft_by_prompt_length,
)
from minilm_engine.model.loader import resolve_model_path


@pytest.fixture(scope="module")
def server():
    with ServerProcess(None, ["--max-num-seqs", "4"], threads=1) as s:
        yield s
    assert "serving on http://127.0.0.1:" in s.log


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_model_path(None))


def test_a_server_that_cannot_start_says_why():
    with pytest.raises(RuntimeError, match="max_num_seqs"):
        ServerProcess(None, ["--max-num-seqs", "0"]).start()


def test_ttft_by_prompt_length_pays_every_prefill(server, tokenizer):
    table = ttft_by_prompt_length(server, tokenizer, [8, 64, 256], num_repeats=2)
    assert table.attrs["prefix_cache_hit_tokens"] == 0  # a unique first line every time: nothing reused
    counted = table["prompt tokens"].tolist()
    assert counted == sorted(counted) and abs(counted[-1] - 256) <= 16
    assert (table["TTFT min ms"] <= table["TTFT p50 ms"]).all() and (table["TTFT p50 ms"] <= table["TTFT max ms"]).all()
    assert all(len(v) == 2 for v in table.attrs["ttft_seconds"].values())


def test_stable_text_first_is_found_in_the_prefix_cache(server, tokenizer):
    table = stable_prefix_first(server, tokenizer, stable_tokens=128, question_tokens=8, num_requests=3).set_index("layout")
    # Shared text first: every request after the first reuses its full blocks (~128 of ~150 tokens).
    assert table.loc["stable first", "cached share"] > 0.4
    # Question first: the prompts differ from the first block on, so nothing is reused.
    assert table.loc["question first", "cached share"] == 0
    assert abs(table.loc["stable first", "prompt tokens"] - table.loc["question first", "prompt tokens"]) <= 4
    with pytest.raises(ValueError, match="num_requests"):
        stable_prefix_first(server, tokenizer, num_requests=1)


def test_capacity_is_the_rate_of_a_burst(server):
    rate = outside_view.capacity(server, num_requests=4, output_len=4)
    assert 0 < rate < 1000


def test_a_token_limit_refuses_huge_requests_and_passes_as_many_small_ones(tokenizer):
    table = outside_view.tokens_not_requests(None, tokenizer, num_requests=4, small=(8, 4), huge=(64, 32))
    small, huge = table.set_index("user").loc["small requests"], table.set_index("user").loc["huge requests"]
    assert (small["answered 200"], small["answered 429"]) == (4, 0)
    assert (huge["answered 200"], huge["answered 429"]) == (2, 2)  # the limit is 2.5 huge requests
    assert table["other answers"].sum() == 0
    assert huge["remaining tokens after"] < huge["tokens reserved each"]
    with pytest.raises(ValueError, match="tokenizer"):
        outside_view.tokens_not_requests(None, None)
