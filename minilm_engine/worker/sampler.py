"""Logits -> next tokens (and their logprobs).  The last step of every serving strategy.

Contract: `sample(logits, params, generators)` returns one token id per row: greedy rows take
the argmax; sampling rows apply temperature, min-p, top-k, top-p (vLLM's order) and draw with
the row's own seeded `torch.Generator`, so a request's output does not depend on its batch.
`sample_requests(logits, requests)`, the engine's entry, first applies the processors that
read a request's history, in vLLM V1's order:

    raw logits ──> grammar rows: -inf where the grammar forbids (`worker/structured_output.py`)
        ▼
    logits ──────> logprobs = log_softmax(logits)   (the model's own distribution)
        ▼
    min_tokens (EOS and stop tokens -> -inf), logit_bias, repetition / frequency / presence
        ▼
    greedy: argmax          sampling: / temperature -> min_p -> top_k -> top_p -> draw

Rows whose params change nothing skip the processors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.outputs import TokenLogprobs
from minilm_engine.model.device import upload
from minilm_engine.worker.structured_output import apply_grammar_bitmask

if TYPE_CHECKING:
    from minilm_engine.core.request import Request


def apply_top_k_top_p(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """logits: (V,) -> the same logits with every token outside the kept set set to -inf."""
    if top_k and top_k < logits.shape[-1]:
        kth_best = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth_best, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # Drop a token when the tokens ranked above it already reach top_p: the kept set is
        # the smallest prefix whose probability mass is >= top_p (never empty).
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """logits: (V,) -> -inf wherever a token's probability is below min_p x the best one's
    (transformers' MinPLogitsWarper, vLLM's MinPLogitsProcessor)."""
    if min_p <= 0:
        return logits
    probs = torch.softmax(logits, dim=-1)
    return logits.masked_fill(probs < min_p * probs.max(), float("-inf"))


def sampling_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: (V,) -> the distribution a sampling request draws from: temperature, min-p,
    top-k, top-p, softmax (speculative decoding applies it to both models)."""
    scaled = apply_min_p(logits / params.temperature, params.min_p)
    return torch.softmax(apply_top_k_top_p(scaled, params.top_k, params.top_p), dim=-1)


CPU_CHUNK_BYTES = 1 << 21  # float32 logits per chunk of rows on a CPU: about an L2 cache


