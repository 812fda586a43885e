"""Accept or reject drafted tokens so that the output is distributed exactly as the target's.

Contract: `rejection_sample(draft, target_logits, params, generator)` takes the k tokens a draft
proposed for one request, the draft's probabilities for them, and the target's logits at the
k + 1 positions of the verification chunk; it returns the tokens to append: the accepted
prefix of the drafts, then one token from the target (1 to k + 1 tokens in all).

    verification chunk   [ t   d1  d2  d3 ]      t: the request's last token, d: drafts (k = 3)
    target logits row      0   1   2   3         row i scores the token after chunk token i
    row i verifies d(i+1); row k gives the bonus token when all k were accepted

Greedy requests (temperature 0): accept d(i+1) while it equals the target's argmax at row i;
at the first difference, append the target's argmax instead.  Identical to decoding with the
target alone, by construction.

Sampling requests, the modified rejection sampling of Leviathan et al. (2023) and Chen et al.
(2023), with p = target and q = draft distributions after temperature, top-k and top-p (the
same processing `worker/sampler.py` applies, to both models):

    accept draft d with probability min(1, p(d) / q(d))
    on the first rejection, sample from  max(p - q, 0) / sum(max(p - q, 0))  and stop
    if all k are accepted, sample the bonus token from p at row k

Why it is exact: P(output = x) = q(x) min(1, p(x)/q(x)) + P(reject) * max(p(x) - q(x), 0) / Z
= min(q(x), p(x)) + max(p(x) - q(x), 0) = p(x), since P(reject) = 1 - sum_x min(p, q) = Z.
"""

from __future__ import annotations


import torch

from minilm_engine.pluggable import replaceable
from minilm_engine.worker.sampler import sampling_probs
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.outputs import DraftTokens


def accept_probability(p_draft: float, q_draft: float) -> float:
    """min(1, p(d) / q(d)): the draft's token is kept with the share of q that p agrees with."""
    return min(1.0, p_draft / q_draft)


def recovered_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,), (V,) -> normalized max(p - q, 0): where the target wants more than the draft gave."""
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    if total <= 0:
        # Only when p == q up to rounding, and then a rejection has ~zero probability anyway.
        return p
    return residual / total


def rejection_sample(
    draft: DraftTokens,
    target_logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
) -> list[int]:
    """target_logits: (k + 1, V) float32 -> the 1..k+1 tokens to append (see module docstring)."""
    k = len(draft)
    if target_logits.shape[0] != k + 1:
        raise ValueError(f"{k} drafts need {k + 1} rows of target logits, got {target_logits.shape[0]}")
    if params.greedy:
        return _greedy_verify(draft.token_ids, target_logits)
    if draft.probs is None:
        raise ValueError("a sampling request's drafts need the draft's probabilities")
    p = torch.stack([sampling_probs(row, params) for row in target_logits])  # (k + 1, V)
    return accept_drafts(draft.token_ids, p, draft.probs, generator)


@replaceable("spec_decode.accept_drafts")
def accept_drafts(
    draft_token_ids: list[int], p: torch.Tensor, q: torch.Tensor, generator: torch.Generator | None
) -> list[int]:
    """The sampling rule (module docstring): p (k + 1, V) the target's distributions at the
    verification rows, q (k, V) the draft's for its k tokens -> the 1..k + 1 tokens to append."""
    out: list[int] = []
    for i, token in enumerate(draft_token_ids):
        u = torch.rand((), generator=generator, device=q.device).item()
        if u < accept_probability(p[i, token].item(), q[i, token].item()):
            out.append(token)
            continue
        recovered = recovered_distribution(p[i], q[i])
        out.append(torch.multinomial(recovered, 1, generator=generator).item())
        return out
    k = len(draft_token_ids)
    out.append(torch.multinomial(p[k], 1, generator=generator).item())  # all accepted: the bonus
    return out


def _greedy_verify(draft_token_ids: list[int], target_logits: torch.Tensor) -> list[int]:
    target_choice = target_logits.argmax(dim=-1).tolist()  # (k + 1,) the target's own picks
    out: list[int] = []
    for draft_token, target_token in zip(draft_token_ids, target_choice):
        out.append(target_token)  # equal to the draft's when accepted, the correction otherwise
        if draft_token != target_token:
            return out
    out.append(target_choice[-1])  # all accepted: the bonus token
    return out
