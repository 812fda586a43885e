"""Chapter 05's measurements: what speculative decoding buys, per K and per batch size.

Contract: `measure_speculation(...)` runs the same greedy requests through the continuous
engine without speculation and with K = 1, 2, ... drafted tokens per step, and returns one
`SpecRun` per (K, batch size): output tokens/s, whether the tokens equal the run without
speculation, and the draft's acceptance counters.  `tokens_per_forward_table` puts the measured
tokens per target forward next to the formula (1 - alpha^(K+1)) / (1 - alpha) evaluated at the
measured alpha.  Timings are wall-clock on whatever machine runs them: paired repeats
(`paired_speedups`), the same prompts at every batch size.

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

from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.baselines.contiguous_cache import ContiguousKVCache, forward_rows
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.spec_decode_stats import SpecDecodingStats, expected_tokens_per_round


@dataclass
class SpecRun:
    num_speculative_tokens: int  # 0: speculation off
    batch_size: int
    num_output_tokens: int  # of one pass over the prompts
    seconds: float  # one pass over the prompts: the median over repeats
    same_tokens: bool  # token for token what the run without speculation produced
    stats: SpecDecodingStats | None  # None without speculation (counters of one pass)
    num_target_forwards: int  # engine steps of one pass (each one forward of the target)
    # Every timed unit (one batch of one repeat), in the order run: the same order for every K of
    # a batch size, so unit i of K and unit i of K = 0 ran back to back (a paired comparison).
    unit_seconds: tuple[float, ...] = ()
    unit_tokens: tuple[int, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.num_output_tokens / self.seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_batch(llm: LLM, batch: list[str], params: SamplingParams):
    """One timed batch: (outputs, seconds, target forwards)."""
    steps_before = llm.engine.num_steps
    _sync(llm.device)
    start = time.perf_counter()
    outputs = llm.generate(batch, params, use_tqdm=False)
    _sync(llm.device)
    return outputs, time.perf_counter() - start, llm.engine.num_steps - steps_before


def measure_speculation(
    target: str = "noodle-chef",
    draft: str = "noodle-apprentice",
    num_speculative_tokens: tuple[int, ...] = (1, 2, 3, 4, 5, 6),
    batch_sizes: tuple[int, ...] = (1,),
    max_tokens: int = 128,
    num_prompts: int | None = None,
    num_repeats: int = 5,
    min_pairs: int = 5,
    device: str | None = None,
    seed: int = 0,
    dtype: str = "auto",
) -> list[SpecRun]:
    """For each batch size: the run without speculation (K = 0), then each K.

    Requests are greedy noodle-shop prompts (`sample_prompts`), ending at EOS or `max_tokens`.
    `dtype` is the engines' (a GPU's default is bf16, where a verification pass and a decode step
    round differently, so a near tie can go either way; float32 is the exactness check there).
    Every batch size runs **the same** `num_prompts` prompts (default: the largest batch size),
    cut into batches of B that run one after the other; so a change across batch sizes is the
    batch, not a different draft acceptance on different text.  Each K has its own engine.
    Timing is paired: every batch runs with each K in turn, back to back, and the whole pass is
    repeated `num_repeats` times, or more until every batch size has `min_pairs` timed batches
    (a batch of all the prompts is one unit, so it is repeated); `paired_speedups` divides unit
    by unit, so a burst of load on a shared machine hits both sides of a ratio.
    """
    import math

    runs: list[SpecRun] = []
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    ks = (0, *num_speculative_tokens)
    prompts = sample_prompts(num_prompts or max(batch_sizes), seed=seed)
    for batch_size in batch_sizes:
        batches = [prompts[i : i + batch_size] for i in range(0, len(prompts), batch_size)]
        engines = {}
        for k in ks:
            spec = {"model": draft, "num_speculative_tokens": k} if k else None
            engines[k] = LLM(target, device=device, dtype=dtype, max_num_seqs=batch_size, record_trace=False,
                             speculative_config=spec)
            engines[k].generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
        repeats = max(num_repeats, math.ceil(min_pairs / len(batches)))
        passes: dict[int, list[list[tuple]]] = {k: [] for k in ks}  # per K: per repeat, per batch
        for _ in range(repeats):
            for k in ks:
                passes[k].append([])
            for batch in batches:
                for k in ks:
                    passes[k][-1].append(_timed_batch(engines[k], batch, params))
        baseline_tokens = [o.outputs[0].token_ids for unit in passes[0][0] for o in unit[0]]
        for k in ks:
            first = passes[k][0]
            outputs = [o for unit in first for o in unit[0]]
            tokens = [o.outputs[0].token_ids for o in outputs]
            units = [unit for one_pass in passes[k] for unit in one_pass]
            stats = _stats_of(outputs, k) if k else None  # one pass (every pass drafts the same)
            runs.append(SpecRun(
                k, batch_size, sum(len(t) for t in tokens),
                statistics.median(sum(u[1] for u in one_pass) for one_pass in passes[k]),
                tokens == baseline_tokens, stats, sum(u[2] for u in first),
                tuple(u[1] for u in units),
                tuple(sum(len(o.outputs[0].token_ids) for o in u[0]) for u in units)))
    return runs


def paired_speedups(runs: list[SpecRun], batch_size: int, num_speculative_tokens: int) -> list[float]:
    """Tokens/s with K drafts over tokens/s without, timed batch by timed batch (each pair ran
    back to back): the samples a median and an interval are made of."""
    base, = (r for r in runs if r.batch_size == batch_size and r.num_speculative_tokens == 0)
    run, = (r for r in runs if r.batch_size == batch_size and r.num_speculative_tokens == num_speculative_tokens)
    return [(nt / st) / (bt / bs) for nt, st, bt, bs in
            zip(run.unit_tokens, run.unit_seconds, base.unit_tokens, base.unit_seconds, strict=True)]


def _stats_of(outputs, k: int) -> SpecDecodingStats:
    total = SpecDecodingStats(k)
    for out in outputs:
        if out.metrics.spec_decoding is not None:
            total.merge(out.metrics.spec_decoding)
    return total


def speedup_table(runs: list[SpecRun]) -> list[dict]:
    """One row per run: tokens/s (of the median pass) and the speed-up over the same batch size
    without speculation: the median of `paired_speedups` (the samples behind an interval), or
    the ratio of the passes' tokens/s for a run without timed units."""
    base = {r.batch_size: r for r in runs if r.num_speculative_tokens == 0}
    rows = []
    for r in runs:
        b = base[r.batch_size]
        paired = r.unit_seconds and len(r.unit_seconds) == len(b.unit_seconds)
        rows.append({
            "batch_size": r.batch_size,
            "K": r.num_speculative_tokens,
            "tokens_per_s": r.tokens_per_s,
            "speedup": (statistics.median(paired_speedups(runs, r.batch_size, r.num_speculative_tokens))
                        if paired else r.tokens_per_s / b.tokens_per_s),
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
def time_verify_forward_repeats(
    model, num_new_tokens: list[int], batch_size: int = 1, context_len: int = 128,
    num_repeats: int = 10, seed: int = 0,
) -> dict[int, list[float]]:
    """Seconds of every repeat of one target forward over T new tokens per request, after a cached
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
    prompt_positions = torch.arange(context_len, device=device)[None].expand(batch_size, -1)
    forward_rows(model, prompt, prompt_positions, cache)
    inputs = {}
    for t in num_new_tokens:
        ids = torch.randint(vocab, (batch_size, t), generator=gen).to(device)  # (B, T)
        positions = torch.arange(context_len, context_len + t, device=device)[None].expand(batch_size, -1)
        inputs[t] = ids, positions
    times: dict[int, list[float]] = {t: [] for t in num_new_tokens}
    # Repeats outermost: repeat i of every T runs close in time, so T's time over T = 1's, repeat
    # by repeat, is a paired ratio that a burst of load on a shared machine hits on both sides.
    for repeat in range(num_repeats + 1):  # the first round is a warm-up
        for t in num_new_tokens:
            ids, positions = inputs[t]
            cache.num_used_slots = context_len  # rewind: forget the previous timing's tokens
            _sync(device)
            start = time.perf_counter()
            cache.begin_step(torch.ones(batch_size, t, dtype=torch.bool, device=device))
            hidden = forward_rows(model, ids, positions, cache)  # (B, T, hidden)
            model.compute_logits(hidden)  # the verifier needs every row's logits
            _sync(device)
            if repeat:
                times[t].append(time.perf_counter() - start)
    return times


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
    return {t: statistics.median(ts) for t, ts in time_verify_forward_repeats(
        model, num_new_tokens, batch_size, context_len, num_repeats, seed).items()}


# -- figures (plotly is imported only here) ------------------------------------------------------


def speedup_figure(runs: list[SpecRun], title: str = ""):
    """Left: speedup vs K for each batch size.  Right: speedup vs batch size at each K."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    rows = speedup_table(runs)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("speedup vs K", "speedup vs batch size"))
    for batch_size in sorted({r["batch_size"] for r in rows}):
        mine = [r for r in rows if r["batch_size"] == batch_size]
        fig.add_trace(go.Scatter(x=[r["K"] for r in mine], y=[r["speedup"] for r in mine], mode="lines+markers",
                                 name=f"batch {batch_size}"), 1, 1)
    for k in sorted({r["K"] for r in rows if r["K"]}):
        mine = [r for r in rows if r["K"] == k]
        if len(mine) > 1:
            fig.add_trace(go.Scatter(x=[r["batch_size"] for r in mine], y=[r["speedup"] for r in mine],
                                     mode="lines+markers", name=f"K = {k}", line=dict(dash="dot")), 1, 2)
    for col in (1, 2):
        fig.add_hline(y=1.0, line=dict(color="#888", width=1), row=1, col=col)
    fig.update_xaxes(title_text="K (drafted tokens per step)", row=1, col=1)
    fig.update_xaxes(title_text="batch size", type="log", row=1, col=2)
    fig.update_yaxes(title_text="output tokens/s vs no speculation", row=1, col=1)
    fig.update_layout(title=title or "What speculation buys", height=380, margin=dict(t=80))
    return fig


def tokens_per_round_figure(runs: list[SpecRun], title: str = ""):
    """Measured tokens per verification round against the formula at the measured alpha, by K."""
    import plotly.graph_objects as go

    rows = [r for r in tokens_per_forward_table(runs) if r["batch_size"] == min(x.batch_size for x in runs)]
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[r["K"] for r in rows], y=[r["measured_tokens_per_round"] for r in rows],
                             mode="markers", marker=dict(size=10), name="measured"))
    fig.add_trace(go.Scatter(x=[r["K"] for r in rows], y=[r["formula_tokens_per_round"] for r in rows],
                             mode="lines+markers", name="(1 - a^(K+1)) / (1 - a), a measured"))
    fig.add_trace(go.Scatter(x=[r["K"] for r in rows], y=[r["K"] + 1 for r in rows], mode="lines",
                             line=dict(dash="dot", color="#888"), name="K + 1 (every draft accepted)"))
    fig.update_layout(title=title or "Tokens per target forward", xaxis_title="K", yaxis_title="tokens per round",
                      height=360)
    return fig


