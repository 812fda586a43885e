"""vLLM's sampling features offline, each against a reference that is not ours.

Logprobs equal transformers' log-softmax of the same tokens (prompt and output, chunked prefill
too); each logits processor equals transformers' own (RepetitionPenaltyLogitsProcessor,
MinPLogitsWarper, MinNewTokensLengthLogitsProcessor, SequenceBiasLogitsProcessor) or OpenAI's
formula (presence / frequency penalties); greedy decoding with a repetition penalty equals
`transformers.generate`; n samples are n independent requests (exactly, seed by seed, and in
distribution: a chi-square test over first tokens that a wrong rule fails); the prompt's KV is
shared through the prefix cache; no block is left allocated.
"""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import (
    AutoModelForCausalLM,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
)

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.entrypoints.chat_template import chat_format_for, render_chat
from minilm_engine.worker.sampler import apply_min_p, apply_penalties, process_logits
from minilm_engine.core.request import Request

PROMPT = "The Golden Bowl is open every day from eleven until late, and the miso ramen"
NUM_TOKENS = 12


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text, add_special_tokens=True)


def hf_log_softmax(hf_model, ids: list[int]) -> torch.Tensor:
    """(len(ids), V) float32 log-softmax of transformers' logits over `ids`."""
    with torch.no_grad():
        logits = hf_model(torch.tensor([ids])).logits[0].float()
    return torch.log_softmax(logits, dim=-1)


def assert_no_blocks_in_use(llm: LLM) -> None:
    assert llm.engine.block_pool.num_used_blocks == 0
    assert not llm.engine.has_unfinished_requests()


# ---------------------------------------------------------------------- logprobs
@pytest.mark.parametrize("budget", [512, 8])  # 8: the prompt is computed in chunks
def test_prompt_and_output_logprobs_are_transformers_log_softmax(checkpoints, budget):
    ckpt = checkpoints["qwen2"]
    llm = LLM(ckpt.path, max_num_batched_tokens=budget)
    k = 3
    params = SamplingParams(temperature=0, max_tokens=NUM_TOKENS, logprobs=k, prompt_logprobs=k, ignore_eos=True)
    (out,) = llm.generate(PROMPT, params, use_tqdm=False)
    prompt, completion = out.prompt_token_ids, out.outputs[0]
    ref = hf_log_softmax(ckpt.hf_model, prompt + completion.token_ids)  # row i scores token i + 1

    assert out.prompt_logprobs[0] is None and len(out.prompt_logprobs) == len(prompt)
    positions = [(p, prompt[p], out.prompt_logprobs[p]) for p in range(1, len(prompt))]
    positions += [(len(prompt) + t, tok, completion.logprobs[t]) for t, tok in enumerate(completion.token_ids)]
    for position, token, row in positions:
        want = ref[position - 1]
        top = torch.topk(want, k)
        # the chosen token first, with its rank; then the top k, best first
        assert next(iter(row)) == token
        assert row[token].rank == int((want >= want[token]).sum())
        assert set(row) == {token, *top.indices.tolist()}
        for token_id, lp in row.items():
            torch.testing.assert_close(lp.logprob, want[token_id].item(), atol=1e-4, rtol=1e-4)
            assert lp.decoded_token == ckpt.tokenizer.decode([token_id])
    assert completion.cumulative_logprob == pytest.approx(sum(completion.logprobs[t][tok].logprob
                                                              for t, tok in enumerate(completion.token_ids)))
    assert_no_blocks_in_use(llm)


