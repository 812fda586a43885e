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

`rejection_sample` is the readable rule, one request and one draft at a time (three reads from
the device per draft).  The engine calls `rejection_sample_batch`, which gives exactly its tokens
for all the step's verifying requests with two reads from the device in all (tested against it,
generator states included).
"""

from __future__ import annotations

import numpy as np
import torch

from minilm_engine.pluggable import is_overridden, replaceable
from minilm_engine.worker.input_batch import InputBuffer
from minilm_engine.worker.sampler import batched_sampling_probs, sampling_probs
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.outputs import DraftTokens


def accept_probability(p_draft: float, q_draft: float) -> float:
    """min(1, p(d) / q(d)): the draft's token is kept with the share of q that p agrees with."""
    return min(1.0, p_draft / q_draft)


def recovered_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(V,), (V,) -> normalized max(p - q, 0): where the target wants more than the draft gave."""
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    # total is 0 only when p == q up to rounding, and then a rejection has ~zero probability
    # anyway: p itself.  (torch.where, not `if`: the host need not wait to read `total`.)
    return torch.where(total > 0, residual / total, p)


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
    return _greedy_accept(draft_token_ids, target_logits.argmax(dim=-1).tolist())


def _greedy_accept(draft_token_ids: list[int], target_choice: list[int]) -> list[int]:
    """target_choice: the target's argmax at the k + 1 rows -> the tokens to append."""
    out: list[int] = []
    for draft_token, target_token in zip(draft_token_ids, target_choice):
        out.append(target_token)  # equal to the draft's when accepted, the correction otherwise
        if draft_token != target_token:
            return out
    out.append(target_choice[-1])  # all accepted: the bonus token
    return out


# -- the engine's batched form ---------------------------------------------------------------


def rejection_sample_batch(
    drafts: list[DraftTokens],
    target_logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    buffer: InputBuffer | None = None,
) -> list[list[int]]:
    """`rejection_sample` for R requests at once: target_logits (sum of k_i + 1, V) float32,
    request i's k_i + 1 rows after request i - 1's -> each request's 1..k_i + 1 tokens.

    The tokens are those of `rejection_sample` called request after request, and every
    generator ends in the same state, while the host reads from the device twice in all (the
    sampler's own check that the distributions are valid aside), not three times per draft:

        1. on the device, for every request: the target's argmax at each row (greedy requests),
           and for each sampling request's drafts, one u each from its generator and the test
           u < min(1, p(d) / q(d))                                       -> read back once
        2. on the host: each request's accepted prefix (up to its first failed test); then per
           sampling request, its last token, drawn from max(p - q, 0) at the first rejection or
           from p at row k as torch.multinomial draws it                 -> read back once

    Why a generator is rewound: the one-at-a-time rule draws no u after the first rejection,
    and draws the replacement next; here all k u's are drawn before anyone knows where the
    first rejection is.  So a request that rejected draft j + 1 < k gets its generator back as
    it was before its u's and draws u_1..u_{j+1} again: its replacement then comes from the
    numbers the one-at-a-time rule would have given it.  `buffer` carries the step's indices to
    the device (None: one for this call).
    """
    num_drafts = [len(d) for d in drafts]
    starts = np.concatenate([[0], np.cumsum(np.add(num_drafts, 1))]).astype(np.int64)  # (R + 1,) rows
    if target_logits.shape[0] != starts[-1]:
        raise ValueError(
            f"{sum(num_drafts)} drafts of {len(drafts)} requests need {starts[-1]} rows of target logits, "
            f"got {target_logits.shape[0]}"
        )
    sampling = [i for i, p in enumerate(params) if not p.greedy]
    if any(drafts[i].probs is None for i in sampling):
        raise ValueError("a sampling request's drafts need the draft's probabilities")
    sampling_generators = [generators[i] for i in sampling]
    if (is_overridden("spec_decode.accept_drafts") or any(g is None for g in sampling_generators)
            or len({id(g) for g in sampling_generators}) < len(sampling)):
        # The one-at-a-time rule, request by request: a learner's `accept_drafts` is installed
        # (`course/teaching/build.py` checks it in the engine), or a generator is shared (None is
        # torch's global one), whose numbers the batched draw would hand out in another order.
        return [rejection_sample(d, target_logits[starts[i] : starts[i + 1]], p, g)
                for i, (d, p, g) in enumerate(zip(drafts, params, generators))]
    buffer = buffer if buffer is not None else InputBuffer(target_logits.device, size=0)

    # 1. Every test, for every request at once, and one read-back.
    choices = target_logits.argmax(dim=-1)  # (sum of k + 1,) the target's own picks
    passed, states_before = torch.zeros(0, dtype=torch.bool, device=choices.device), []
    if sampling:
        p, passed, states_before = _accept_tests(drafts, target_logits, params, generators, sampling, starts, buffer)
    read = torch.cat([choices, passed.long()]).tolist()
    choices, passed = read[: len(choices)], read[len(choices) :]

    # 2. Each request's accepted prefix; a sampling request's last token drawn on the device.
    out = [_greedy_accept(d.token_ids, choices[starts[i] : starts[i + 1]]) if params[i].greedy else []
           for i, d in enumerate(drafts)]
    last_tokens = []  # per sampling request, a 0-dim tensor: read back together
    p_start = test = 0  # where the request's rows of p, and its tests, begin
    for i, state_before in zip(sampling, states_before):
        draft, generator, k = drafts[i], generators[i], len(drafts[i])
        num_accepted = next((j for j in range(k) if not passed[test + j]), k)
        if num_accepted < k:
            if num_accepted + 1 < k:  # rewind, as if only u_1 .. u_{j+1} had been drawn
                generator.set_state(state_before)
                _uniforms(num_accepted + 1, generator, target_logits.device)
            dist = recovered_distribution(p[p_start + num_accepted], draft.probs[num_accepted])
        else:
            dist = p[p_start + k]  # all accepted: the bonus token, from p at row k
        # torch.multinomial's own draw of one sample, without its checks (which read the device)
        race = torch.empty_like(dist).exponential_(1, generator=generator)
        last_tokens.append(torch.div(dist, race, out=race).argmax())
        out[i] = draft.token_ids[:num_accepted]
        p_start, test = p_start + k + 1, test + k
    if last_tokens:
        for i, token in zip(sampling, torch.stack(last_tokens).tolist()):
            out[i].append(token)
    return out


