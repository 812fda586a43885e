"""Tests for minilm_engine.worker.spec_decode.rejection_sampler: the output is the target's distribution.

The statistical test runs many seeded verification rounds on a 5-token vocabulary with fixed
target and draft distributions and compares, position by position, how often each token comes
out with the target's probabilities (chi-square, scipy).  The same test with a deliberately
wrong rule swapped in (resample from p instead of max(p - q, 0); always accept) must fail: that
is what shows the test can tell.  Everything is seeded, so the p-values are the same every run.

The engine's batched form (`rejection_sample_batch`) is checked against the one-at-a-time rule:
the same tokens and the same generator states, for any mix of requests (Hypothesis), with one
read from the device for the whole batch.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from minilm_engine import SamplingParams
from minilm_engine.worker.sampler import sampling_probs
from minilm_engine.worker.spec_decode import rejection_sampler
from minilm_engine.worker.spec_decode.rejection_sampler import rejection_sample, rejection_sample_batch
from minilm_engine.core.outputs import DraftTokens

K = 3
# Target and draft disagree on purpose: the draft likes the tokens the target dislikes.
TARGET_LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.0, -1.0, 0.5],
        [0.0, 1.5, -0.5, 1.0, 0.2],
        [1.0, 1.0, 1.0, -2.0, 0.0],
        [-1.0, 0.0, 2.0, 0.3, 0.3],
    ]
)  # (K + 1, V)
DRAFT_LOGITS = torch.tensor(
    [
        [0.0, 1.0, 2.0, 0.5, -1.0],
        [1.0, 1.0, 0.0, 0.0, 0.0],
        [1.5, -1.0, 0.5, 1.0, 0.0],
    ]
)  # (K, V)
NUM_ROUNDS = 6000


def run_rounds(params: SamplingParams, seed: int = 0, num_rounds: int = NUM_ROUNDS) -> list[list[int]]:
    """Tokens emitted at each position 0..K over `num_rounds` seeded rounds."""
    generator = torch.Generator().manual_seed(seed)
    draft_probs = torch.stack([sampling_probs(row, params) for row in DRAFT_LOGITS])  # (K, V)
    emitted: list[list[int]] = [[] for _ in range(K + 1)]
    for _ in range(num_rounds):
        drafts = torch.multinomial(draft_probs, 1, generator=generator)[:, 0].tolist()
        tokens = rejection_sample(DraftTokens(drafts, draft_probs), TARGET_LOGITS, params, generator)
        assert 1 <= len(tokens) <= K + 1
        assert tokens[:-1] == drafts[: len(tokens) - 1]  # an accepted prefix, then one more
        for pos, token in enumerate(tokens):
            emitted[pos].append(token)
    return emitted


def min_p_value(emitted: list[list[int]], params: SamplingParams) -> float:
    """Smallest chi-square p-value over positions with enough samples (target alone = H0)."""
    p_values = []
    for pos, tokens in enumerate(emitted):
        if len(tokens) < 200:
            continue
        p = sampling_probs(TARGET_LOGITS[pos], params)
        support = (p > 0).nonzero().flatten().tolist()
        counts = torch.bincount(torch.tensor(tokens), minlength=len(p))
        if counts[p == 0].sum() > 0:
            return 0.0  # a token the target can never produce came out
        observed = counts[support].double()
        expected = p[support].double() * len(tokens)
        p_values.append(chisquare(observed.numpy(), expected.numpy() * observed.sum().item() / expected.sum().item()).pvalue)
    assert len(p_values) >= 3  # positions 0, 1, 2 at least are tested
    return min(p_values)


PARAMS = [
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=0.7, top_k=3),
    SamplingParams(temperature=1.3, top_p=0.8),
]


@pytest.mark.parametrize("params", PARAMS, ids=["plain", "top_k", "top_p"])
def test_output_distribution_is_the_targets(params):
    assert min_p_value(run_rounds(params), params) > 1e-3


@pytest.mark.parametrize(
    "wrong_rule",
    ["resample_from_target", "always_accept"],
)
def test_a_wrong_acceptance_rule_fails_the_test(monkeypatch, wrong_rule):
    """The chi-square test has teeth: two tempting mistakes give p-values near zero."""
    if wrong_rule == "resample_from_target":
        # After a rejection, draw from p itself: p's mass on the draft's favourites is then
        # counted twice (once through acceptance, once through the resample).
        monkeypatch.setattr(rejection_sampler, "recovered_distribution", lambda p, q: p)
    else:
        monkeypatch.setattr(rejection_sampler, "accept_probability", lambda p_draft, q_draft: 1.0)
    params = PARAMS[0]
    assert min_p_value(run_rounds(params), params) < 1e-6


def test_greedy_takes_the_target_argmax_and_stops_at_the_first_difference():
    logits = torch.full((4, 6), -5.0)
    for row, best in enumerate([2, 4, 1, 5]):
        logits[row, best] = 5.0
    greedy = SamplingParams(temperature=0)
    assert rejection_sample(DraftTokens([2, 4, 1]), logits, greedy, None) == [2, 4, 1, 5]  # bonus
    assert rejection_sample(DraftTokens([2, 3, 1]), logits, greedy, None) == [2, 4]  # corrected
    assert rejection_sample(DraftTokens([0, 4, 1]), logits, greedy, None) == [2]
    assert rejection_sample(DraftTokens([]), logits[:1], greedy, None) == [2]


def test_seeded_rounds_repeat_exactly():
    params = PARAMS[1]
    assert run_rounds(params, seed=5, num_rounds=300) == run_rounds(params, seed=5, num_rounds=300)
    assert run_rounds(params, seed=5, num_rounds=300) != run_rounds(params, seed=6, num_rounds=300)


def test_identical_distributions_accept_everything():
    """q == p: min(1, p/q) = 1, every draft is kept and the bonus token follows."""
    params = SamplingParams(temperature=1.0)
    probs = torch.stack([sampling_probs(row, params) for row in TARGET_LOGITS[:K]])
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        drafts = torch.multinomial(probs, 1, generator=gen)[:, 0].tolist()
        assert rejection_sample(DraftTokens(drafts, probs), TARGET_LOGITS, params, gen)[:K] == drafts


def test_bad_shapes_raise():
    params = SamplingParams(temperature=1.0)
    with pytest.raises(ValueError, match="2 drafts need 3 rows of target logits, got 4"):
        rejection_sample(DraftTokens([0, 1], torch.ones(2, 5) / 5), TARGET_LOGITS, params, None)
    with pytest.raises(ValueError, match="need the draft's probabilities"):
        rejection_sample(DraftTokens([0, 1, 2]), TARGET_LOGITS, params, None)


def test_a_certain_draft_keeps_the_distribution():
    """n-gram drafting proposes tokens with certainty: q is one-hot.  Then a draft d is kept with
    probability p(d), and a rejection resamples from p without d: still exactly p."""
    params = SamplingParams(temperature=1.0)
    p = sampling_probs(TARGET_LOGITS[0], params)
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(len(p))
    for _ in range(4000):
        draft = 2  # always the same guess (the copy found), whatever p thinks of it
        q = torch.zeros(1, len(p))
        q[0, draft] = 1.0
        token = rejection_sample(DraftTokens([draft], q), TARGET_LOGITS[:2], params, generator)[0]
        counts[token] += 1
    expected = p.double() / p.double().sum() * counts.double().sum()
    assert chisquare(counts.double().numpy(), expected.numpy()).pvalue > 1e-3


# ---------------------------------------------------------------------- the batched form


def random_round(seed: int, kinds: list[str], num_drafts: list[int], vocab_size: int, closeness: float):
    """R verifying requests: drafts, target logits (sum of k + 1, V), params and seeds.
    kinds: "greedy", "sampling" (drafts drawn from q) or "certain" (n-gram drafts, q one-hot);
    closeness: how much the draft's logits follow the target's (1: the same model)."""
    gen = torch.Generator().manual_seed(seed)
    target_logits = torch.randn(sum(num_drafts) + len(num_drafts), vocab_size, generator=gen) * 2
    all_params = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=3),
                  SamplingParams(temperature=1.3, top_p=0.8), SamplingParams(temperature=0.9, min_p=0.1)]
    drafts, params, start = [], [], 0
    for i, (kind, k) in enumerate(zip(kinds, num_drafts)):
        rows = target_logits[start : start + k]
        start += k + 1
        if kind == "greedy":
            params.append(SamplingParams(temperature=0))
            # mostly the target's argmax (accepted), sometimes not
            ids = [int(r.argmax()) if torch.rand((), generator=gen) < 0.7 else int(torch.randint(vocab_size, (), generator=gen))
                   for r in rows]
            drafts.append(DraftTokens(ids))
            continue
        p = all_params[i % len(all_params)]
        params.append(p)
        draft_logits = closeness * rows + (1 - closeness) * torch.randn(k, vocab_size, generator=gen) * 2
        q = torch.stack([sampling_probs(r, p) for r in draft_logits]) if k else torch.zeros(0, vocab_size)
        ids = torch.multinomial(q, 1, generator=gen)[:, 0].tolist() if k else []
        if kind == "certain":
            q = torch.zeros(k, vocab_size)
            q[torch.arange(k), torch.tensor(ids, dtype=torch.long)] = 1.0
        drafts.append(DraftTokens(ids, q))
    return drafts, target_logits, params


def one_at_a_time(drafts, target_logits, params, generators) -> list[list[int]]:
    """The readable rule, request after request (what the engine did before batching)."""
    out, start = [], 0
    for draft, p, g in zip(drafts, params, generators):
        out.append(rejection_sample(draft, target_logits[start : start + len(draft) + 1], p, g))
        start += len(draft) + 1
    return out


@settings(max_examples=60, deadline=None)
@given(
    requests=st.lists(st.tuples(st.sampled_from(["greedy", "sampling", "sampling", "certain"]), st.integers(0, 5)),
                      min_size=1, max_size=6),
    seed=st.integers(0, 2**31),
    vocab_size=st.sampled_from([5, 12, 40]),
    closeness=st.sampled_from([0.0, 0.8, 1.0]),
)
def test_the_batch_gives_the_one_at_a_time_tokens_and_generator_states(requests, seed, vocab_size, closeness):
    """Same tokens, and every generator left in the same state (so the next round draws the
    same numbers too), for any mix of greedy, sampling and n-gram requests and draft lengths."""
    kinds, num_drafts = [kind for kind, _ in requests], [k for _, k in requests]
    drafts, target_logits, params = random_round(seed, kinds, num_drafts, vocab_size, closeness)
    gens_a = [None if p.greedy else torch.Generator().manual_seed(seed + i) for i, p in enumerate(params)]
    gens_b = [None if p.greedy else torch.Generator().manual_seed(seed + i) for i, p in enumerate(params)]
    for _ in range(2):  # a second round: the generators must have advanced alike
        expected = one_at_a_time(drafts, target_logits, params, gens_a)
        assert rejection_sample_batch(drafts, target_logits, params, gens_b) == expected
        assert all(a is b or torch.equal(a.get_state(), b.get_state()) for a, b in zip(gens_a, gens_b))


def test_the_batch_takes_every_path():
    """Seeded rounds where drafts are all accepted, rejected at the last draft, and rejected
    early: the batch equals the one-at-a-time rule on each."""
    seen = set()
    for seed in range(40):
        drafts, target_logits, params = random_round(seed, ["sampling"] * 4, [4, 3, 4, 2], 6, closeness=0.8)
        gens_a = [torch.Generator().manual_seed(seed * 10 + i) for i in range(4)]
        gens_b = [torch.Generator().manual_seed(seed * 10 + i) for i in range(4)]
        expected = one_at_a_time(drafts, target_logits, params, gens_a)
        assert rejection_sample_batch(drafts, target_logits, params, gens_b) == expected
        for draft, tokens in zip(drafts, expected):
            num_accepted = len(tokens) - 1
            seen.add("all" if num_accepted == len(draft) else "last" if num_accepted == len(draft) - 1 else "early")
    assert seen == {"all", "last", "early"}


def test_the_batch_reads_the_device_once(monkeypatch):
    """One read-back for the whole batch (greedy picks, accepted counts, last tokens), none per
    draft."""
    drafts, target_logits, params = random_round(3, ["sampling", "greedy", "certain", "sampling"], [4, 3, 4, 2], 12, 0.8)
    generators = [None if p.greedy else torch.Generator().manual_seed(i) for i, p in enumerate(params)]
    calls = {"item": 0, "tolist": 0, "__bool__": 0, "__float__": 0, "__int__": 0}
    for name in calls:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            calls[_name] += 1
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    rejection_sample_batch(drafts, target_logits, params, generators)
    # bool: the sampler's
    assert calls == {"item": 0, "tolist": 1, "__bool__": 1, "__float__": 0, "__int__": 0}
    # validity check of the distributions, once for all rows


def test_a_learners_rule_runs_in_the_batch_request_by_request():
    """With `accept_drafts` replaced (the course's build check), the batch goes through it, once
    per sampling request, so the engine really runs the learner's function."""
    from minilm_engine.pluggable import num_calls, override

    drafts, target_logits, params = random_round(1, ["sampling", "greedy", "sampling"], [3, 2, 1], 12, 0.8)
    generators = [None if p.greedy else torch.Generator().manual_seed(i) for i, p in enumerate(params)]

    def always_accept(draft_token_ids, p, q, generator):
        return list(draft_token_ids) + [0]

    with override("spec_decode.accept_drafts", always_accept):
        out = rejection_sample_batch(drafts, target_logits, params, generators)
        assert num_calls("spec_decode.accept_drafts") == 2
    assert out[0] == drafts[0].token_ids + [0] and out[2] == drafts[2].token_ids + [0]


def test_a_shared_generator_still_gives_valid_tokens():
    """Requests sharing one generator (None: torch's global one) draw in the batch's order, not
    request after request; their tokens are still an accepted prefix and one more."""
    drafts, target_logits, params = random_round(2, ["sampling", "sampling"], [3, 3], 6, 0.5)
    shared = torch.Generator().manual_seed(9)
    for generators in ([shared, shared], [None, None]):
        out = rejection_sample_batch(drafts, target_logits, params, generators)
        for draft, tokens in zip(drafts, out):
            assert 1 <= len(tokens) <= len(draft) + 1
            assert tokens[:-1] == draft.token_ids[: len(tokens) - 1]


def test_the_batch_refuses_bad_shapes():
    params = [SamplingParams(temperature=1.0)] * 2
    drafts = [DraftTokens([0, 1], torch.ones(2, 5) / 5), DraftTokens([2], torch.ones(1, 5) / 5)]
    with pytest.raises(ValueError, match="3 drafts of 2 requests need 5 rows of target logits, got 4"):
        rejection_sample_batch(drafts, TARGET_LOGITS, params, [None, None])
    with pytest.raises(ValueError, match="need the draft's probabilities"):
        rejection_sample_batch([DraftTokens([0, 1, 2])], TARGET_LOGITS, params[:1], [None])