def test_logprobs_are_the_raw_models_even_with_penalties_and_temperature(checkpoints):
    # vLLM V1's default ("raw_logprobs"): what the model said, before any processing.
    ckpt = checkpoints["llama"]
    llm = LLM(ckpt.path)
    params = SamplingParams(temperature=1.7, repetition_penalty=1.5, presence_penalty=1.0, seed=3,
                            max_tokens=8, logprobs=0, ignore_eos=True, logit_bias={5: 20.0})
    (out,) = llm.generate(PROMPT, params, use_tqdm=False)
    ids, completion = out.prompt_token_ids, out.outputs[0]
    ref = hf_log_softmax(ckpt.hf_model, ids + completion.token_ids)
    for t, token in enumerate(completion.token_ids):
        (only,) = completion.logprobs[t].items()  # logprobs=0: the sampled token alone
        assert only[0] == token
        torch.testing.assert_close(only[1].logprob, ref[len(ids) + t - 1, token].item(), atol=1e-4, rtol=1e-4)
    # and without logprobs asked, none are reported (vLLM: cumulative_logprob None too)
    (plain,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert plain.outputs[0].logprobs is None and plain.outputs[0].cumulative_logprob is None
    assert plain.prompt_logprobs is None


def test_prompt_logprobs_are_complete_after_a_prefix_cache_hit(checkpoints):
    # A request that asks for prompt logprobs computes every prompt position (vLLM skips the
    # prefix cache for it), so a repeated prompt gets the same full list.
    llm = LLM(checkpoints["qwen2"].path, block_size=4)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    (first,) = llm.generate(PROMPT, params, use_tqdm=False)
    (again,) = llm.generate(PROMPT, params, use_tqdm=False)
    (plain,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)
    assert again.num_cached_tokens == 0 and plain.num_cached_tokens > 0
    assert again.prompt_logprobs == first.prompt_logprobs
    assert_no_blocks_in_use(llm)


# ---------------------------------------------------------------------- logits processors
vocab = 50
logit_rows = st.lists(st.floats(-6, 6, allow_nan=False, width=32), min_size=vocab, max_size=vocab)
token_lists = st.lists(st.integers(0, vocab - 1), min_size=0, max_size=12)
prompt_lists = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=12)


def fake_request(prompt: list[int], output: list[int], params: SamplingParams, eos: tuple[int, ...] = (0,)) -> Request:
    request = Request("r", None, prompt, params, eos, max_model_len=1000)
    for token in output:
        request.output_token_ids.append(token)
    return request


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=logit_rows, prompt=prompt_lists, output=token_lists, penalty=st.floats(0.2, 3.0))
def test_repetition_penalty_is_transformers(values, prompt, output, penalty):
    logits = torch.tensor(values)
    params = SamplingParams(repetition_penalty=penalty)
    ours = apply_penalties(logits, prompt, output, params)
    # transformers penalises every token of input_ids: the prompt and what was generated
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([prompt + output]), logits[None].clone())[0]
    torch.testing.assert_close(ours, theirs)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=logit_rows, output=token_lists, presence=st.floats(-2, 2), frequency=st.floats(-2, 2))
def test_presence_and_frequency_penalties_are_openais(values, output, presence, frequency):
    # OpenAI: mu[j] - c[j] * alpha_frequency - (c[j] > 0) * alpha_presence, over sampled tokens.
    params = SamplingParams(presence_penalty=presence, frequency_penalty=frequency)
    ours = apply_penalties(torch.tensor(values), [1, 2, 3], output, params)
    counts = Counter(output)
    want = [v - counts[j] * frequency - (counts[j] > 0) * presence for j, v in enumerate(values)]
    torch.testing.assert_close(ours, torch.tensor(want), atol=1e-5, rtol=1e-5)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=logit_rows, min_p=st.floats(0.0, 1.0), temperature=st.sampled_from([0.5, 1.0, 2.0]))
def test_min_p_is_transformers(values, min_p, temperature):
    scaled = torch.tensor(values) / temperature
    ours = apply_min_p(scaled, min_p)
    theirs = MinPLogitsWarper(min_p)(None, scaled[None].clone())[0]
    assert torch.equal(torch.isinf(ours), torch.isinf(theirs))
    torch.testing.assert_close(ours[torch.isfinite(ours)], scaled[torch.isfinite(ours)])


