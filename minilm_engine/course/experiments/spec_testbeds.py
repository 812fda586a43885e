"""Chapter 05's testbeds, each where its effect is visible (`speculative.py` holds the shared
timers and the cost model).

Contract:
  - `acceptance_over_prompts(llm, prompts, params)`: one `SpecDecodingStats` per prompt (the
    engine's per-request counters), so an acceptance rate comes with an interval over prompts
    (`pooled_acceptance`: accepted / compared over all prompts, bootstrapped by prompt).
  - `engine_step_seconds(llm, prompts, params)`: seconds per engine step of a whole `generate`
    (scheduler, block tables, sampling included); `engine_round_seconds(runs)`: the same for the
    rounds of a speculating engine, per K; `engine_cost_model` fits the cost model to them.
  - `paired_generate(...)`: the same prompts through several engines, alternating, repeated:
    paired tokens/s ratios (the real-shaped target with the n-gram drafter, in the chapter).
  - figures: the verification cost per T, the acceptance per prompt, the predicted vs measured
    speed-up per K.

Why a bare-forward cost model over-predicts inside the engine: every engine step (a draft's or
the target's) pays fixed host work besides the forward (schedule, slot mapping, block tables,
sampling, rollback), and a draft step of a tiny model is mostly that work; fed with the engine's
own step costs, the same formula moves onto the measurement.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.core.spec_decode_stats import SpecDecodingStats
from minilm_engine.course.experiments.speculative import SpecCostModel, _sync
from minilm_engine.course.teaching.claims import Measurement
from minilm_engine.entrypoints.llm import LLM


def acceptance_over_prompts(llm: LLM, prompts: list, params: SamplingParams) -> list[SpecDecodingStats]:
    """Run `prompts` through a speculating `llm`; each prompt's own draft counters."""
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [o.metrics.spec_decoding for o in outputs if o.metrics.spec_decoding is not None]


def pooled_acceptance(per_prompt: list[SpecDecodingStats], label: str = "") -> Measurement:
    """alpha = accepted / compared over all prompts, in %, with a 95% bootstrap over prompts (a
    prompt's tokens are not independent draws: the prompt is the unit that is resampled)."""
    items = [(s.num_accepted_tokens, s.num_compared_tokens) for s in per_prompt if s.num_compared_tokens]
    return Measurement.bootstrap(
        items, lambda xs: 100 * sum(a for a, _ in xs) / sum(c for _, c in xs), unit="%", label=label)


def pooled_stats(per_prompt: list[SpecDecodingStats]) -> SpecDecodingStats:
    total = SpecDecodingStats(max(s.num_spec_tokens for s in per_prompt))
    for s in per_prompt:
        total.merge(s)
    return total


def engine_step_seconds(llm: LLM, prompts: list, params: SamplingParams, num_repeats: int = 3) -> float:
    """Median over repeats of (seconds of one `generate` over `prompts`) / (engine steps it took)."""
    llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    per_step = []
    for _ in range(num_repeats):
        steps = llm.engine.num_steps
        _sync(llm.device)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        _sync(llm.device)
        per_step.append((time.perf_counter() - start) / (llm.engine.num_steps - steps))
    return statistics.median(per_step)


@dataclass
class PairedRun:
    """Tokens/s of each engine, repeat by repeat (repeat i of every engine ran back to back)."""

    names: list[str]
    tokens_per_s: dict[str, list[float]]
    same_tokens: bool  # every engine produced the first engine's tokens
    stats: dict[str, SpecDecodingStats | None]
    num_steps: dict[str, int]  # engine steps of one pass

    def speedup(self, name: str, base: str | None = None, label: str = "") -> Measurement:
        base = base or self.names[0]
        return Measurement.ratio(self.tokens_per_s[name], self.tokens_per_s[base], label=label)


def paired_generate(engines: dict[str, LLM], prompts: list, params: SamplingParams, num_repeats: int = 3) -> PairedRun:
    """Each repeat runs `prompts` through every engine in turn (one at a time: batch 1)."""
    names = list(engines)
    for llm in engines.values():
        llm.generate(prompts[:1], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)  # warm-up
    rates: dict[str, list[float]] = {n: [] for n in names}
    tokens: dict[str, list] = {}
    stats: dict[str, SpecDecodingStats | None] = {}
    steps: dict[str, int] = {}
    for repeat in range(num_repeats):
        for name in names:
            llm = engines[name]
            before = llm.engine.num_steps
            outs, seconds = [], 0.0
            for prompt in prompts:
                _sync(llm.device)
                start = time.perf_counter()
                outs += llm.generate([prompt], params, use_tqdm=False)
                _sync(llm.device)
                seconds += time.perf_counter() - start
            rates[name].append(sum(len(o.outputs[0].token_ids) for o in outs) / seconds)
            if repeat == 0:
                tokens[name] = [o.outputs[0].token_ids for o in outs]
                steps[name] = llm.engine.num_steps - before
                per = [o.metrics.spec_decoding for o in outs if o.metrics.spec_decoding is not None]
                stats[name] = pooled_stats(per) if per else None
    same = all(tokens[n] == tokens[names[0]] for n in names)
    return PairedRun(names, rates, same, stats, steps)


