"""Speculative decoding inside the continuous engine: outputs exactly the target's.

Greedy: for every architecture, with a draft that is a perturbed copy of the target (so some
drafts are accepted and some rejected), K = 1..6, a pool small enough to preempt and prefix
caching on, each request's tokens equal the ones it gets running alone without speculation
(`kv_cache`, itself tested equal to `transformers.generate`), and `transformers.generate`
directly.  Both block pools are checked after every step and are empty at the end.

Sampling: a chi-square test over many seeded requests, on the joint distribution of the first
tokens (each position's distribution computed exactly from `transformers`), with top-k keeping
the categories few.  Plus: seeds reproduce, metrics add up, aborts and preemption leak nothing,
and bad drafts are refused at construction.
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from scipy.stats import chisquare
from test_engine import BLOCK_SIZE, MAX_MODEL_LEN, alone, drive, num_cached_tokens, num_preempted, random_workload  # noqa: F401

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.course.experiments.step_table import steps_dataframe
from minilm_engine.worker.sampler import sampling_probs

from conftest import CHECKPOINT_NAMES, build_hf_model, hf_config, save_checkpoint, train_tokenizer, corpus_texts


def perturbed_copy(hf_model, folder, tokenizer, noise: float, seed: int = 0):
    """The target's weights plus Gaussian noise: a draft that agrees with it often, not always."""
    draft = copy.deepcopy(hf_model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(noise * torch.randn(param.shape, generator=gen))
    return save_checkpoint(folder, draft, tokenizer)


@pytest.fixture(scope="module")
def drafts(checkpoints, tmp_path_factory):
    """name -> folder of a perturbed copy of that checkpoint."""
    root = tmp_path_factory.mktemp("drafts")
    return {
        name: perturbed_copy(c.hf_model, root / name, c.tokenizer, noise=0.01)
        for name, c in checkpoints.items()
    }


def spec_llm(target, draft, k: int, **engine_args) -> LLM:
    engine_args.setdefault("block_size", BLOCK_SIZE)
    return LLM(
        target, max_model_len=MAX_MODEL_LEN,
        speculative_config={"model": str(draft), "num_speculative_tokens": k}, **engine_args,
    )


def check_both_pools(engine) -> None:
    engine.block_pool.check_invariants()
    engine.proposer.block_pool.check_invariants()


def drive_checked(engine, workload):
    """`drive`, checking the draft's pool too after every step."""
    engine.add_step_callback(lambda record: check_both_pools(engine))
    return drive(engine, workload)


# ---------------------------------------------------------------------- greedy exactness
@pytest.mark.parametrize("k", range(1, 7))
@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_greedy_with_preemption_and_prefix_caching_equals_running_alone(
    checkpoints, drafts, random_workload, alone, name, k
):
    workload = random_workload(100 + k, num_requests=12, max_tokens=20)
    # 13 blocks of 4 tokens: room for one request at its longest (30 + 20 tokens), not for all.
    llm = spec_llm(checkpoints[name].path, drafts[name], k, num_kv_blocks=13, max_num_seqs=6, max_num_batched_tokens=32)
    engine = llm.engine
    requests = drive_checked(engine, workload)
    for a in workload:
        assert requests[a.request_id].output_token_ids == alone(name, a.prompt, a.params), a.request_id
    stats = engine.spec_decoding_stats
    assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens  # both paths taken
    assert num_preempted(engine) > 0 and num_cached_tokens(engine) > 0
    assert engine.block_pool.num_used_blocks == 0 and engine.proposer.block_pool.num_used_blocks == 0
    assert not engine.proposer.num_computed_tokens


def test_greedy_without_chunked_prefill_or_prefix_caching(checkpoints, drafts, random_workload, alone):
    """The other engine settings: whole prompts only, no prefix cache, a small pool."""
    name = "mistral"
    workload = random_workload(31, num_requests=10, max_tokens=20)
    llm = spec_llm(checkpoints[name].path, drafts[name], 3, num_kv_blocks=13, max_num_seqs=6,
                   max_num_batched_tokens=MAX_MODEL_LEN, enable_chunked_prefill=False,
                   enable_prefix_caching=False)
    requests = drive_checked(llm.engine, workload)
    for a in workload:
        assert requests[a.request_id].output_token_ids == alone(name, a.prompt, a.params), a.request_id
    assert num_preempted(llm.engine) > 0 and num_cached_tokens(llm.engine) == 0
    assert llm.engine.proposer.block_pool.num_used_blocks == 0


@pytest.mark.parametrize("name", CHECKPOINT_NAMES)
def test_greedy_equals_transformers_generate(checkpoints, drafts, prompts, name):
    ckpt = checkpoints[name]
    llm = spec_llm(ckpt.path, drafts[name], 4)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        ids = torch.tensor([ckpt.tokenizer.encode(prompt)])
        expected = ckpt.hf_model.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert out.outputs[0].token_ids == expected[0, ids.shape[1]:].tolist()


def test_a_draft_of_another_architecture_and_the_target_itself(checkpoints, random_workload, alone):
    """Any draft with the same vocabulary works: a random model of another family (it almost
    never agrees) or the target itself (it always does: every round accepts all K)."""
    workload = random_workload(7, num_requests=8, max_tokens=20, kinds=("ids",))
    for draft, check in [("llama", lambda s: s.num_accepted_tokens < s.num_draft_tokens / 2), ("qwen3", None)]:
        llm = spec_llm(checkpoints["qwen3"].path, checkpoints[draft].path, 3)
        requests = drive_checked(llm.engine, workload)
        for a in workload:
            assert requests[a.request_id].output_token_ids == alone("qwen3", a.prompt, a.params)
        stats = llm.engine.spec_decoding_stats
        if check is None:  # the target as its own draft: only max_tokens cuts a round short
            assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
        else:
            assert check(stats)


def test_stops_inside_a_round_end_the_request_where_the_target_alone_would(checkpoints, drafts, alone):
    """A stop token or string among the accepted drafts ends the request there; the rest of
    the round is dropped and rolled back."""
    name = "llama"
    prompt = {"prompt_token_ids": [5, 6, 7, 8, 9]}
    free_run = alone(name, prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))
    tokenizer = checkpoints[name].tokenizer
    # A token first produced well into the run (so several rounds pass before it), whose text
    # does not occur before it either.
    stop_at = next(i for i in range(8, len(free_run)) if free_run[i] not in free_run[:i]
                   and tokenizer.decode(free_run[i : i + 1]).strip()
                   and tokenizer.decode(free_run[i : i + 1]) not in tokenizer.decode(free_run[:i]))
    stop_token, stop_text = free_run[stop_at], tokenizer.decode(free_run[stop_at : stop_at + 1])
    for params in [
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop_token_ids=[stop_token]),
        SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=[stop_text]),
    ]:
        llm = spec_llm(checkpoints[name].path, checkpoints[name].path, 6)  # all drafts accepted
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        (expected,) = LLM(checkpoints[name].path, max_model_len=MAX_MODEL_LEN).generate([prompt], params, use_tqdm=False)
        assert out.outputs[0].token_ids == expected.outputs[0].token_ids
        assert out.outputs[0].text == expected.outputs[0].text and out.outputs[0].finish_reason == "stop"
        assert len(out.outputs[0].token_ids) == stop_at + 1  # it ran until the stop, not before
        assert llm.engine.proposer.block_pool.num_used_blocks == 0
        # Near the stop the draft proposes fewer than K: it stops drafting where the request ends.
        last_round = [c for rec in llm.engine.trace.records for c in rec.chunks if c.num_draft_tokens][-1]
        assert last_round.num_draft_tokens < 6