@settings(max_examples=40, deadline=None, derandomize=True)
@given(values=logit_rows, num_output=st.integers(0, 6), min_tokens=st.integers(0, 6))
def test_min_tokens_is_transformers_min_new_tokens(values, num_output, min_tokens):
    prompt, eos = [3, 4, 5], 7
    params = SamplingParams(min_tokens=min_tokens, stop_token_ids=[9], max_tokens=10)
    request = fake_request(prompt, [11] * num_output, params, eos=(eos,))
    ours = process_logits(torch.tensor(values), request)
    input_ids = torch.tensor([prompt + [11] * num_output])
    theirs = MinNewTokensLengthLogitsProcessor(len(prompt), min_tokens, [eos, 9])(input_ids, torch.tensor([values]))[0]
    assert torch.equal(ours, theirs)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(values=logit_rows, bias=st.dictionaries(st.integers(0, vocab - 1), st.floats(-100, 100), min_size=1, max_size=5))
def test_logit_bias_is_transformers_sequence_bias(values, bias):
    request = fake_request([1, 2], [], SamplingParams(logit_bias=bias))
    ours = process_logits(torch.tensor(values), request)
    theirs = SequenceBiasLogitsProcessor({(t,): b for t, b in bias.items()})(torch.tensor([[1, 2]]),
                                                                             torch.tensor([values]))[0]
    torch.testing.assert_close(ours, theirs)


def test_greedy_with_repetition_penalty_equals_transformers_generate(checkpoints):
    ckpt = checkpoints["qwen2"]
    ids = encode(ckpt.tokenizer, PROMPT)
    with torch.no_grad():
        hf = ckpt.hf_model.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                                    repetition_penalty=1.8, pad_token_id=ckpt.eos_token_id)[0, len(ids):].tolist()
    plain_hf = ckpt.hf_model.generate(torch.tensor([ids]), max_new_tokens=NUM_TOKENS, do_sample=False,
                                      pad_token_id=ckpt.eos_token_id)[0, len(ids):].tolist()
    assert hf != plain_hf  # the penalty changes this answer, so the comparison means something
    hf = hf[: hf.index(ckpt.eos_token_id) + 1] if ckpt.eos_token_id in hf else hf
    llm = LLM(ckpt.path)
    (out,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, repetition_penalty=1.8),
                          use_tqdm=False)
    assert out.outputs[0].token_ids == hf


def test_min_tokens_masks_eos_until_enough_tokens(checkpoints):
    ckpt = checkpoints["llama"]
    llm = LLM(ckpt.path)
    eos = ckpt.eos_token_id
    # A bias of +100 makes EOS the argmax at once; min_tokens holds it back for 4 tokens.
    params = SamplingParams(temperature=0, max_tokens=10, logit_bias={eos: 100.0}, min_tokens=4)
    (out,) = llm.generate(PROMPT, params, use_tqdm=False)
    completion = out.outputs[0]
    assert len(completion.token_ids) == 5 and completion.token_ids[-1] == eos
    assert eos not in completion.token_ids[:4]
    assert completion.finish_reason == "stop" and completion.stop_reason is None  # vLLM: EOS -> None
    (early,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=10, logit_bias={eos: 100.0}),
                            use_tqdm=False)
    assert early.outputs[0].token_ids == [eos]


def test_stop_reason_and_include_stop_str_in_output(checkpoints):
    llm = LLM(checkpoints["qwen2"].path)
    (plain,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, ignore_eos=True),
                            use_tqdm=False)
    tokens, text = plain.outputs[0].token_ids, plain.outputs[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    (cut,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, stop=stop, ignore_eos=True),
                          use_tqdm=False)
    (kept,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, stop=stop, ignore_eos=True,
                                                  include_stop_str_in_output=True), use_tqdm=False)
    at = text.find(stop)
    assert cut.outputs[0].text == text[:at] and kept.outputs[0].text == text[: at + len(stop)]
    assert cut.outputs[0].stop_reason == kept.outputs[0].stop_reason == stop
    (by_id,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS, stop_token_ids=[tokens[3]],
                                                   ignore_eos=True), use_tqdm=False)
    assert by_id.outputs[0].stop_reason == tokens[3]
    assert by_id.outputs[0].token_ids == tokens[: tokens.index(tokens[3]) + 1]