# -- the sampled distribution, against the target's own -------------------------------------------


@torch.inference_mode()
def target_distribution(model, prompt_ids: list[int], params: SamplingParams, num_tokens: int) -> dict[tuple[int, ...], float]:
    """P(first `num_tokens` output tokens) under the target alone, computed exactly from its
    logits with the sampler's processing (temperature, top-k, top-p).  Use a top-k: the number
    of outcomes is (kept tokens) ** num_tokens."""
    from minilm_engine.course.baselines.contiguous_cache import NoKVCache
    from minilm_engine.worker.sampler import sampling_probs

    dist: dict[tuple[int, ...], float] = {(): 1.0}
    for _ in range(num_tokens):
        grown = {}
        for prefix, prob in dist.items():
            ids = torch.tensor(prompt_ids + list(prefix), device=model.device)  # (T,)
            positions = torch.arange(len(ids), device=model.device)
            valid = torch.ones(1, len(ids), dtype=torch.bool)  # one row of T
            hidden = model(ids, positions, NoKVCache(valid))  # (T, hidden)
            probs = sampling_probs(model.compute_logits(hidden[-1]), params).cpu()  # (V,)
            for token in (probs > 0).nonzero().flatten().tolist():
                grown[prefix + (token,)] = prob * probs[token].item()
        dist = grown
    return dist


