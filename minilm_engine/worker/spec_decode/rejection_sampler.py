"""Accept or reject drafted tokens so that the output is distributed exactly as the target's.

Contract: `rejection_sample(draft, target_logits, params, generator)` takes a request's k drafted
tokens (with the draft's probabilities for a sampling request) and the target's logits at the
k + 1 rows of the verification chunk, and returns the tokens to append: the accepted drafts,
then one token of the target's.  `rejection_sample_batch` does it for a whole step, with one
read from the device.

    verification chunk   [ t   d1  d2  d3 ]      t: the request's last token, d: drafts (k = 3)
    target logits row      0   1   2   3         row i verifies d(i+1); row k gives the bonus

Greedy: accept d(i+1) while it equals the target's argmax at row i, then append that argmax.
Sampling (Leviathan et al. 2023, Chen et al. 2023), p = target, q = draft, both processed as
`worker/sampler.py` does: accept d with probability min(1, p(d) / q(d)); at the first rejection
draw from max(p - q, 0) / Z and stop; if all k pass, draw the bonus from p at row k.  Exact:
P(x) = q(x) min(1, p(x)/q(x)) + P(reject) max(p(x) - q(x), 0) / Z = p(x), as P(reject) = Z.
Each request draws its k uniforms, then its last token (an exponential race, as multinomial
draws), from its own generator: its tokens do not depend on its batch.
"""

from __future__ import annotations

import numpy as np
import torch

from minilm_engine.pluggable import is_overridden, replaceable
from minilm_engine.worker.input_batch import InputBuffer
from minilm_engine.worker.sampler import batched_sampling_probs, sampling_probs
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.outputs import DraftTokens


def accept_probability(p_draft, q_draft):
    """min(1, p(d) / q(d)) (floats, or tensors element by element): the draft's token is kept
    with the share of q that p agrees with."""
    ratio = p_draft / q_draft
    return ratio.clamp(max=1.0) if isinstance(ratio, torch.Tensor) else min(1.0, ratio)


def recovered_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """(..., V), (..., V) -> normalized max(p - q, 0) per row: where the target wants more than
    the draft gave.  With q = 0 (no draft: the bonus row) it is p."""
    residual = (p - q).clamp(min=0)
    total = residual.sum(-1, keepdim=True)
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
    buffer = InputBuffer(p.device, size=0)
    num_accepted, last = _accept_sampled([draft_token_ids], p, q, [generator], buffer)
    num_accepted, last = torch.cat([num_accepted, last]).tolist()
    return draft_token_ids[:num_accepted] + [last]


def _accept_sampled(
    drafts: list[list[int]], p: torch.Tensor, q: torch.Tensor, generators: list, buffer: InputBuffer
) -> tuple[torch.Tensor, torch.Tensor]:
    """R sampling requests at once, on the device, nothing read back: drafts[i] request i's k_i
    tokens, p (sum of k_i + 1, V) and q (sum of k_i, V) their rows, request after request ->
    (num_accepted (R,), the token appended after the accepted drafts (R,))."""
    num_drafts = np.array([len(d) for d in drafts], dtype=np.int64)  # (R,)
    draft_starts = np.cumsum(num_drafts) - num_drafts  # (R,) each request's first draft
    p_starts = draft_starts + np.arange(len(drafts))  # (R,) its first row of p (k + 1 rows each)
    request_of = np.repeat(np.arange(len(drafts)), num_drafts)  # (sum of k,)
    index = np.arange(len(request_of)) - draft_starts[request_of]  # (sum of k,) j of draft j
    token_ids = np.array([t for d in drafts for t in d], dtype=np.int64)
    num_drafts_t, p_starts_t, request_of_t, index_t, token_ids_t = buffer.upload(
        [num_drafts, p_starts, request_of, index, token_ids])
    p_rows = p_starts_t[request_of_t] + index_t  # (sum of k,) the row of p that tests each draft
    # 1. Every draft's test: u < min(1, p(d) / q(d)).
    u = torch.cat([torch.rand(len(d), generator=g, device=p.device)
                   for d, g in zip(drafts, generators)])  # (sum of k,)
    q_at = q[torch.arange(len(token_ids_t), device=p.device), token_ids_t]
    passed = u < accept_probability(p[p_rows, token_ids_t], q_at)  # (sum of k,)
    # 2. Each request's accepted prefix: up to its first failed test (all k when none failed).
    first_failed = torch.where(passed, num_drafts_t[request_of_t], index_t)
    num_accepted = num_drafts_t.scatter_reduce(0, request_of_t, first_failed, "amin")  # (R,)
    # 3. The last token: from max(p - q, 0) at the first rejection, or from p at row k (where q
    # is taken as 0: `recovered_distribution` then gives p).
    q_full = torch.zeros_like(p).index_put_((p_rows,), q)  # (sum of k + 1, V) q beside p's rows
    rows = p_starts_t + num_accepted  # (R,)
    dist = recovered_distribution(p[rows], q_full[rows])  # (R, V)
    race = torch.stack([torch.empty_like(dist[0]).exponential_(1, generator=g) for g in generators])
    return num_accepted, (dist / race).argmax(dim=-1)


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


def rejection_sample_batch(
    drafts: list[DraftTokens],
    target_logits: torch.Tensor,
    params: list[SamplingParams],
    generators: list[torch.Generator | None],
    buffer: InputBuffer | None = None,
) -> list[list[int]]:
    """`rejection_sample` for R requests at once: target_logits (sum of k_i + 1, V) float32,
    request i's k_i + 1 rows after request i - 1's -> each request's 1..k_i + 1 tokens, the same
    tokens and generator states as request after request when each request has its own
    generator.  One read from the device for all of them (the sampler's check that the
    distributions are valid aside).  A learner's `accept_drafts` (`course/teaching/build.py`)
    runs request by request.  `buffer` carries the step's indices to the device."""
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
    if is_overridden("spec_decode.accept_drafts"):
        return [rejection_sample(d, target_logits[starts[i] : starts[i + 1]], p, g)
                for i, (d, p, g) in enumerate(zip(drafts, params, generators))]
    read = [target_logits.argmax(dim=-1)]  # (sum of k + 1,) the target's own picks
    if sampling:
        p = batched_sampling_probs(  # the same bits as `sampling_probs` row by row
            torch.cat([target_logits[starts[i] : starts[i + 1]] for i in sampling]),
            [params[i] for i in sampling for _ in range(num_drafts[i] + 1)],
        )  # (sum over the sampling requests of k + 1, V)
        q = torch.cat([drafts[i].probs for i in sampling])  # (sum of k, V)
        buffer = buffer if buffer is not None else InputBuffer(target_logits.device, size=0)
        read += _accept_sampled([drafts[i].token_ids for i in sampling], p, q,
                                [generators[i] for i in sampling], buffer)
    read = torch.cat(read).tolist()
    choices, sampled = read[: starts[-1]], read[starts[-1] :]  # then num_accepted (R,), last (R,)
    out = {i: drafts[i].token_ids[:n] + [token]
           for i, n, token in zip(sampling, sampled, sampled[len(sampling) :])}
    return [out[i] if i in out else _greedy_accept(d.token_ids, choices[starts[i] : starts[i + 1]])
            for i, d in enumerate(drafts)]