# ---------------------------------------------------------------------- sampling exactness
def exact_joint_distribution(hf_model, prompt_ids, params, depth: int) -> dict[tuple[int, ...], float]:
    """P(first `depth` tokens) under the target alone, from transformers' logits."""
    dist = {(): 1.0}
    for _ in range(depth):
        grown = {}
        for prefix, prob in dist.items():
            ids = torch.tensor([prompt_ids + list(prefix)])
            with torch.no_grad():
                logits = hf_model(ids).logits[0, -1].float()
            probs = sampling_probs(logits, params)
            for token in (probs > 0).nonzero().flatten().tolist():
                grown[prefix + (token,)] = prob * probs[token].item()
        dist = grown
    return dist


@pytest.mark.slow
def test_sampled_outputs_follow_the_targets_distribution(checkpoints, drafts):
    """1200 seeded requests of 3 tokens, K = 2: the second and third come from one speculative
    round (drafted, accepted or rejected and resampled, or the bonus).  Their joint frequency
    must match the target's own distribution (27 categories with top_k = 3)."""
    name = "qwen2"
    ckpt = checkpoints[name]
    params = [SamplingParams(temperature=1.5, top_k=3, max_tokens=3, ignore_eos=True, seed=s) for s in range(1200)]
    prompt_ids = [11, 12, 13, 14, 15]
    llm = spec_llm(ckpt.path, drafts[name], 2, max_num_seqs=64, max_num_batched_tokens=256, record_trace=False)
    outputs = llm.generate([{"prompt_token_ids": prompt_ids}] * len(params), params, use_tqdm=False)
    stats = llm.engine.spec_decoding_stats
    assert stats.num_drafts >= 1000 and 0.2 < stats.draft_acceptance_rate < 0.95  # both paths taken
    expected = exact_joint_distribution(ckpt.hf_model, prompt_ids, params[0], depth=3)
    observed = {}
    for out in outputs:
        key = tuple(out.outputs[0].token_ids)
        assert key in expected, f"{key} has probability 0 under the target"
        observed[key] = observed.get(key, 0) + 1
    keys = sorted(expected)
    f_obs = [observed.get(key, 0) for key in keys]
    total = sum(expected.values())  # 1 up to float32 rounding
    f_exp = [expected[key] / total * len(outputs) for key in keys]
    assert chisquare(f_obs, f_exp).pvalue > 1e-3