# ---------------------------------------------------------------------- n samples
def test_n_samples_are_the_seeded_independent_requests_and_share_the_prompt(checkpoints):
    llm = LLM(checkpoints["llama"].path, block_size=4)
    params = SamplingParams(n=4, seed=11, temperature=1.5, max_tokens=6, ignore_eos=True, logprobs=1)
    (together,) = llm.generate(PROMPT, params, use_tqdm=False)
    assert [c.index for c in together.outputs] == [0, 1, 2, 3]
    num_prompt = len(together.prompt_token_ids)
    # Samples 1..3 read sample 0's full prompt blocks from the prefix cache.
    assert together.num_cached_tokens == 3 * ((num_prompt - 1) // 4 * 4)
    for i, completion in enumerate(together.outputs):
        # sample i is the request with seed 11 + i (vLLM's rule), token for token
        alone = SamplingParams(seed=11 + i, temperature=1.5, max_tokens=6, ignore_eos=True, logprobs=1)
        (want,) = llm.generate(PROMPT, alone, use_tqdm=False)
        assert completion.token_ids == want.outputs[0].token_ids
        assert completion.cumulative_logprob == pytest.approx(want.outputs[0].cumulative_logprob, abs=1e-4)
    assert len({tuple(c.token_ids) for c in together.outputs}) > 1
    assert_no_blocks_in_use(llm)


def chi_square_p_value(observed: Counter, probs: torch.Tensor, num_samples: int) -> float:
    """Pearson's chi-square test of observed counts against `probs`; rare tokens pooled."""
    order = torch.argsort(probs, descending=True).tolist()
    bins, rest, rest_count = [], 0.0, 0
    for token in order:
        expected = probs[token].item() * num_samples
        if expected >= 5:
            bins.append((observed[token], expected))
        else:
            rest += expected
            rest_count += observed[token]
    if rest > 0:
        bins.append((rest_count, rest))
    statistic = sum((o - e) ** 2 / e for o, e in bins)
    dof = len(bins) - 1
    from scipy.stats import chi2

    return float(chi2.sf(statistic, dof))


def test_n_samples_are_distributed_as_the_models_first_token():
    # The shipped chef at temperature 1.3 spreads its first token over several dishes.
    llm = LLM("noodle-chef", max_n=400)
    prompt, temperature, n = "Ana: I would like one bowl of", 1.3, 300
    (out,) = llm.generate(prompt, SamplingParams(n=n, temperature=temperature, max_tokens=1, seed=5),
                          use_tqdm=False)
    first = Counter(c.token_ids[0] for c in out.outputs)
    # The reference distribution: transformers' logits for the prompt, at that temperature.
    hf_model = AutoModelForCausalLM.from_pretrained(llm.model_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf_model(torch.tensor([out.prompt_token_ids])).logits[0, -1].float()
    probs = torch.softmax(logits / temperature, dim=-1)
    assert len(first) >= 3  # really spread: a test of distribution, not of one token
    assert chi_square_p_value(first, probs, n) > 1e-3
    # ... and the test has the power to tell: the same draws do not pass as temperature 1.
    assert chi_square_p_value(first, torch.softmax(logits, dim=-1), n) < 1e-3
    # A wrong rule fails this test: n copies of one sample, or the greedy token every time.
    same = Counter({out.outputs[0].token_ids[0]: n})
    assert chi_square_p_value(same, probs, n) < 1e-6
    assert_no_blocks_in_use(llm)


# ---------------------------------------------------------------------- request shapes
def test_chat_uses_the_servers_template_and_prompt_dicts(checkpoints):
    llm = LLM("noodle-chef")
    messages = [{"role": "user", "content": "One bowl of Miso Ramen, please."}]
    params = SamplingParams(temperature=0, max_tokens=20)
    (chat,) = llm.chat(messages, params, use_tqdm=False)
    fmt = chat_format_for(llm.tokenizer, llm.model_path)
    prompt = render_chat(llm.tokenizer, fmt, messages)
    (want,) = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=20, stop=list(fmt.default_stop)),
                           use_tqdm=False)
    assert chat.outputs[0].text == want.outputs[0].text and chat.prompt == prompt
    (as_dict,) = llm.generate({"prompt": prompt}, SamplingParams(temperature=0, max_tokens=20, stop="\n"),
                              use_tqdm=False)
    assert as_dict.outputs[0].token_ids == want.outputs[0].token_ids
    two = llm.chat([messages, messages], params, use_tqdm=False)
    assert [o.outputs[0].text for o in two] == [chat.outputs[0].text] * 2


