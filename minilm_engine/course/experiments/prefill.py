"""Chapter 04's measurements: what a prefill costs as the prompt grows, and what one long prefill
does to the requests that are streaming next to it.

Contract: `time_prefill` and `long_prompt_interference` drive a real continuous engine
(`llm.engine`) with `add_request` / `step` and read `engine.trace`; the cost model
(`prefill_flops`, `attention_crossover_tokens`) needs only the model's config.

Cost of a prefill of T tokens, as this engine computes it:

    linear part     2 * P * T            P = weights every token multiplies (q/k/v/o, MLP);
                                         the LM head runs on the last token only
    attention part  4 * L * H * D * T^2  per layer and head: Q K^T (2 T^2 D) and probs V (2 T^2 D);
                                         the reference attention computes the whole T x T
                                         square and masks it (a causal kernel would do half)

    they are equal at  T* = P / (2 * L * H * D)      (for a standard layout, about 6 x hidden_size)

A causal kernel (FlashAttention, what production engines run) skips the masked half of the
square: attention costs 2 * L * H * D * T^2 and T* doubles to P / (L * H * D), about
12 x hidden_size.  `causal=True` gives those numbers; the default is what this engine computes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from minilm_engine.course.noodle_corpus import generate_documents
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.model.config import ModelConfig
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.step_table import steps_dataframe

# -- the cost model -----------------------------------------------------------------------------


def matmul_parameters(config: ModelConfig) -> int:
    """Weights each prompt token is multiplied by: every layer's q/k/v/o projections and MLP.

    Embeddings are a lookup (no multiply), and the engine applies the LM head only to the last
    token of a prompt, so neither is counted (nor the tiny norm weights).
    """
    h, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    attention = h * q + 2 * h * kv + q * h  # q_proj, k_proj + v_proj, o_proj
    mlp = 3 * h * config.intermediate_size  # gate_proj, up_proj, down_proj
    return config.num_hidden_layers * (attention + mlp)


@dataclass(frozen=True)
class PrefillFlops:
    num_tokens: int
    linear: float  # 2 * P * T
    attention: float  # 4 * L * H * D * T^2

    @property
    def total(self) -> float:
        return self.linear + self.attention

    @property
    def attention_fraction(self) -> float:
        return self.attention / self.total


def prefill_flops(config: ModelConfig, num_tokens: int, causal: bool = False) -> PrefillFlops:
    """Floating-point operations of one prefill of `num_tokens` tokens (module docstring);
    `causal=True` counts only the unmasked half of the score square, as a causal kernel does."""
    linear = 2 * matmul_parameters(config) * num_tokens
    per_token_pair = (2 if causal else 4) * config.num_hidden_layers * config.num_attention_heads * config.head_dim
    return PrefillFlops(num_tokens, float(linear), float(per_token_pair * num_tokens**2))


def attention_crossover_tokens(config: ModelConfig, causal: bool = False) -> float:
    """Prompt length at which the attention FLOPs equal the linear FLOPs (twice as long with a
    causal kernel, which computes half the score square)."""
    per_head_dim = (1 if causal else 2) * config.num_hidden_layers * config.num_attention_heads * config.head_dim
    return matmul_parameters(config) / per_head_dim


# -- measuring a prefill ----------------------------------------------------------------------


def corpus_token_ids(tokenizer, num_tokens: int, seed: int = 0) -> list[int]:
    """`num_tokens` token ids of real noodle-shop text (documents, tokenized one by one)."""
    num_documents = 16
    while num_documents <= 1 << 14:
        ids: list[int] = []
        for document in generate_documents(num_documents, seed):
            ids += tokenizer.encode(document, add_special_tokens=False)
            if len(ids) >= num_tokens:
                return ids[:num_tokens]
        num_documents *= 4
    raise ValueError(f"could not build a prompt of {num_tokens} tokens from the corpus")


def time_prefill(llm: LLM, lengths: Sequence[int], num_repeats: int = 3, seed: int = 0):
    """Wall time of one engine step that prefills a single prompt of each length.

    Each measurement adds one request (max_tokens=1) to an idle engine and times the step that
    computes its whole prompt and samples its token (`engine.trace`).  Lengths are visited in
    rounds, so a burst of noise from other programs hits all lengths alike; the prefix cache is
    emptied before each, so nothing is reused.  Returns a DataFrame with one row per
    measurement: num_tokens, repeat, seconds.
    """
    import pandas as pd

    engine = llm.engine
    if engine.has_unfinished_requests():
        raise ValueError("the engine must be idle: finish or abort its requests first")
    budget = engine.config.max_num_batched_tokens
    too_long = [n for n in lengths if n > budget or n >= llm.max_model_len]
    if too_long:
        raise ValueError(
            f"lengths {too_long} do not fit one step: max_num_batched_tokens is "
            f"{engine.config.max_num_batched_tokens}, max_model_len {llm.max_model_len}"
        )
    ids = corpus_token_ids(llm.tokenizer, max(lengths), seed)
    params = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    rows = []
    for repeat in range(num_repeats):
        for n in lengths:
            engine.block_pool.reset_prefix_cache()
            request_id = f"prefill-{engine.num_steps}-{n}"
            engine.add_request(request_id, {"prompt_token_ids": ids[:n]}, params)
            engine.step()
            record = engine.trace.records[-1]
            assert record.num_prefill_tokens == n and not engine.has_unfinished_requests()
            rows.append({"num_tokens": n, "repeat": repeat, "seconds": record.duration_s})
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class PrefillFit:
    """seconds ~ fixed + linear * T + quadratic * T^2, fitted by least squares."""

    fixed: float
    linear: float
    quadratic: float

    def predict(self, num_tokens):
        return self.fixed + self.linear * num_tokens + self.quadratic * num_tokens**2

    def quadratic_fraction(self, num_tokens) -> float:
        """Share of the T-dependent time that is the T^2 term."""
        lin, quad = self.linear * num_tokens, self.quadratic * num_tokens**2
        return quad / (lin + quad) if lin + quad > 0 else 0.0

    @property
    def crossover_tokens(self) -> float | None:
        """T at which the fitted T^2 term equals the T term: 0.0 if there is no linear term
        (T^2 dominates everywhere), None if there is no T^2 term (it never catches up)."""
        if self.quadratic <= 0:
            return None
        return self.linear / self.quadratic


def fit_prefill_cost(num_tokens: Sequence[float], seconds: Sequence[float]) -> PrefillFit:
    """Least-squares fit of seconds = a + b T + c T^2 with a, b, c >= 0, weighted by 1/seconds
    so that the short prompts (milliseconds) count as much as the long ones.

    Timing noise can make a plain fit return a negative term, which means nothing physically;
    with three coefficients we can afford the exact non-negative fit: try every subset of the
    terms and keep the best fit whose coefficients are all >= 0.
    """
    import itertools

    import numpy as np

    t = np.asarray(num_tokens, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if t.shape != y.shape or len(t) < 3 or (y <= 0).any():
        raise ValueError("need at least 3 (num_tokens, seconds > 0) pairs of equal length")
    columns = np.stack([np.ones_like(t), t, t**2], axis=1) / y[:, None]  # weighted design
    target = np.ones_like(y)
    best, best_residual = np.zeros(3), np.inf
    for size in (1, 2, 3):
        for terms in itertools.combinations(range(3), size):
            coef, *_ = np.linalg.lstsq(columns[:, terms], target, rcond=None)
            if (coef < 0).any():
                continue
            residual = float(np.sum((columns[:, terms] @ coef - target) ** 2))
            if residual < best_residual:
                best, best_residual = np.zeros(3), residual
                best[list(terms)] = coef
    return PrefillFit(*(float(x) for x in best))


def prefill_cost_figure(
    num_tokens: Sequence[int], seconds: Sequence[float], fit: PrefillFit, config: ModelConfig
):
    """Left: measured prefill time with the fit and its linear part.  Right: the share of the
    time the T^2 term takes (measured fit) next to the share of the FLOPs attention takes."""
    import numpy as np
    from plotly.subplots import make_subplots

    grid = np.linspace(1, max(num_tokens), 200)
    flops = [prefill_flops(config, int(t)).attention_fraction for t in grid]
    fig = make_subplots(
        rows=1, cols=2, horizontal_spacing=0.12,
        subplot_titles=("one prefill step: wall time", "share of the cost that grows as T²"),
    )
    fig.add_scatter(x=list(num_tokens), y=[1e3 * s for s in seconds], mode="markers",
                    name="measured (best of repeats)", marker=dict(size=8, color="black"),
                    row=1, col=1)
    fig.add_scatter(x=grid, y=1e3 * fit.predict(grid), mode="lines", name="fit a + bT + cT²",
                    line=dict(color="#636EFA"), row=1, col=1)
    fig.add_scatter(x=grid, y=1e3 * (fit.fixed + fit.linear * grid), mode="lines",
                    name="its linear part a + bT", line=dict(color="#636EFA", dash="dot"),
                    row=1, col=1)
    fig.add_scatter(x=grid, y=[fit.quadratic_fraction(t) for t in grid], mode="lines",
                    name="measured: cT² / (bT + cT²)", line=dict(color="#636EFA"), row=1, col=2)
    fig.add_scatter(x=grid, y=flops, mode="lines", name="FLOPs: attention / (attention + linear)",
                    line=dict(color="#EF553B"), row=1, col=2)
    fig.add_hline(y=0.5, line=dict(color="gray", dash="dash"), row=1, col=2)
    fig.update_xaxes(title_text="prompt tokens T", rangemode="tozero")
    fig.update_yaxes(title_text="ms", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="share", range=[0, 1], row=1, col=2)
    fig.update_layout(height=420, legend=dict(orientation="h", y=-0.2), margin=dict(t=60, b=40))
    return fig


# -- a long prompt arrives while others stream -----------------------------------------------


@dataclass
class InterferenceResult:
    """What the streaming requests saw when a long prompt joined their batch.

    `itl`: one row per streamed token after the first: request_id, time_s (when the token came,
    seconds after the long prompt arrived, negative before), itl_s (gap to the previous token).
    `steps`: the run's rows of `steps_dataframe(engine.trace)`, with time_s added likewise.
    """

    label: str
    steps: object  # pandas.DataFrame
    itl: object  # pandas.DataFrame
    baseline_itl_s: float  # median gap of the tokens that came before the long prompt arrived
    worst_itl_s: float  # the longest gap after it arrived
    long_ttft_s: float  # the long prompt's own time to first token
    num_long_prompt_tokens: int

    @property
    def stall_ratio(self) -> float:
        """How many typical inter-token gaps the worst gap lasted."""
        return self.worst_itl_s / self.baseline_itl_s


def long_prompt_interference(
    llm: LLM,
    stream_prompts: Sequence[str],
    long_prompt_ids: Sequence[int],
    num_stream_tokens: int,
    inject_after_steps: int,
    long_max_tokens: int = 4,
    label: str = "",
) -> InterferenceResult:
    """Start `stream_prompts` (each generating `num_stream_tokens`), step the engine
    `inject_after_steps` times, add one long prompt, and step until all requests are done.

    Every request is greedy with ignore_eos, so both configurations run the same tokens.
    The prefix cache is emptied first, so a repeated run measures the same work.
    """
    import pandas as pd

    engine = llm.engine
    if engine.has_unfinished_requests():
        raise ValueError("the engine must be idle: finish or abort its requests first")
    if inject_after_steps >= num_stream_tokens:
        raise ValueError(
            f"inject_after_steps ({inject_after_steps}) must be < num_stream_tokens "
            f"({num_stream_tokens}), or the streams are over before the long prompt comes"
        )
    engine.block_pool.reset_prefix_cache()
    run = f"run{engine.num_steps}"
    first_record = len(engine.trace.records)
    stream = SamplingParams(temperature=0, max_tokens=num_stream_tokens, ignore_eos=True)
    streams = [engine.add_request(f"{run}-s{i}", p, stream) for i, p in enumerate(stream_prompts)]
    for _ in range(inject_after_steps):
        engine.step()
    inject_time = time.perf_counter()
    long = engine.add_request(
        f"{run}-long",
        {"prompt_token_ids": list(long_prompt_ids)},
        SamplingParams(temperature=0, max_tokens=long_max_tokens, ignore_eos=True),
    )
    while engine.has_unfinished_requests():
        engine.step()

    rows = []
    for r in streams:
        times = r.metrics.token_times
        for prev, now in zip(times, times[1:]):
            rows.append(
                {"request_id": r.request_id, "time_s": now - inject_time, "itl_s": now - prev}
            )
    itl = pd.DataFrame(rows)
    steps = steps_dataframe(engine.trace).iloc[first_record:].reset_index(drop=True)
    steps["time_s"] = steps["start_time"] + steps["duration_s"] - inject_time
    before = itl[itl["time_s"] < 0]["itl_s"]
    after = itl[itl["time_s"] >= 0]["itl_s"]
    return InterferenceResult(
        label=label,
        steps=steps,
        itl=itl,
        baseline_itl_s=float(before.median()) if len(before) else math.nan,
        worst_itl_s=float(after.max()) if len(after) else math.nan,
        long_ttft_s=long.metrics.ttft,
        num_long_prompt_tokens=long.num_prompt_tokens,
    )


def itl_figure(results: Sequence[InterferenceResult]):
    """Inter-token latency of the streaming requests over time, one panel per configuration, every
    panel with its own x label and the same x and y ranges (so the stalls compare by eye)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=len(results), cols=1, vertical_spacing=0.2,
        subplot_titles=[
            f"{r.label}: worst gap {1e3 * r.worst_itl_s:.0f} ms = {r.stall_ratio:.1f}x the "
            f"typical {1e3 * r.baseline_itl_s:.0f} ms" for r in results
        ],
    )
    x_low = min(float((r.itl["time_s"] - r.itl["itl_s"]).min()) for r in results)
    x_high = max(float(r.itl["time_s"].max()) for r in results)
    y_high = 1.1e3 * max(float(r.itl["itl_s"].max()) for r in results)
    for row, r in enumerate(results, 1):
        for request_id, group in r.itl.groupby("request_id", sort=False):
            # Each gap is drawn as a segment as long as it lasted, at the height of its length.
            x, y = [], []
            for t, gap in zip(group["time_s"], group["itl_s"]):
                x += [t - gap, t, None]
                y += [1e3 * gap, 1e3 * gap, None]
            fig.add_trace(
                go.Scatter(
                    x=x, y=y, mode="lines", line=dict(width=2), name=request_id, showlegend=False,
                    hovertemplate=f"{request_id}: a %{{y:.1f}} ms gap<extra></extra>",
                ),
                row, 1,
            )
        fig.add_vline(x=0, line=dict(color="#CF222E", dash="dash"), row=row, col=1)
        fig.update_yaxes(title_text="gap between tokens (ms)", range=[0, y_high], row=row, col=1)
        fig.update_xaxes(title_text="seconds after the long prompt arrived (red dashed line)",
                         range=[x_low, x_high], row=row, col=1)
    fig.update_layout(
        title="Inter-token latency of the streams: each segment is one wait between two tokens, one colour a stream",
        height=300 * len(results) + 80, plot_bgcolor="white", margin=dict(l=70, r=20, t=90, b=50),
    )
    return fig