@dataclass
class DistributionCheck:
    num_samples: int
    num_outcomes: int  # outcomes the target can produce
    num_outside: int  # samples the target could not have produced (must be 0)
    p_value: float  # chi-square of the sampled outcomes against the target's probabilities
    draft_acceptance_rate: float | None  # None: no draft was verified (no speculation)


def check_sampled_distribution(
    llm: LLM, prompt_ids: list[int], params: SamplingParams, num_samples: int
) -> DistributionCheck:
    """Sample `num_samples` seeded requests of `params.max_tokens` tokens with `llm` (typically
    speculating) and compare their outcomes with `target_distribution` (chi-square)."""
    from dataclasses import replace

    from scipy.stats import chisquare

    all_params = [replace(params, seed=seed) for seed in range(num_samples)]
    outputs = llm.generate([{"prompt_token_ids": prompt_ids}] * num_samples, all_params, use_tqdm=False)
    seen: dict[tuple[int, ...], int] = {}
    for out in outputs:
        key = tuple(out.outputs[0].token_ids)
        seen[key] = seen.get(key, 0) + 1
    exact = target_distribution(llm.model, prompt_ids, params, params.max_tokens)
    keys = sorted(exact)
    total = sum(exact.values())  # 1 up to rounding
    p_value = chisquare([seen.get(k, 0) for k in keys], [exact[k] / total * num_samples for k in keys]).pvalue
    rate = None
    if llm.engine.spec_decoding_stats is not None:
        rate = _stats_of(outputs, llm.engine.spec_decoding_stats.num_spec_tokens).draft_acceptance_rate
    return DistributionCheck(num_samples, len(keys), sum(n for k, n in seen.items() if k not in exact),
                             float(p_value), rate)