def test_defaults_come_from_generation_config(checkpoints, tmp_path):
    folder = Path(shutil.copytree(checkpoints["qwen2"].path, tmp_path / "ckpt"))
    config = json.loads((folder / "generation_config.json").read_text())
    config.update(temperature=0.0, repetition_penalty=1.8, top_k=7, max_new_tokens=NUM_TOKENS, do_sample=True)
    (folder / "generation_config.json").write_text(json.dumps(config))
    llm = LLM(folder)
    defaults = llm.get_default_sampling_params()
    assert (defaults.temperature, defaults.repetition_penalty, defaults.top_k, defaults.max_tokens) == (
        0.0, 1.8, 7, NUM_TOKENS)
    (by_default,) = llm.generate(PROMPT, use_tqdm=False)
    (explicit,) = llm.generate(PROMPT, SamplingParams(temperature=0, repetition_penalty=1.8, max_tokens=NUM_TOKENS),
                               use_tqdm=False)
    assert by_default.outputs[0].token_ids == explicit.outputs[0].token_ids
    (given_params,) = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=NUM_TOKENS), use_tqdm=False)
    assert given_params.outputs[0].token_ids != explicit.outputs[0].token_ids  # set params win, whole


# ---------------------------------------------------------------------- limits and combinations
@pytest.mark.parametrize("kwargs, error, match", [
    (dict(n=0), ValueError, "n must be >= 1, got 0"),
    (dict(n=1.5), TypeError, "n must be an int"),
    (dict(presence_penalty=2.5), ValueError, r"presence_penalty must be in \[-2, 2\], got 2.5"),
    (dict(frequency_penalty=-2.1), ValueError, r"frequency_penalty must be in \[-2, 2\]"),
    (dict(repetition_penalty=0), ValueError, r"repetition_penalty must be > 0 \(1 = off\), got 0"),
    (dict(repetition_penalty=float("nan")), ValueError, "repetition_penalty must be > 0"),
    (dict(min_p=1.01), ValueError, r"min_p must be in \[0, 1\]"),
    (dict(min_tokens=-1), ValueError, "min_tokens must be >= 0"),
    (dict(min_tokens=5, max_tokens=4), ValueError, r"min_tokens must be <= max_tokens \(4\), got 5"),
    (dict(logprobs=-1), ValueError, "logprobs must be None or >= 0"),
    (dict(prompt_logprobs=True), TypeError, "prompt_logprobs must be an int"),
    (dict(logit_bias={"5": 1.0}), TypeError, "logit_bias keys must be non-negative token ids"),
    (dict(logit_bias={5: 101}), ValueError, r"logit_bias values must be in \[-100, 100\]"),
    (dict(logit_bias=[1, 2]), TypeError, "logit_bias must be a dict"),
    (dict(include_stop_str_in_output=1), TypeError, "include_stop_str_in_output must be a bool"),
])
def test_bad_sampling_values_are_precise_errors(kwargs, error, match):
    with pytest.raises(error, match=match):
        SamplingParams(**kwargs)