# -- the trade-off: one chunked-prefill budget against another ----------------------------------


def budget_sweep(
    model: str,
    budgets: Sequence[int],
    stream_prompts: Sequence[str],
    long_prompt_ids: Sequence[int],
    num_stream_tokens: int,
    inject_after_steps: int,
    num_rounds: int = 1,
    device: str | None = None,
) -> list[dict]:
    """`long_prompt_interference` with chunked prefill on, once per token budget
    (`max_num_batched_tokens`), each on its own engine: the streams keep decoding while the long
    prompt is prefilled in chunks of what their decode tokens leave of the budget.

    One row per budget, read from the requests' own metrics (`RequestMetrics.token_times`, ttft):
    `p99_itl_s` and `mean_itl_s` over every gap the streams saw from the long prompt's arrival
    until they finished, and `long_ttft_s`, the long prompt's time to first token.  The budgets
    take turns, `num_rounds` times, and each row keeps the median over its rounds, so a burst of
    load on a shared machine hits every budget alike.  Rows are plain dicts (the judgment
    exercise's `sweep` format, `course/teaching/judgment_tradeoff.py`).
    """
    import statistics

    import numpy as np

    if not budgets or min(budgets) < 1:
        raise ValueError(f"budgets must be positive token counts, got {list(budgets)}")
    engines = {}
    for b in budgets:
        engines[b] = LLM(model, device=device, max_model_len=1024, enable_prefix_caching=False,
                         num_kv_blocks=256, enable_chunked_prefill=True, max_num_batched_tokens=b,
                         max_num_seqs=len(stream_prompts) + 1)
        engines[b].generate(list(stream_prompts[:2]), SamplingParams(max_tokens=4), use_tqdm=False)  # warm up
    seen: dict[int, list[tuple[float, float, float]]] = {b: [] for b in budgets}
    for _ in range(num_rounds):
        for b in budgets:
            engines[b].engine.trace.clear()
            r = long_prompt_interference(engines[b], stream_prompts, long_prompt_ids, num_stream_tokens,
                                         inject_after_steps, label=f"budget {b}")
            gaps = r.itl[r.itl["time_s"] >= 0]["itl_s"].to_numpy()
            seen[b].append((float(np.percentile(gaps, 99)), float(gaps.mean()), r.long_ttft_s))
    return [{"max_num_batched_tokens": b,
             "p99_itl_s": statistics.median(p for p, _, _ in seen[b]),
             "mean_itl_s": statistics.median(m for _, m, _ in seen[b]),
             "long_ttft_s": statistics.median(t for _, _, t in seen[b])} for b in budgets]