def test_seeded_sampling_is_reproducible_whatever_runs_beside_it(checkpoints, drafts):
    name = "mistral"
    params = SamplingParams(temperature=0.9, top_p=0.9, max_tokens=16, seed=42)
    prompt = {"prompt_token_ids": [3, 1, 4, 1, 5]}
    others = [{"prompt_token_ids": [9, 2, 6, 5]}, "Hello"]
    alone_out = spec_llm(checkpoints[name].path, drafts[name], 3).generate([prompt], params, use_tqdm=False)
    crowd = spec_llm(checkpoints[name].path, drafts[name], 3).generate(
        others + [prompt], [SamplingParams(temperature=1.0, max_tokens=20)] * 2 + [params], use_tqdm=False
    )
    assert alone_out[0].outputs[0].token_ids == crowd[-1].outputs[0].token_ids


# ---------------------------------------------------------------------- metrics, aborts, memory
def test_metrics_add_up_per_request_per_step_and_per_engine(checkpoints, drafts, random_workload):
    name = "qwen3"
    workload = random_workload(3, num_requests=6, max_tokens=20)
    llm = spec_llm(checkpoints[name].path, drafts[name], 4)
    requests = drive(llm.engine, workload)
    engine_stats = llm.engine.spec_decoding_stats
    per_request = [r.metrics.spec_decoding for r in requests.values() if r.metrics.spec_decoding]
    assert sum(s.num_draft_tokens for s in per_request) == engine_stats.num_draft_tokens
    assert sum(s.num_accepted_tokens for s in per_request) == engine_stats.num_accepted_tokens
    assert sum(s.num_drafts for s in per_request) == engine_stats.num_drafts
    steps = steps_dataframe(llm.engine.trace)
    assert steps["num_draft_tokens"].sum() == engine_stats.num_draft_tokens
    assert steps["num_accepted_tokens"].sum() == engine_stats.num_accepted_tokens
    for record in llm.engine.trace.records:
        for chunk in record.chunks:
            if chunk.num_draft_tokens:
                assert chunk.num_decode_tokens == 1 + chunk.num_draft_tokens
                kept = chunk.output_token_ids[: chunk.num_accepted_tokens]
                assert kept == chunk.draft_token_ids[: len(kept)]
    for r in requests.values():  # every output token is the prefill's or came from a round
        s = r.metrics.spec_decoding
        rounds_tokens = 0 if s is None else s.num_drafts + s.num_accepted_tokens
        assert len(r.output_token_ids) <= 1 + rounds_tokens + sum(
            1 for rec in llm.engine.trace.records for c in rec.chunks
            if c.request_id == r.request_id and c.num_decode_tokens == 1
        )


def test_abort_of_a_speculating_request_leaks_no_block(checkpoints, drafts):
    name = "llama3_rope"
    llm = spec_llm(checkpoints[name].path, drafts[name], 3)
    engine = llm.engine
    for i in range(3):
        engine.add_request(f"r{i}", {"prompt_token_ids": [7 + i] * (5 + 3 * i)}, SamplingParams(temperature=0, max_tokens=30))
    for _ in range(4):
        engine.step()
    assert engine.proposer.num_computed_tokens  # the draft holds blocks now
    engine.abort_request("r1")
    assert "r1" not in engine.proposer.num_computed_tokens
    check_both_pools(engine)
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.block_pool.num_used_blocks == 0 and engine.proposer.block_pool.num_used_blocks == 0