def engine_round_seconds(runs, batch_size: int = 1) -> dict[int, float]:
    """K -> seconds per engine step (one round: K drafts and one verification) of
    `speculative.measure_speculation`'s runs: a median pass over its target forwards."""
    return {r.num_speculative_tokens: r.seconds / r.num_target_forwards
            for r in runs if r.batch_size == batch_size}


def engine_cost_model(bare: SpecCostModel, round_seconds: dict[int, float]) -> SpecCostModel:
    """The same formula fed with rounds as the engine pays them: a straight line over K through
    the measured round times (K = 0 is a plain decode step).  Its slope is what one more draft
    really costs in the engine (a draft step with its host work, plus a verified token); the
    bare model charges `bare.draft_step_s + bare.verify_per_token_s` for it."""
    import numpy as np

    ks = sorted(round_seconds)
    slope, intercept = np.polyfit(ks, [round_seconds[k] for k in ks], 1)
    return SpecCostModel(max(float(slope) - bare.verify_per_token_s, 0.0), float(intercept), bare.verify_per_token_s)


# -- figures (plotly is imported only here) ------------------------------------------------------


def verify_cost_figure(curves: dict[str, dict[int, Measurement]], title: str = ""):
    """Cost of one forward over T new tokens / a one-token step, per T, one line per model, with
    the line 'T tokens cost T steps' (nothing shared) for scale."""
    import plotly.graph_objects as go

    fig = go.Figure()
    all_t = sorted({t for c in curves.values() for t in c})
    for name, curve in curves.items():
        ts = sorted(curve)
        fig.add_trace(go.Scatter(
            x=ts, y=[curve[t].value for t in ts], mode="lines+markers", name=name,
            error_y=dict(type="data", symmetric=False, array=[curve[t].high - curve[t].value for t in ts],
                         arrayminus=[curve[t].value - curve[t].low for t in ts])))
    fig.add_trace(go.Scatter(x=all_t, y=all_t, mode="lines", line=dict(dash="dot", color="#888"),
                             name="T tokens cost T steps (no sharing)"))
    fig.update_layout(title=title or "What a verification costs", height=400,
                      xaxis_title="tokens scored in one forward, T = K + 1",
                      yaxis_title="time / one-token step (x)", legend=dict(x=0.01, y=0.99))
    return fig


def acceptance_figure(per_prompt: dict[str, list[SpecDecodingStats]], title: str = ""):
    """Histogram of each prompt's acceptance rate, one colour per drafter, on one axis."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for name, stats in per_prompt.items():
        rates = [100 * s.alpha for s in stats if s.num_compared_tokens]
        fig.add_trace(go.Histogram(x=rates, name=f"{name} ({len(rates)} prompts)", opacity=0.65,
                                   xbins=dict(start=0, end=100.01, size=5)))
    fig.update_layout(barmode="overlay", title=title or "Acceptance rate per prompt", height=380,
                      xaxis_title="drafts accepted of those compared, per prompt (%)",
                      yaxis_title="prompts", xaxis=dict(range=[0, 101]))
    return fig


def speedup_vs_model_figure(measured: dict[int, Measurement], models: dict[str, dict[int, float]], title: str = ""):
    """Measured speed-up per K (median, 95% interval) beside cost-model predictions."""
    import plotly.graph_objects as go

    ks = sorted(measured)
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=ks, y=[measured[k].value for k in ks], mode="markers", marker=dict(size=10), name="measured (engine)",
        error_y=dict(type="data", symmetric=False, array=[measured[k].high - measured[k].value for k in ks],
                     arrayminus=[measured[k].value - measured[k].low for k in ks])))
    for name, pred in models.items():
        fig.add_trace(go.Scatter(x=ks, y=[pred[k] for k in ks], mode="lines+markers", name=name,
                                 line=dict(dash="dash")))
    fig.add_hline(y=1.0, line=dict(color="#888", width=1))
    fig.update_layout(title=title or "Speed-up per K: measured vs the cost model", height=400,
                      xaxis_title="K (drafted tokens per round)",
                      yaxis_title="output tokens/s vs no speculation (x)", legend=dict(x=0.01, y=0.99))
    return fig
