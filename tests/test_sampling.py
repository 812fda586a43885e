"""Tests for minilm_engine.core.sampling_params and minilm_engine.worker.sampler.

SamplingParams is a boundary: bad values must fail at construction with a message that says
what is allowed.  The sampler is checked by properties (Hypothesis draws the logits): top-k
draws only among the k best, top-p only inside the nucleus (computed here independently),
temperature 0 is the argmax; and, through `LLM.generate`, a seed fixes a request's output
whatever else runs beside it.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minilm_engine import SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.worker.sampler import apply_top_k_top_p, sample
from minilm_engine.course.baselines import STRATEGIES


# ---------------------------------------------------------------------- SamplingParams
def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.temperature, p.top_p, p.top_k, p.max_tokens) == (1.0, 1.0, 0, 16)
    assert p.seed is None and p.stop_strings == [] and p.stop_token_ids == []
    assert not p.ignore_eos and not p.greedy
    assert SamplingParams(temperature=0).greedy


def test_normalised_spellings():
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's older "disabled"
    assert SamplingParams(stop="###").stop_strings == ["###"]
    assert SamplingParams(stop=("a", "b")).stop_strings == ["a", "b"]
    assert SamplingParams(stop_token_ids=(3, 4)).stop_token_ids == [3, 4]
    assert SamplingParams(max_tokens=None).max_tokens is None
    assert SamplingParams(temperature=1).temperature == 1  # ints are numbers too


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=-0.5), r"temperature must be >= 0 \(0 = greedy\), got -0.5"),
        (dict(temperature=float("nan")), "temperature must be >= 0"),
        (dict(top_p=0), r"top_p must be in \(0, 1\], got 0"),
        (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (dict(top_p=1.5), r"top_p must be in \(0, 1\], got 1.5"),
        (dict(top_p=-0.1), r"top_p must be in \(0, 1\]"),
        (dict(top_p=float("nan")), r"top_p must be in \(0, 1\]"),
        (dict(top_k=-2), r"top_k must be 0 or -1 \(disabled\) or a positive int, got -2"),
        (dict(max_tokens=0), r"max_tokens must be >= 1 or None, got 0"),
        (dict(max_tokens=-3), "max_tokens must be >= 1"),
        (dict(stop=""), "stop strings must not be empty"),
        (dict(stop=["ok", ""]), "stop strings must not be empty"),
    ],
)
def test_bad_values_raise_value_error(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingParams(**kwargs)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(temperature=True), "temperature must be a number, got True"),
        (dict(temperature="0.7"), "temperature must be a number, got '0.7'"),
        (dict(top_p=False), "top_p must be a number"),
        (dict(top_p=None), "top_p must be a number"),
        (dict(top_k=True), "top_k must be an int, got True"),
        (dict(top_k=2.0), "top_k must be an int, got 2.0"),
        (dict(max_tokens=True), "max_tokens must be an int"),
        (dict(max_tokens=10.0), "max_tokens must be an int"),
        (dict(seed=False), "seed must be an int"),
        (dict(seed="42"), "seed must be an int"),
        (dict(stop=5), "stop must be a string or a list of strings, got 5"),
        (dict(stop=["ok", 5]), "stop must be a string or a list of strings"),
        (dict(stop=b"bytes"), "stop must be a string or a list of strings"),
        (dict(stop_token_ids=5), "stop_token_ids must be a list of non-negative ints"),
        (dict(stop_token_ids=[True]), "stop_token_ids must be a list of non-negative ints"),
        (dict(stop_token_ids=[-1]), "stop_token_ids must be a list of non-negative ints"),
        (dict(ignore_eos=1), "ignore_eos must be a bool, got 1"),
    ],
)
def test_wrong_types_raise_type_error(kwargs, match):
    with pytest.raises(TypeError, match=match):
        SamplingParams(**kwargs)


# ---------------------------------------------------------------------- sampler properties
def logits_lists(min_size: int = 2, max_size: int = 40):
    # Bounded, finite logits; duplicates allowed (ties are the interesting edge case).
    values = st.floats(-8, 8, allow_nan=False, allow_infinity=False, width=32)
    return st.lists(values, min_size=min_size, max_size=max_size)


NUM_DRAWS = 64  # samples per Hypothesis example, drawn as one batch of identical rows


def draw_many(logits: torch.Tensor, params: SamplingParams, seed: int) -> list[int]:
    """NUM_DRAWS samples of one row of logits, each row with its own seeded generator."""
    batch = logits.expand(NUM_DRAWS, -1).clone()
    gens = [torch.Generator().manual_seed(seed + i) for i in range(NUM_DRAWS)]
    return sample(batch, [params] * NUM_DRAWS, gens).tolist()


temperatures = st.sampled_from([0.3, 0.7, 1.0, 1.5])


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=logits_lists(), data=st.data(), temperature=temperatures)
def test_top_k_samples_among_the_k_best(values, data, temperature):
    logits = torch.tensor(values)
    k = data.draw(st.integers(1, len(values)), label="k")
    tokens = draw_many(logits, SamplingParams(temperature=temperature, top_k=k), seed=k)
    kth_best = sorted(values, reverse=True)[k - 1]
    # A token tied with the k-th best is as good as it: ties may all be kept.
    assert all(values[t] >= kth_best for t in tokens)


def probabilities(values: list[float], temperature: float) -> list[float]:
    """softmax(values / temperature) in float64."""
    scaled = [v / temperature for v in values]
    weights = [math.exp(v - max(scaled)) for v in scaled]
    return [w / sum(weights) for w in weights]


def nucleus(values: list[float], temperature: float, top_p: float) -> set[int]:
    """The smallest set of most likely tokens whose probability mass reaches top_p.

    Computed in float64, and generous by 1e-6 at the boundary, where float32 rounding in the
    sampler may legitimately include one more token.  Tokens tied with the last member are in
    (which of a group of equal tokens gets in is a matter of sort order).
    """
    probs = probabilities(values, temperature)
    mass, threshold = 0.0, None
    for p in sorted(probs, reverse=True):
        if mass >= top_p + 1e-6:
            break
        threshold, mass = p, mass + p
    return {i for i, p in enumerate(probs) if p >= threshold * (1 - 1e-6)}


def nucleus_size_at_least(values: list[float], top_p: float) -> int:
    """How many tokens the nucleus must hold at least: the prefix that stays below top_p by
    more than float noise, plus the one that crosses it."""
    probs = sorted(probabilities(values, 1.0), reverse=True)
    mass, size = 0.0, 0
    for p in probs:
        if mass >= top_p - 1e-6:
            break
        size, mass = size + 1, mass + p
    return max(size, 1)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(
    values=logits_lists(),
    top_p=st.floats(0.01, 1.0, exclude_min=False),
    temperature=temperatures,
)
def test_top_p_samples_inside_the_nucleus(values, top_p, temperature):
    params = SamplingParams(temperature=temperature, top_p=top_p)
    tokens = draw_many(torch.tensor(values), params, seed=0)
    allowed = nucleus(values, temperature, top_p)
    assert set(tokens) <= allowed


@settings(max_examples=100, deadline=None, derandomize=True)
@given(values=logits_lists(), data=st.data(), top_p=st.floats(0.01, 1.0))
def test_kept_sets_are_exactly_top_k_and_the_nucleus(values, data, top_p):
    # Not only "samples inside": the kept set is the smallest one, not a smaller or larger one.
    logits = torch.tensor(values)
    k = data.draw(st.integers(1, len(values)), label="k")
    kept_k = torch.isfinite(apply_top_k_top_p(logits, k, 1.0)).nonzero().flatten().tolist()
    kth_best = sorted(values, reverse=True)[k - 1]
    assert set(kept_k) == {i for i, v in enumerate(values) if v >= kth_best}
    kept_p = set(torch.isfinite(apply_top_k_top_p(logits, 0, top_p)).nonzero().flatten().tolist())
    assert kept_p <= nucleus(values, 1.0, top_p)
    assert len(kept_p) >= nucleus_size_at_least(values, top_p)
    # and the kept tokens are the most likely ones: nothing dropped beats anything kept
    dropped = set(range(len(values))) - kept_p
    assert all(values[d] <= values[k] for d in dropped for k in kept_p)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(values=logits_lists(), data=st.data(), top_p=st.floats(0.05, 1.0))
def test_top_k_then_top_p(values, data, top_p):
    # vLLM's order: top-k first, then the nucleus of what is left (renormalised).
    k = data.draw(st.integers(1, len(values)), label="k")
    tokens = draw_many(torch.tensor(values), SamplingParams(top_k=k, top_p=top_p), seed=1)
    kth_best = sorted(values, reverse=True)[k - 1]
    kept = [v if v >= kth_best else -math.inf for v in values]
    finite = [i for i, v in enumerate(kept) if v > -math.inf]
    allowed = {finite[i] for i in nucleus([kept[i] for i in finite], 1.0, top_p)}
    assert set(tokens) <= allowed


@settings(max_examples=60, deadline=None, derandomize=True)
@given(values=logits_lists(min_size=1))
def test_filtered_set_is_never_empty(values):
    logits = torch.tensor(values)
    for top_k, top_p in [(1, 1.0), (0, 1e-9), (len(values), 0.5), (1, 1e-9)]:
        kept = apply_top_k_top_p(logits, top_k, top_p)
        assert torch.isfinite(kept).any()
        assert kept.max() == logits.max()  # the best token always survives


@settings(max_examples=40, deadline=None, derandomize=True)
@given(values=logits_lists(), top_k=st.integers(0, 5), top_p=st.floats(0.1, 1.0))
def test_greedy_is_argmax(values, top_k, top_p):
    logits = torch.tensor(values)
    params = SamplingParams(temperature=0, top_k=top_k, top_p=top_p, seed=3)
    (token,) = sample(logits[None], [params], [None]).tolist()
    assert values[token] == max(values)
    assert token == int(logits.argmax())


def test_greedy_and_sampling_rows_in_one_batch():
    logits = torch.tensor([[0.0, 5.0, 1.0], [0.0, 5.0, 1.0], [2.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=0), SamplingParams(top_k=1), SamplingParams(temperature=0)]
    gens = [None, torch.Generator().manual_seed(0), None]
    assert sample(logits, params, gens).tolist() == [1, 1, 0]


def test_sampling_follows_the_softmax():
    # 4000 draws at temperature 0.5 land within a few standard errors of softmax(logits / 0.5).
    logits = torch.tensor([1.0, 0.5, 0.0, -1.0, -3.0])
    n = 4000
    gens = [torch.Generator().manual_seed(i) for i in range(n)]
    tokens = sample(logits.expand(n, -1).clone(), [SamplingParams(temperature=0.5)] * n, gens)
    freq = torch.bincount(tokens, minlength=5).double() / n
    expected = torch.softmax(logits.double() / 0.5, dim=0)
    assert (freq - expected).abs().max() < 4 * math.sqrt(0.25 / n)


def test_sampler_uses_the_row_generator():
    logits = torch.zeros(1, 50)
    params = [SamplingParams(seed=7)]
    a = [sample(logits, params, [torch.Generator().manual_seed(7)]).item() for _ in range(3)]
    b = [sample(logits, params, [torch.Generator().manual_seed(7)]).item() for _ in range(3)]
    assert a == b
    gen = torch.Generator().manual_seed(7)
    c = [sample(logits, params, [gen]).item() for _ in range(20)]
    assert len(set(c)) > 1  # one generator advances: successive draws differ


def test_an_all_greedy_batch_off_the_cpu_samples_nothing():
    # Off the CPU one pass takes every sampling row; a batch with none took range(0, 0, 0) and
    # failed every greedy step on a GPU (found on an H200).  "meta" stands in for the GPU: a
    # device that is not the CPU, where argmax runs and nothing is computed.
    logits = torch.empty(3, 50, device="meta")
    tokens = sample(logits, [SamplingParams(temperature=0)] * 3, [None] * 3)
    assert tokens.shape == (3,) and tokens.device.type == "meta"


# ---------------------------------------------------------------------- seeds through LLM
SAMPLED = dict(temperature=1.0, max_tokens=16, ignore_eos=True)


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def test_same_seed_same_output(checkpoints, prompts):
    path = checkpoints["llama"].path
    params = SamplingParams(seed=1234, **SAMPLED)
    llm = BaselineLLM(path, strategy="kv_cache")
    first = token_ids(llm.generate(prompts[:2], params, use_tqdm=False))
    again = token_ids(llm.generate(prompts[:2], params, use_tqdm=False))
    fresh = token_ids(BaselineLLM(path, strategy="kv_cache").generate(prompts[:2], params, use_tqdm=False))
    assert first == again == fresh
    # Both prompts share the seed but not the context, so they still differ.
    assert first[0] != first[1]


def test_different_seeds_differ(checkpoints, prompts):
    llm = BaselineLLM(checkpoints["llama"].path, strategy="kv_cache")
    outs = [
        token_ids(llm.generate(prompts[0], SamplingParams(seed=s, **SAMPLED), use_tqdm=False))[0]
        for s in range(4)
    ]
    assert len({tuple(o) for o in outs}) == 4
    greedy_params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    greedy = token_ids(llm.generate(prompts[0], greedy_params, use_tqdm=False))[0]
    assert all(o != greedy for o in outs)  # temperature 1 really samples


def test_llm_seed_makes_unseeded_requests_reproducible(checkpoints, prompts):
    path = checkpoints["qwen3"].path
    params = SamplingParams(**SAMPLED)  # no per-request seed
    run = lambda seed: token_ids(  # noqa: E731
        BaselineLLM(path, strategy="kv_cache", seed=seed).generate(prompts[:3], params, use_tqdm=False)
    )
    assert run(0) == run(0)
    assert run(0) != run(1)


@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
def test_sampled_output_does_not_depend_on_the_batch(checkpoints, prompts, strategy):
    # Each request draws from its own seeded generator: alone, or among four others, in a
    # batch of 5 or of 2, it produces the same tokens (and the same as kv_cache alone).
    path = checkpoints["qwen2"].path
    params = [SamplingParams(seed=100 + i, top_k=50, top_p=0.95, **SAMPLED) for i in range(5)]
    alone = BaselineLLM(path, strategy="kv_cache")
    expected = [
        token_ids(alone.generate(p, sp, use_tqdm=False))[0] for p, sp in zip(prompts, params)
    ]
    for max_num_seqs in (5, 2):
        llm = BaselineLLM(path, strategy=strategy, max_num_seqs=max_num_seqs)
        assert token_ids(llm.generate(prompts, params, use_tqdm=False)) == expected
    # The same request next to different neighbours.
    llm = BaselineLLM(path, strategy=strategy)
    mixed = [params[3], SamplingParams(temperature=0, max_tokens=4), params[0]]
    got = token_ids(llm.generate([prompts[3], prompts[1], prompts[0]], mixed, use_tqdm=False))
    assert got[0] == expected[3] and got[2] == expected[0]


# ---------------------------------------------------------------------- batched == one at a time
row_params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.3, 0.7, 1.0, 1.5]),
    top_k=st.sampled_from([0, 1, 2, 5, 17]),
    top_p=st.sampled_from([1.0, 0.95, 0.5, 0.1]),
    min_p=st.sampled_from([0.0, 0.05, 0.3]),
)


@settings(max_examples=40, deadline=None)
@given(params=st.lists(row_params, min_size=1, max_size=9), seed=st.integers(0, 2**31), ties=st.booleans())
def test_batched_sample_is_the_one_at_a_time_draw(params, seed, ties):
    """`sample` draws the whole batch at once; every row still gets exactly the token the
    readable per-row reference (torch.multinomial with that row's generator) gives it, for any
    mix of greedy, temperature, min-p, top-k and top-p rows, and with the generators advanced
    the same way.  `ties`: logits rounded through bf16, as a bf16 model's are (many equal)."""
    from minilm_engine.worker.sampler import sample_one_at_a_time

    logits = torch.randn(len(params), 300, generator=torch.Generator().manual_seed(seed)) * 3
    if ties:
        logits = logits.bfloat16().float()
    for _ in range(2):  # a second step: the generators must have advanced alike
        gens_a = [torch.Generator().manual_seed(seed + i) for i in range(len(params))]
        gens_b = [torch.Generator().manual_seed(seed + i) for i in range(len(params))]
        expected = sample_one_at_a_time(logits, params, gens_a).tolist()
        assert sample(logits, params, gens_b).tolist() == expected
        assert [g.initial_seed() for g in gens_a] == [g.initial_seed() for g in gens_b]
        assert all(torch.equal(a.get_state(), b.get_state()) for a, b in zip(gens_a, gens_b))


def test_batched_sampling_probs_are_the_per_row_ones():
    from minilm_engine.worker.sampler import batched_sampling_probs, sampling_probs

    torch.manual_seed(0)
    logits = (torch.randn(6, 1000) * 4).bfloat16().float()
    params = [SamplingParams(temperature=0.8), SamplingParams(top_k=40), SamplingParams(top_p=0.9, min_p=0.05),
              SamplingParams(temperature=1.3, top_k=3, top_p=0.5), SamplingParams(min_p=0.2), SamplingParams(top_k=1000)]
    batched = batched_sampling_probs(logits, params)
    for row, p in enumerate(params):
        assert torch.equal(batched[row], sampling_probs(logits[row], p))


def test_batched_sample_refuses_an_invalid_distribution():
    logits = torch.full((2, 5), float("-inf"))
    with pytest.raises(RuntimeError, match="invalid"):
        sample(logits, [SamplingParams(temperature=1.0)] * 2, [None, None])