def test_pool_sizing_counts_both_models(checkpoints, drafts):
    from minilm_engine.model.attention.kv_cache import PagedKVCache

    name = "qwen2"
    target = LLM(checkpoints[name].path, max_model_len=MAX_MODEL_LEN, kv_cache_memory=1 << 20, block_size=4)
    spec = spec_llm(checkpoints[name].path, checkpoints["llama"].path, 2, kv_cache_memory=1 << 20)
    t_block = PagedKVCache.bytes_per_block(target.config, 4, torch.float32)
    d_block = PagedKVCache.bytes_per_block(spec.engine.proposer.model.config, 4, torch.float32)
    assert target.engine.block_pool.num_blocks == (1 << 20) // t_block
    assert spec.engine.block_pool.num_blocks == (1 << 20) // (t_block + d_block)
    assert spec.engine.proposer.block_pool.num_blocks == spec.engine.block_pool.num_blocks
    assert spec.engine.cache.num_bytes + spec.engine.proposer.cache.num_bytes <= 1 << 20


# ---------------------------------------------------------------------- bad inputs
def test_k_zero_or_none_means_no_speculation(checkpoints):
    for config in (None, {"model": "noodle-apprentice", "num_speculative_tokens": 0}):
        llm = LLM(checkpoints["llama"].path, max_model_len=MAX_MODEL_LEN, speculative_config=config)
        assert llm.engine.proposer is None and llm.engine.spec_decoding_stats is None


def test_bad_speculative_configs_fail_at_construction(checkpoints, tmp_path):
    target = checkpoints["llama"].path
    with pytest.raises(ValueError, match="num_speculative_tokens must be in"):
        LLM(target, speculative_config={"model": str(target), "num_speculative_tokens": -2})
    with pytest.raises(ValueError, match="continuous engine; strategy='kv_cache'"):
        BaselineLLM(target, strategy="kv_cache", speculative_config={"model": str(target), "num_speculative_tokens": 2})
    # The shipped apprentice has another vocabulary (1497 tokens) than these models (400).
    with pytest.raises(ValueError, match="the draft's vocabulary has 1497 tokens, the target's 400"):
        LLM(target, max_model_len=MAX_MODEL_LEN, speculative_config={"model": "noodle-apprentice", "num_speculative_tokens": 2})
    # Same vocabulary size, different tokenizer: the ids would mean other text.
    other_tokenizer = train_tokenizer(list(reversed(corpus_texts())), vocab_size=400)
    other = checkpoints["llama"]
    config = hf_config("llama", len(other_tokenizer), other_tokenizer.eos_token_id, hidden_size=32)
    folder = save_checkpoint(tmp_path / "other_tok", build_hf_model("llama", config), other_tokenizer)
    if other_tokenizer.get_vocab() != other.tokenizer.get_vocab():
        with pytest.raises(ValueError, match="the draft's tokenizer differs from the target's"):
            LLM(target, max_model_len=MAX_MODEL_LEN, speculative_config={"model": str(folder), "num_speculative_tokens": 2})


def test_a_draft_bigger_than_the_target_is_allowed_with_a_warning(checkpoints):
    small, big = checkpoints["llama"].path, checkpoints["qwen2"].path  # 2 x 32 hidden vs 2 x 64
    with pytest.warns(UserWarning, match=r"the draft model \(.* parameters\) is bigger than the target"):
        llm = spec_llm(small, big, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec_llm(big, small, 2)
    assert llm.generate("Hello", SamplingParams(temperature=0, max_tokens=5), use_tqdm=False)[0].outputs[0].token_ids


# ---------------------------------------------------------------------- n-gram drafting
def test_ngram_drafting_is_exact_greedy_and_sampled(checkpoints, alone):
    """Prompt lookup: no draft model; drafts copied from the request's own tokens."""
    name = "qwen3"
    ngram = {"method": "ngram", "num_speculative_tokens": 3}
    prompts = [{"prompt_token_ids": [7, 8, 9, 10, 11] * 4}, {"prompt_token_ids": list(range(20, 32)) * 2}, "Hello"]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    llm = LLM(checkpoints[name].path, max_model_len=MAX_MODEL_LEN, block_size=4, speculative_config=ngram)
    outputs = llm.generate(prompts, greedy, use_tqdm=False)
    for prompt, out in zip(prompts, outputs):
        assert out.outputs[0].token_ids == alone(name, prompt, greedy)
    assert llm.engine.spec_decoding_stats.num_draft_tokens > 0 and llm.engine.block_pool.num_used_blocks == 0
    # Sampling with certain drafts (one-hot q, the rule's exactness for it is checked in
    # test_rejection_sampler.py): seeded runs repeat, and no block is left behind.
    sampled = SamplingParams(temperature=0.8, max_tokens=24, ignore_eos=True, seed=3)
    first = llm.generate(prompts, sampled, use_tqdm=False)
    again = llm.generate(prompts, sampled, use_tqdm=False)
    assert [o.outputs[0].token_ids for o in first] == [o.outputs[0].token_ids for o in again]
    assert llm.engine.block_pool.num_used_blocks == 0
