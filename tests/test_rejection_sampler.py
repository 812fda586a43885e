"""Tests for minilm_engine.worker.spec_decode.rejection_sampler: the output is the target's distribution.

The statistical test runs many seeded verification rounds on a 5-token vocabulary with fixed
target and draft distributions and compares, position by position, how often each token comes
out with the target's probabilities (chi-square, scipy).  The same test with a deliberately
wrong rule swapped in (resample from p instead of max(p - q, 0); always accept) must fail: that
is what shows the test can tell.  Everything is seeded, so the p-values are the same every run.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from minilm_engine import SamplingParams
from minilm_engine.worker.sampler import sampling_probs
from minilm_engine.worker.spec_decode import rejection_sampler
from minilm_engine.worker.spec_decode.rejection_sampler import rejection_sample
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
