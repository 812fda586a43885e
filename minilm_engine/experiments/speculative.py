"""Chapter 05's measurements: what speculative decoding buys, per K and per batch size.

Contract: `measure_speculation(...)` runs the same greedy requests through the continuous
engine without speculation and with K = 1, 2, ... drafted tokens per step, and returns one
`SpecRun` per (K, batch size): output tokens/s, whether the tokens equal the run without
speculation, and the draft's acceptance counters.  `tokens_per_forward_table` puts the measured
tokens per target forward next to the formula (1 - alpha^(K+1)) / (1 - alpha) evaluated at the
measured alpha.  Timings are wall-clock on whatever machine runs them (best of `num_repeats`).

Why it can pay at all: a decode step of a small batch is bandwidth-bound (chapter 01): reading
the weights costs the same whether the step checks 1 token or K + 1 of them, so a round that
keeps 3 tokens costs about one step plus the draft's K small steps.  Why it stops paying as the
batch grows: a big batch already keeps the matmuls busy, so K + 1 tokens per request cost
nearly K + 1 times as much, and every rejected draft is wasted compute.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from ..data.noodle_corpus import sample_prompts
from ..kv_cache.contiguous import ContiguousKVCache
from ..llm import LLM
from ..sampling_params import SamplingParams
from ..spec_decode.metrics import SpecDecodingStats, expected_tokens_per_round


@dataclass
class SpecRun:
    num_speculative_tokens: int  # 0: speculation off
    batch_size: int
    num_output_tokens: int
    seconds: float
    same_tokens: bool  # token for token what the run without speculation produced
    stats: SpecDecodingStats | None  # None without speculation
    num_target_forwards: int  # engine steps (each one forward of the target)

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_generate(llm: LLM, batches: list[list[str]], params: SamplingParams):
    """One timed pass over the batches, one batch after the other: (outputs, seconds, target
    forwards)."""
    outputs, seconds, num_forwards = [], 0.0, 0
    for batch in batches:
        steps_before = llm.engine.num_steps
        _sync(llm.device)
        start = time.perf_counter()
        outputs += llm.generate(batch, params, use_tqdm=False)
        _sync(llm.device)
        seconds += time.perf_counter() - start
        num_forwards += llm.engine.num_steps - steps_before
    return outputs, seconds, num_forwards


def measure_speculation(
    target: str = "noodle-chef",
    draft: str = "noodle-apprentice",
    num_speculative_tokens: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
    batch_sizes: tuple[int, ...] = (1,),
    max_tokens: int = 128,
    num_batches: int = 2,
    num_repeats: int = 1,
    device: str | None = None,
    seed: int = 0,
) -> list[SpecRun]:
    """For each batch size: the run without speculation (K = 0) first, then each K.

    Requests are greedy noodle-shop prompts (`sample_prompts`), ending at EOS or `max_tokens`;
    a batch of B is B different prompts submitted together, and `num_batches` batches run one
    after the other (so batch 1 is not one prompt's luck).  Each K has its own engine; the
    timed passes take turns over the Ks, `num_repeats` times, and each K keeps its fastest, so
    a burst of load on a shared machine hits every K alike rather than one of them.
    """
    runs: list[SpecRun] = []
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    ks = (0, *num_speculative_tokens)
    for batch_size in batch_sizes:
        prompts = sample_prompts(batch_size * num_batches, seed=seed)
        batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        engines = {}
        for k in ks:
            spec = {"model": draft, "num_speculative_tokens": k} if k else None
            engines[k] = LLM(target, device=device, max_num_seqs=batch_size, record_trace=False,
                             speculative_config=spec)
            engines[k].generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        best: dict[int, tuple] = {}
        for _ in range(num_repeats):
            for k in ks:
                result = _timed_generate(engines[k], batches, params)
                if k not in best or result[1] < best[k][1]:
                    best[k] = result
        baseline_tokens = [o.outputs[0].token_ids for o in best[0][0]]
        for k in ks:
            outputs, seconds, num_forwards = best[k]
            tokens = [o.outputs[0].token_ids for o in outputs]
            stats = _stats_of(outputs, k) if k else None  # the timed pass only
            runs.append(SpecRun(k, batch_size, sum(len(t) for t in tokens), seconds,
                                tokens == baseline_tokens, stats, num_forwards))
    return runs


def _stats_of(outputs, k: int) -> SpecDecodingStats:
    total = SpecDecodingStats(k)
    for out in outputs:
        if out.metrics.spec_decoding is not None:
            total.merge(out.metrics.spec_decoding)
    return total


def speedup_table(runs: list[SpecRun]) -> list[dict]:
    """One row per run: tokens/s and the ratio to the same batch size without speculation."""
    base = {r.batch_size: r for r in runs if r.num_speculative_tokens == 0}
    rows = []
    for r in runs:
        rows.append({
            "batch_size": r.batch_size,
            "K": r.num_speculative_tokens,
            "tokens_per_s": r.tokens_per_s,
            "speedup": r.tokens_per_s / base[r.batch_size].tokens_per_s,
            "same_tokens": r.same_tokens,
            "target_forwards": r.num_target_forwards,
            "draft_acceptance_rate": None if r.stats is None else r.stats.draft_acceptance_rate,
        })
    return rows


def tokens_per_forward_table(runs: list[SpecRun]) -> list[dict]:
    """Measured tokens per verification round vs the formula at the measured alpha."""
    rows = []
    for r in runs:
        if r.stats is None or not r.stats.num_drafts:
            continue
        alpha = r.stats.alpha
        rows.append({
            "batch_size": r.batch_size,
            "K": r.num_speculative_tokens,
            "alpha": alpha,
            "measured_tokens_per_round": r.stats.mean_acceptance_length,
            "formula_tokens_per_round": expected_tokens_per_round(alpha, r.num_speculative_tokens),
            "acceptance_rate_per_pos": r.stats.acceptance_rate_per_pos,
        })
    return rows


@torch.inference_mode()
def time_verify_forward(
    model, num_new_tokens: list[int], batch_size: int = 1, context_len: int = 128,
    num_repeats: int = 10, seed: int = 0,
) -> dict[int, float]:
    """Median seconds of one target forward over T new tokens per request, after a cached
    prefix of `context_len`, for each T in `num_new_tokens` (T = K + 1 is a verification of K
    drafts; T = 1 a plain decode step).  Each timing starts from the same cached prefix (the
    cache is rewound), so every T sees the same context.  A contiguous cache keeps the
    measurement about the model, not the engine's bookkeeping."""
    device = model.device
    gen = torch.Generator().manual_seed(seed)
    vocab = model.config.vocab_size
    max_new = max(num_new_tokens)
    cache = ContiguousKVCache(model.config, batch_size, context_len + max_new, model.dtype, device)
    prompt = torch.randint(vocab, (batch_size, context_len), generator=gen).to(device)  # (B, P)
    cache.begin_step(torch.ones(batch_size, context_len, dtype=torch.bool, device=device))
    model(prompt, torch.arange(context_len, device=device)[None].expand(batch_size, -1), cache)
    medians = {}
    for t in num_new_tokens:
        ids = torch.randint(vocab, (batch_size, t), generator=gen).to(device)  # (B, T)
        positions = torch.arange(context_len, context_len + t, device=device)[None].expand(batch_size, -1)
        times = []
        for _ in range(num_repeats + 1):  # the first is a warm-up
            cache.num_used_slots = context_len  # rewind: forget the previous timing's tokens
            _sync(device)
            start = time.perf_counter()
            cache.begin_step(torch.ones(batch_size, t, dtype=torch.bool, device=device))
            hidden = model(ids, positions, cache)  # (B, T, hidden)
            model.compute_logits(hidden)  # the verifier needs every row's logits
            _sync(device)
            times.append(time.perf_counter() - start)
        medians[t] = statistics.median(times[1:])
    return medians