def _accept_tests(drafts, target_logits, params, generators, sampling: list[int], starts: np.ndarray,
                  buffer: InputBuffer) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """The sampling requests' tests -> (p (sum of k + 1, V) their target distributions,
    passed (sum of k,) bool u < min(1, p(d) / q(d)) for each of their drafts, each generator's
    state before its u's were drawn)."""
    device = target_logits.device
    p = batched_sampling_probs(  # the same bits as `sampling_probs` row by row
        torch.cat([target_logits[starts[i] : starts[i + 1]] for i in sampling]),
        [params[i] for i in sampling for _ in range(len(drafts[i]) + 1)],
    )  # (sum over the sampling requests of k + 1, V)
    q = torch.cat([drafts[i].probs for i in sampling])  # (sum of k, V)
    # Each draft is tested at its request's row of p of the same index (the last row tests none).
    firsts = np.cumsum([0] + [len(drafts[i]) + 1 for i in sampling])[:-1]
    p_rows = np.concatenate([first + np.arange(len(drafts[i])) for first, i in zip(firsts, sampling)])
    token_ids = np.array([t for i in sampling for t in drafts[i].token_ids], dtype=np.int64)  # (sum of k,)
    p_rows_t, token_ids_t = buffer.upload([p_rows.astype(np.int64), token_ids])
    states_before = [generators[i].get_state() for i in sampling]
    u = torch.cat([_uniforms(len(drafts[i]), generators[i], device) for i in sampling])  # (sum of k,)
    # min(1, p/q) in float64, as the one-at-a-time rule compares Python floats
    ratio = p[p_rows_t, token_ids_t].double() / q[torch.arange(len(token_ids), device=device), token_ids_t].double()
    return p, u.double() < ratio.clamp(max=1.0), states_before


def _uniforms(num: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """(num,) float32: the numbers `num` calls of torch.rand((), generator=generator) give.  One
    call on a CPU (its Mersenne Twister hands them out in order: tested); one per number on a
    GPU, where the elements of one tensor come from different Philox subsequences."""
    if device.type == "cpu" or num == 0:
        return torch.rand(num, generator=generator, device=device)
    return torch.stack([torch.rand((), generator=generator, device=device) for _ in range(num)])
