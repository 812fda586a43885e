"""The statistical test behind the accept-rule build check: is the output the target's?

Contract: `check_accept_rule_distribution(rule, num_samples)` draws drafts from a known draft
distribution q, runs `rule(drafts, p, q, generator)` that many times, and tests with a
chi-square goodness-of-fit test every token the rule emits: the token at position j, when
drafts 0..j-1 were accepted, is distributed as the target's p[j] (the bonus token, after all k,
as p[k]); and that a round whose drafts were all accepted ends with a bonus token (a round
where p = q, one-hot).  It raises `BuildFailure` naming the position, the token that is most off
(observed vs expected counts), the p-value, and the row of p or q the tokens fit instead.
A correct rule fails by chance with probability about 3 * 1e-4 (three tests at the threshold),
and the generator is seeded, so a given rule always gets the same verdict.
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


def _test(observed: torch.Tensor, expected: torch.Tensor, what: str, row: str) -> str:
    statistic, p_value = chi_square_p_value(observed, expected)
    n = int(observed.sum())
    if p_value < P_VALUE_THRESHOLD:
        worst = int(((observed - expected * n).abs() / (expected * n).sqrt()).argmax())
        raise BuildFailure(
            f"the {what} is not distributed as the target's {row}: token {worst} came {int(observed[worst])} "
            f"times in {n} draws, the target's probability says {expected[worst].item() * n:.0f} "
            f"(chi-square {statistic:.1f}, p = {p_value:.1e}); observed shares "
            f"{[round(x, 3) for x in (observed / n).tolist()]}, target {[round(x, 3) for x in expected.tolist()]}{_looks_like(observed)}"
        )
    return f"{what}: chi-square p = {p_value:.2f} over {n} draws"


def _looks_like(observed: torch.Tensor) -> str:
    """Which other row of p or q the observed tokens fit, if one does: the row the rule used."""
    for name, rows in (("p", P), ("q", Q)):
        for i, probs in enumerate(rows):
            if chi_square_p_value(observed, probs)[1] > 1e-2:
                return f"; they fit {name}[{i}] instead, so your rule draws this token from {name}[{i}]"
    return ""


def check_accept_rule_distribution(rule: Callable, num_samples: int) -> str:
    """Every token the rule can emit, position by position: the token at position j, given
    that drafts 0..j-1 were accepted, must be distributed as the target's row p[j] (a resample
    after a rejection, or the accepted draft); at j = k, after every draft passed, it is the
    bonus token, from p[k]."""
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
    counts = torch.zeros(k + 1, V)  # counts[j]: the token at position j, given drafts 0..j-1 accepted
    for _ in range(num_samples):
        drafts = [int(torch.multinomial(Q[i], 1, generator=generator)) for i in range(k)]
        out = rule(drafts, P.clone(), Q.clone(), generator)
        for j, token in enumerate(out):
            counts[j, token] += 1
            if j == k or token != drafts[j]:
                break
    results = []
    for j in range(k + 1):
        if counts[j].sum() == 0:
            continue
        if j == 0:
            what = "first appended token"
        elif j < k:
            what = f"token at position {j} (after {j} accepted draft{'s' * (j > 1)})"
        else:
            what = f"bonus token (after all {k} drafts were accepted)"
        results.append(_test(counts[j], P[j], what, f"row p[{j}]"))
    return "; ".join(results)
