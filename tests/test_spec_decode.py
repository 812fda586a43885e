"""Tests for minilm_engine.worker.spec_decode: the config, the metrics and formula, the draft proposer.

The proposer is checked against plain greedy decoding: with the target itself as its own draft,
its proposals are exactly the target's next tokens, round after round, with rollbacks between
them; its block pool is empty once the request is freed.  (The engine's use of it, with the
rejection sampler, is in tests/test_spec_decode_engine.py.)
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from minilm_engine import SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.model import load_model
from minilm_engine.worker.spec_decode import SpecDecodingStats, SpeculativeConfig, expected_tokens_per_round
from minilm_engine.worker.spec_decode.proposer import DraftModelProposer, num_drafts_wanted


# ---------------------------------------------------------------------- config
def test_parse_turns_speculation_off_for_none_or_zero():
    assert SpeculativeConfig.parse(None) is None
    assert SpeculativeConfig.parse({"model": "noodle-apprentice", "num_speculative_tokens": 0}) is None
    assert SpeculativeConfig.parse({"model": "noodle-apprentice", "num_speculative_tokens": None}) is None
    config = SpeculativeConfig.parse({"model": "noodle-apprentice", "num_speculative_tokens": 3})
    assert config == SpeculativeConfig("noodle-apprentice", 3)
    assert SpeculativeConfig.parse(config) is config


@pytest.mark.parametrize(
    "value, error, match",
    [
        ({"model": "x", "num_speculative_tokens": -1}, ValueError, r"num_speculative_tokens must be in \[1, 16\].*got -1"),
        ({"model": "x", "num_speculative_tokens": 17}, ValueError, "got 17"),
        ({"model": "x", "num_speculative_tokens": 2.0}, TypeError, "must be an int, got 2.0"),
        ({"model": "x", "num_speculative_tokens": True}, TypeError, "must be an int, got True"),
        ({"num_speculative_tokens": 3}, ValueError, "needs a 'model'"),
        ({"model": "x", "num_speculative_tokens": 3, "draft_tp": 1}, TypeError, r"unknown speculative_config keys \['draft_tp'\]"),
        ({"method": "medusa", "num_speculative_tokens": 3}, ValueError, "method'\\] must be one of"),
        ({"method": "ngram", "model": "x", "num_speculative_tokens": 3}, ValueError, "leave out 'model'"),
        ({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 5}, ValueError, "prompt_lookup_min <= prompt_lookup_max"),
        ("noodle-apprentice", TypeError, "must be a dict like"),
        ({"model": "", "num_speculative_tokens": 3}, TypeError, "must be a folder, a hub id"),
    ],
)
def test_bad_configs_raise(value, error, match):
    with pytest.raises(error, match=match):
        SpeculativeConfig.parse(value)


# ---------------------------------------------------------------------- metrics
def test_formula_matches_the_seed_example_and_its_limits():
    assert expected_tokens_per_round(0.8, 3) == pytest.approx(2.952)
    assert expected_tokens_per_round(0.0, 5) == 1.0  # every draft rejected: the target's token only
    assert expected_tokens_per_round(1.0, 5) == 6.0  # every draft accepted, plus the bonus
    # The closed form is the sum 1 + a + ... + a^K.
    assert expected_tokens_per_round(0.6, 4) == pytest.approx(sum(0.6**i for i in range(5)))
    with pytest.raises(ValueError, match=r"alpha must be in \[0, 1\], got 1.5"):
        expected_tokens_per_round(1.5, 3)


def test_stats_count_rounds_tokens_and_positions():
    stats = SpecDecodingStats(num_spec_tokens=3)
    stats.observe(3, 3)  # all accepted
    stats.observe(3, 1)  # second draft rejected (the third unread)
    stats.observe(2, 0)  # near max_tokens: two drafts, the first rejected
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.num_accepted_tokens_per_pos == [2, 1, 1]
    assert stats.num_compared_tokens_per_pos == [3, 2, 1]
    assert stats.draft_acceptance_rate == pytest.approx(4 / 8)
    assert stats.alpha == pytest.approx(4 / 6)  # 6 drafts ruled on: 3 + 2 + 1
    assert stats.mean_acceptance_length == pytest.approx(1 + 4 / 3)
    assert stats.acceptance_rate_per_pos == pytest.approx([2 / 3, 1 / 2, 1.0])
    total = SpecDecodingStats(num_spec_tokens=3)
    total.merge(stats)
    total.merge(stats)
    assert total.num_accepted_tokens_per_pos == [4, 2, 2] and total.num_drafts == 6
    with pytest.raises(ValueError, match="accepted"):
        stats.observe(2, 3)
    assert SpecDecodingStats(num_spec_tokens=2).alpha is None


# ---------------------------------------------------------------------- proposer
@pytest.fixture(scope="module")
def target(checkpoints):
    return BaselineLLM(checkpoints["qwen3"].path, strategy="kv_cache", max_model_len=64)


def greedy_tokens(llm, prompt_ids, n):
    (out,) = llm.generate([{"prompt_token_ids": prompt_ids}], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
    return out.outputs[0].token_ids


def test_proposer_with_the_target_as_draft_proposes_the_targets_tokens(target, checkpoints):
    """Rounds of 4 drafts, 'accepting' 0, 2, 4 of them, rolled back in between: every proposal is
    the target's own greedy continuation, and freeing leaves the draft's pool empty."""
    draft = load_model(checkpoints["qwen3"].path)
    proposer = DraftModelProposer(draft, num_blocks=32, block_size=4, enable_prefix_caching=True)
    prompt = list(range(5, 16))
    reference = greedy_tokens(target, prompt, 20)
    (request,) = target.make_requests({"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    request.append_output_token(reference[0])  # the target's prefill sampled it
    request.num_computed_tokens = len(prompt)
    for num_accepted in (0, 2, 4, 1):
        (proposal,) = proposer.propose([request], [4])
        n = len(request.output_token_ids)
        assert proposal.token_ids == reference[n : n + 4] and proposal.probs is None
        # The target accepts `num_accepted` drafts and adds one token of its own.
        for token in reference[n : n + num_accepted + 1]:
            request.append_output_token(token)
        request.num_computed_tokens = request.num_tokens - 1
        proposer.rollback(request)
        assert proposer.num_computed_tokens[request.request_id] <= request.num_computed_tokens
        table = proposer.block_manager.get_block_table(request.request_id)
        assert len(table) == -(-proposer.num_computed_tokens[request.request_id] // 4)
        proposer.block_pool.check_invariants()
    proposer.free(request.request_id)
    proposer.free(request.request_id)  # idempotent
    assert proposer.block_pool.num_used_blocks == 0


def test_sampling_proposals_carry_the_drafts_distributions(target, checkpoints):
    draft = load_model(checkpoints["llama"].path)
    proposer = DraftModelProposer(draft, num_blocks=32, block_size=4, enable_prefix_caching=False)
    (request,) = target.make_requests({"prompt_token_ids": [3, 4, 5]}, SamplingParams(temperature=0.8, top_k=5, seed=1))
    request.append_output_token(7)
    request.num_computed_tokens = 3
    (proposal,) = proposer.propose([request], [3])
    assert len(proposal.token_ids) == 3 and proposal.probs.shape == (3, draft.config.vocab_size)
    assert torch.allclose(proposal.probs.sum(-1), torch.ones(3))
    assert ((proposal.probs > 0).sum(-1) <= 5).all()  # top-k applied to the draft too
    for token, q in zip(proposal.token_ids, proposal.probs):
        assert q[token] > 0



def test_the_drafts_forward_runs_with_its_device_current(target, checkpoints, monkeypatch):
    """Triton kernels launch on the current CUDA device: on a model on cuda:1 the draft's
    forward ran on cuda:0's (the target's runner set its device; the proposer did not)."""
    from minilm_engine.worker.spec_decode import proposer as proposer_module

    current = []  # the device a `device_context` made current, while inside it

    @contextlib.contextmanager
    def recording_context(device):
        current.append(device)
        yield
        current.pop()

    monkeypatch.setattr(proposer_module, "device_context", recording_context, raising=False)
    draft = load_model(checkpoints["qwen3"].path)
    proposer = DraftModelProposer(draft, num_blocks=32, block_size=4, enable_prefix_caching=False)
    seen = []
    forward = draft.forward
    monkeypatch.setattr(draft, "forward", lambda *args: (seen.append(list(current)), forward(*args))[1])
    (request,) = target.make_requests({"prompt_token_ids": [3, 4, 5]}, SamplingParams(temperature=0))
    request.append_output_token(7)
    request.num_computed_tokens = 3
    (proposal,) = proposer.propose([request], [3])
    assert len(proposal.token_ids) == 3 and seen == [[draft.device]] * 3

def test_num_drafts_wanted_shrinks_near_the_end(target):
    (request,) = target.make_requests({"prompt_token_ids": [1, 2]}, SamplingParams(max_tokens=5))
    assert num_drafts_wanted(request, 3) == 3
    for token in (9, 9, 9):
        request.append_output_token(token)
    assert num_drafts_wanted(request, 3) == 1  # 2 tokens left: 1 draft + the target's token
    request.append_output_token(9)
    assert num_drafts_wanted(request, 3) == 0


# ---------------------------------------------------------------------- n-gram drafting
def test_ngram_config_needs_no_model():
    config = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3})
    assert (config.model, config.method, config.prompt_lookup_min, config.prompt_lookup_max) == (None, "ngram", 1, 3)


def test_find_ngram_continuation_takes_the_latest_longest_match():
    from minilm_engine.worker.spec_decode.ngram_proposer import find_ngram_continuation

    tokens = [1, 2, 3, 9, 1, 2, 3, 7, 8, 5, 2, 3]
    # Suffix [2, 3] occurs at 1 and 5; the latest (5) is followed by 7, 8, 5.
    assert find_ngram_continuation(tokens, 3, 1, 4) == [7, 8, 5]
    assert find_ngram_continuation(tokens, 10, 1, 4) == [7, 8, 5, 2, 3]  # runs to the end
    assert find_ngram_continuation([1, 2, 3], 3, 1, 4) == []  # nothing earlier matches
    assert find_ngram_continuation([4, 5, 6, 4, 5], 2, 3, 4) == []  # a 2-token match is too short
    assert find_ngram_continuation([4, 5, 6, 4, 5], 2, 2, 4) == [6, 4]