# -- choosing K: a cost model from two measurements --------------------------------------------


@dataclass
class SpecCostModel:
    """Time of a round of K drafts: K draft steps plus one target forward over K + 1 tokens, the
    latter a straight line fitted to `time_verify_forward`'s timings (they are noisy point by
    point; the line is what the choice of K should rest on).

        speedup(alpha, K) = decode_step_s * E[tokens per round](alpha, K) / round_s(K)
    """

    draft_step_s: float
    decode_step_s: float  # the target's forward over 1 token (fitted, T = 1)
    verify_per_token_s: float  # each extra token of a verification

    @classmethod
    def fit(cls, draft_step_s: float, verify_times: dict[int, float]) -> SpecCostModel:
        """verify_times: {T: seconds of one target forward over T new tokens} (T = 1 included)."""
        import numpy as np

        num_tokens = sorted(verify_times)
        slope, intercept = np.polyfit(num_tokens, [verify_times[t] for t in num_tokens], 1)
        slope = max(float(slope), 0.0)  # noise must not make extra tokens free-er than free
        return cls(draft_step_s, float(intercept) + slope, slope)

    def round_s(self, num_speculative_tokens: int) -> float:
        k = num_speculative_tokens
        return k * self.draft_step_s + self.decode_step_s + k * self.verify_per_token_s

    def speedup(self, alpha: float, num_speculative_tokens: int) -> float:
        k = num_speculative_tokens
        return self.decode_step_s * expected_tokens_per_round(alpha, k) / self.round_s(k)

    def best_k(self, alpha: float, max_k: int = 10) -> int:
        return max(range(1, max_k + 1), key=lambda k: self.speedup(alpha, k))
