"""The statistical test behind the accept-rule build check: is the output the target's?

Contract: `check_accept_rule_distribution(rule, num_samples)` draws drafts from a known draft
distribution q, runs `rule(drafts, p, q, generator)` that many times, and tests with a
chi-square goodness-of-fit test that the first appended token is distributed as the target's
p[0], and the second (when the first draft was accepted) as p[1]; and that a round whose drafts
were all accepted ends with a bonus token (a round where p = q, one-hot).  It raises `BuildFailure` naming the position, the
token that is most off (observed vs expected counts) and the p-value.  A correct rule fails by
chance with probability about 2 * 1e-4 (the threshold), and the generator is seeded, so a given
rule always gets the same verdict.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from minilm_engine.course.teaching.build import BuildFailure

# A target and a draft that disagree a lot (V = 5, k = 2): a wrong rule is far from p.
P = torch.tensor(
    [
        [0.50, 0.05, 0.25, 0.10, 0.10],
        [0.10, 0.40, 0.10, 0.30, 0.10],
        [0.20, 0.20, 0.20, 0.20, 0.20],
    ]
)  # (k + 1, V) the target's rows
Q = torch.tensor(
    [
        [0.20, 0.40, 0.10, 0.20, 0.10],
        [0.35, 0.15, 0.30, 0.10, 0.10],
    ]
)  # (k, V) the draft's rows
P_VALUE_THRESHOLD = 1e-4


def chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> tuple[float, float]:
    """(statistic, p-value) of observed counts against the expected probabilities."""
    n = observed.sum()
    expected = expected_probs * n
    statistic = ((observed - expected) ** 2 / expected).sum()
    df = torch.tensor(float(len(observed) - 1))
    return statistic.item(), torch.special.gammaincc(df / 2, statistic / 2).item()


def _test(observed: torch.Tensor, expected: torch.Tensor, what: str) -> str:
    statistic, p_value = chi_square_p_value(observed, expected)
    n = int(observed.sum())
    if p_value < P_VALUE_THRESHOLD:
        worst = int(((observed - expected * n).abs() / (expected * n).sqrt()).argmax())
        raise BuildFailure(
            f"the {what} is not distributed as the target's: token {worst} came {int(observed[worst])} "
            f"times in {n} draws, the target's probability says {expected[worst].item() * n:.0f} "
            f"(chi-square {statistic:.1f}, p = {p_value:.1e}); observed shares "
            f"{[round(x, 3) for x in (observed / n).tolist()]}, target {expected.tolist()}"
        )
    return f"{what}: chi-square p = {p_value:.2f} over {n} draws"


def check_accept_rule_distribution(rule: Callable, num_samples: int) -> str:
    generator = torch.Generator().manual_seed(1234)
    k, V = Q.shape
    # A round the target agrees with entirely (p = q = one-hot at each draft): every draft passes
    # with certainty, and the target's row k still gives one more token.
    sure = torch.eye(V)[:k]
    out = rule(list(range(k)), torch.cat([sure, P[k:]]), sure.clone(), generator)
    if len(out) != k + 1:
        raise BuildFailure(
            f"with p = q (every draft certain to pass) your rule appended {out}: after {k} accepted drafts "
            f"the target's row k still gives one more token (the bonus token), {k + 1} in all"
        )
    first = torch.zeros(V)
    second = torch.zeros(V)  # given the first draft was accepted
    for _ in range(num_samples):
        drafts = [int(torch.multinomial(Q[i], 1, generator=generator)) for i in range(k)]
        out = rule(drafts, P.clone(), Q.clone(), generator)
        first[out[0]] += 1
        if out[0] == drafts[0] and len(out) > 1:
            second[out[1]] += 1
    results = [_test(first, P[0], "first appended token")]
    if second.sum() > 0:
        results.append(_test(second, P[1], "second token, after an accepted first draft"))
    return "; ".join(results)