def test_engine_limits_and_what_speculation_refuses(checkpoints):
    llm = LLM(checkpoints["qwen2"].path, max_logprobs=5, max_n=3)
    for params, match in [(SamplingParams(logprobs=6), r"logprobs must be <= 5 \(this engine's max_logprobs\)"),
                          (SamplingParams(prompt_logprobs=6), "prompt_logprobs must be <= 5"),
                          (SamplingParams(n=4), r"n must be <= 3 \(this engine's max_n\)"),
                          (SamplingParams(logit_bias={10**6: 1.0}), "logit_bias keys must be token ids in")]:
        with pytest.raises(ValueError, match=match):
            llm.generate(PROMPT, params, use_tqdm=False)
    assert_no_blocks_in_use(llm)
    spec = LLM(checkpoints["qwen2"].path, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    for name, value in [("logprobs", 1), ("prompt_logprobs", 0), ("repetition_penalty", 1.2), ("min_tokens", 2),
                        ("logit_bias", {3: 1.0}), ("presence_penalty", 0.5)]:
        with pytest.raises(ValueError, match=f"{name} is not supported with speculative decoding"):
            spec.generate(PROMPT, SamplingParams(**{name: value}), use_tqdm=False)
    # min_p and n are fine with speculation (min_p is part of both models' distribution)
    (out,) = spec.generate(PROMPT, SamplingParams(temperature=0, min_p=0.1, n=2, max_tokens=4), use_tqdm=False)
    assert len(out.outputs) == 2 and out.outputs[0].token_ids == out.outputs[1].token_ids


MIXED = [
    SamplingParams(temperature=0, max_tokens=8, repetition_penalty=1.7, logprobs=2),
    SamplingParams(temperature=0, max_tokens=8, logit_bias={7: 8.0, 9: -50.0}, min_tokens=8, ignore_eos=False),
    SamplingParams(temperature=0.9, seed=4, max_tokens=8, presence_penalty=1.2, frequency_penalty=0.7, min_p=0.05),
    SamplingParams(temperature=0, max_tokens=8, logprobs=0, prompt_logprobs=2),
]


@pytest.mark.parametrize("strategy", ["continuous", "kv_cache", "static_batch"])
def test_mixed_processors_in_one_batch_equal_each_request_alone(checkpoints, strategy):
    # Each row's processors read only its own history: batched with others == alone.
    ckpt = checkpoints["llama3_rope"]
    prompts = [PROMPT, "Order for table 7:", "Receipt\nMiso Ramen @ $", "A bowl of noodles, please."]
    params = MIXED if strategy == "continuous" else [
        p if p.prompt_logprobs is None else SamplingParams(temperature=0, max_tokens=8, logprobs=0) for p in MIXED]
    llm = BaselineLLM(ckpt.path, strategy=strategy)
    together = llm.generate(prompts, params, use_tqdm=False)
    alone_llm = LLM(ckpt.path)  # the continuous engine, one request at a time
    for prompt, p, got in zip(prompts, params, together):
        (want,) = alone_llm.generate(prompt, p, use_tqdm=False)
        assert got.outputs[0].token_ids == want.outputs[0].token_ids
        if p.logprobs is not None:
            for row, want_row in zip(got.outputs[0].logprobs, want.outputs[0].logprobs):
                assert row.keys() == want_row.keys()
                assert [lp.logprob for lp in row.values()] == pytest.approx(
                    [lp.logprob for lp in want_row.values()], abs=1e-4)
        if p.prompt_logprobs is not None:
            assert got.prompt_logprobs[1:] and got.prompt_logprobs[0] is None
    # the bias and min_tokens really act: token 9 (bias -50) never appears, and no EOS before 8 tokens
    assert 9 not in together[1].outputs[0].token_ids and len(together[1].outputs[0].token_ids) == 8


def test_baseline_strategies_refuse_prompt_logprobs(checkpoints):
    llm = BaselineLLM(checkpoints["llama"].path, strategy="kv_cache")
    with pytest.raises(ValueError, match="prompt_logprobs need the continuous engine"):
        llm.generate(PROMPT, SamplingParams(prompt_logprobs=1), use_tqdm=False)