def sample_one_at_a_time(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """The readable reference of `sample`: logits (B, V) float32 -> (B,) int64, one row at a
    time, each drawn by torch.multinomial with the row's generator."""
    next_tokens = logits.argmax(dim=-1)  # greedy for everyone; sampling rows overwrite below
    for row, (p, gen) in enumerate(zip(params, generators)):
        if p.greedy:
            continue
        next_tokens[row] = torch.multinomial(sampling_probs(logits[row], p), 1, generator=gen)[0]
    return next_tokens


def _take(x: torch.Tensor, rows: list[int]) -> torch.Tensor:
    """x[rows], without a copy when `rows` is every row."""
    return x if len(rows) == x.shape[0] else x[rows]


def _put(x: torch.Tensor, rows: list[int], values: torch.Tensor) -> torch.Tensor:
    """x with `values` in `rows` (`values` itself when `rows` is every row)."""
    if len(rows) == x.shape[0]:
        return values
    x[rows] = values
    return x


def batched_sampling_probs(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """logits: (S, V) -> (S, V): `sampling_probs` of every row (row i with params[i]), all at
    once, the same float operations per row (the same bits); only rows that ask pay for each."""
    device = logits.device
    temperatures = upload([p.temperature for p in params], device, logits.dtype)
    scaled = logits / temperatures[:, None]  # (S, V)
    rows = [i for i, p in enumerate(params) if p.min_p > 0]
    if rows:
        min_p = upload([params[i].min_p for i in rows], device, logits.dtype)
        some = _take(scaled, rows)  # (R, V)
        probs = torch.softmax(some, dim=-1)
        scaled = _put(scaled, rows, some.masked_fill(probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True), float("-inf")))
    vocab_size = logits.shape[-1]
    rows = [i for i, p in enumerate(params) if p.top_k and p.top_k < vocab_size]
    if rows:
        top_k = upload([params[i].top_k for i in rows], device)
        some = _take(scaled, rows)  # (R, V)
        best = torch.topk(some, int(top_k.max()), dim=-1).values  # (R, max k), best first
        kth_best = best.gather(1, top_k[:, None] - 1)  # (R, 1)
        scaled = _put(scaled, rows, some.masked_fill(some < kth_best, float("-inf")))
    rows = [i for i, p in enumerate(params) if p.top_p < 1.0]
    if rows:
        top_p = upload([params[i].top_p for i in rows], device, logits.dtype)
        some = _take(scaled, rows)  # (R, V)
        sorted_logits, order = torch.sort(some, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        # as in apply_top_k_top_p: drop a token once the tokens ranked above it reach top_p
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_before >= top_p[:, None]
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        scaled = _put(scaled, rows, some.masked_fill(drop, float("-inf")))
    if not bool(torch.isfinite(scaled.amax(dim=-1)).all()):  # what multinomial refuses too
        raise RuntimeError("invalid sampling distribution (inf or nan logits, or every token masked)")
    return torch.softmax(scaled, dim=-1)


def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> torch.Tensor:
    """logits: (B, V) float32 -> (B,) int64 next-token ids, all sampling rows at once: the
    token `sample_one_at_a_time` gives each row.  torch.multinomial's own draw of one sample,
    argmax(p / q) with q ~ Exp(1) from the row's generator (P(argmax = i) = p_i)."""
    next_tokens = logits.argmax(dim=-1)  # greedy for everyone; sampling rows overwrite below
    rows = [i for i, p in enumerate(params) if not p.greedy]
    # On a CPU, rows go in chunks of about CPU_CHUNK_BYTES: passes that outgrow the cache cost
    # more than they save (benchmarks/sampler_cost.py).
    # Elsewhere one pass takes every row (max(1, ...): a batch with no sampling row has none).
    chunk = max(1, len(rows) if logits.device.type != "cpu" else CPU_CHUNK_BYTES // (4 * logits.shape[-1]))
    for start in range(0, len(rows), chunk):
        some = rows[start : start + chunk]
        sampling = logits if len(some) == len(params) else logits[some]  # (S, V)
        probs = batched_sampling_probs(sampling, [params[i] for i in some])  # (S, V)
        race = torch.empty_like(probs)
        for j, i in enumerate(some):
            race[j].exponential_(1, generator=generators[i])  # the row's own stream, as multinomial draws
        next_tokens[some] = torch.div(probs, race, out=race).argmax(dim=-1)
    return next_tokens


# -- logits processors that read a request's history ---------------------------------------


def token_counts(token_ids: list[int], vocab_size: int, device: torch.device) -> torch.Tensor:
    """-> (V,) how often each token id occurs in `token_ids`."""
    ids = upload(token_ids, device, torch.long)
    return torch.bincount(ids, minlength=vocab_size)[:vocab_size].to(torch.float32)


def apply_penalties(logits: torch.Tensor, prompt_token_ids: list[int], output_token_ids: list[int],
                    params: SamplingParams) -> torch.Tensor:
    """logits: (V,) -> penalised logits (a new tensor), as vLLM's `apply_penalties`: repetition
    (a seen token's positive logit divided by the penalty, a negative one multiplied), then
    frequency and presence on output tokens (OpenAI's definition)."""
    vocab_size = logits.shape[-1]
    output_counts = token_counts(output_token_ids, vocab_size, logits.device)  # (V,)
    logits = logits.clone()
    if params.repetition_penalty != 1.0:
        seen = (token_counts(prompt_token_ids, vocab_size, logits.device) > 0) | (output_counts > 0)
        penalised = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    logits -= params.frequency_penalty * output_counts
    logits -= params.presence_penalty * (output_counts > 0).to(logits.dtype)
    return logits


def apply_logit_bias(logits: torch.Tensor, logit_bias: dict[int, float]) -> torch.Tensor:
    """logits: (V,) -> logits + bias at the biased ids (a new tensor)."""
    ids = upload(list(logit_bias), logits.device, torch.long)
    bias = upload(list(logit_bias.values()), logits.device, logits.dtype)
    return logits.index_add(0, ids, bias)


def apply_min_tokens(logits: torch.Tensor, stop_token_ids: list[int]) -> torch.Tensor:
    """logits: (V,) -> -inf at the tokens that would end the request (while it is too short)."""
    ids = upload(stop_token_ids, logits.device, torch.long)
    return logits.index_fill(0, ids, float("-inf"))


def process_logits(logits: torch.Tensor, request: Request) -> torch.Tensor:
    """logits: (V,) raw -> what the request samples from, before temperature (vLLM's order:
    min_tokens, logit_bias, then the penalties)."""
    params = request.sampling_params
    if params.min_tokens and len(request.output_token_ids) < params.min_tokens:
        stops = list(params.stop_token_ids) + ([] if params.ignore_eos else list(request.eos_token_ids))
        stops = [t for t in stops if t < logits.shape[-1]]
        if stops:
            logits = apply_min_tokens(logits, stops)
    if params.logit_bias:
        logits = apply_logit_bias(logits, params.logit_bias)
    if params.repetition_penalty != 1.0 or params.frequency_penalty or params.presence_penalty:
        logits = apply_penalties(logits, request.prompt_token_ids, request.output_token_ids, params)
    return logits


# -- logprobs --------------------------------------------------------------------------------


def gather_logprobs(logprobs: torch.Tensor, chosen: torch.Tensor, num_top: int) -> TokenLogprobs:
    """logprobs: (N, V) log-softmax, chosen: (N,) ids -> each row's chosen and top-`num_top`
    tokens.  A rank counts the tokens at least as likely as the chosen one (vLLM's rule)."""
    chosen_logprobs = logprobs.gather(1, chosen[:, None])  # (N, 1)
    ranks = (logprobs >= chosen_logprobs).sum(dim=-1)  # (N,)
    num_top = min(num_top, logprobs.shape[-1])
    top = torch.topk(logprobs, num_top, dim=-1) if num_top > 0 else None
    ids = chosen[:, None] if top is None else torch.cat([chosen[:, None], top.indices], dim=1)
    values = chosen_logprobs if top is None else torch.cat([chosen_logprobs, top.values], dim=1)
    return TokenLogprobs(ids.tolist(), values.float().tolist(), ranks.tolist())


@dataclass
class SamplerOutput:
    token_ids: torch.Tensor  # (B,)
    logprobs: list[TokenLogprobs | None]  # per row: its sampled token's, when it asked


def sample_requests(logits: torch.Tensor, requests: list[Request]) -> SamplerOutput:
    """logits: (B, V) raw, one row per request -> next tokens, and the logprobs asked for."""
    # 0. Structured outputs: the grammar rows' forbidden tokens -> -inf (a no-op without any).
    logits = apply_grammar_bitmask(logits, requests)
    # 1. Logprobs of the raw model, for the rows that asked (before anything changes logits).
    asking = [i for i, r in enumerate(requests) if r.sampling_params.logprobs is not None]
    raw_logprobs = torch.log_softmax(logits[asking].float(), dim=-1) if asking else None  # (A, V)
    # 2. History-dependent processors, only on the rows they change.
    processed = logits
    for i, request in enumerate(requests):
        if request.sampling_params.needs_processing:
            if processed is logits:
                processed = logits.clone()
            processed[i] = process_logits(logits[i], request)
    # 3. Greedy or sampled, each row with its own generator.
    tokens = sample(processed, [r.sampling_params for r in requests], [r.generator for r in requests])
    per_row: list[TokenLogprobs | None] = [None] * len(requests)
    if asking:
        num_top = max(requests[i].sampling_params.logprobs for i in asking)
        found = gather_logprobs(raw_logprobs, tokens[asking], num_top)
        for j, i in enumerate(asking):
            k = requests[i].sampling_params.logprobs
            row = found.row(j)
            per_row[i] = TokenLogprobs([row.token_ids[0][: 1 + k]], [row.logprobs[0][: 1 + k]], row.ranks)
    return SamplerOutput(tokens, per_row)
