"""Chapter 01's lesson where it is visible: one decode step against the batch size, on a
real-shaped model, drawn over this machine's roofline, beside a GPU's roofline (modelled from
its datasheet) and a published GPU measurement.

Contract: `sweep(model, batch_sizes)` measures this machine's two ceilings
(`roofline.measure_roofline`) and times the model's decode steps in alternating rounds
(`roofline.time_steps`), returning a `DecodeRoofline`; `step_figure` draws the measured steps
over that roofline; `gpu_figure` puts this machine and a GPU on one scale (the step relative to
batch 1) and sets each machine's batch-1 step against its own weight-read floor, this one
measured, the GPU's published (`GPT_FAST_A100`).  Everything modelled says so in its label.

    roofline(B) = max(weight bytes / read bandwidth,  2 * matmul params * B / FLOP/s)
    B*          = the batch where the two meet: below it a step is a read of the weights
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from minilm_engine.course.experiments.roofline import (
    DATASHEETS,
    Datasheet,
    Roofline,
    StepCost,
    StepTimes,
    measure_roofline,
    step_cost,
    time_steps,
)
from minilm_engine.model.config import ModelConfig

# A100 SXM 80GB, dense bf16 tensor-core peak and HBM2e bandwidth: the card gpt-fast measured on.
A100 = Datasheet("A100 SXM 80GB (bf16)", Roofline(read_bandwidth=2.039e12, matmul_flops=312e12),
                 "NVIDIA A100 Tensor Core GPU datasheet, 2021")


@dataclass(frozen=True)
class PublishedStep:
    """A decode step someone measured on a GPU and published, with where and when."""

    model: str  # a `known_configs` id
    device: Datasheet
    batch_size: int
    tokens_per_s: float
    source: str

    @property
    def step_s(self) -> float:
        return self.batch_size / self.tokens_per_s


# gpt-fast's README: Llama-2-7B, bf16, batch size 1, torch.compile, on an A100-80GB power-limited
# to 330 W: 104.9 tokens/s (it reports 1,397 GB/s of weights read).
GPT_FAST_A100 = PublishedStep("meta-llama/Llama-2-7b-hf", A100, 1, 104.9,
                              "PyTorch gpt-fast README (github.com/pytorch-labs/gpt-fast), 2023")


def config_step_cost(config: ModelConfig, bytes_per_weight: float) -> StepCost:
    """`roofline.step_cost` for a model known by its shapes only: every weight once (a tied head
    once) at `bytes_per_weight`, and the matmul parameters of every projection and the LM head."""
    q, kv = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim
    per_layer = config.hidden_size * (q + 2 * kv) + q * config.hidden_size + 3 * config.hidden_size * config.intermediate_size
    matmul = config.num_hidden_layers * per_layer + config.vocab_size * config.hidden_size
    return StepCost(int(config.num_parameters() * bytes_per_weight), matmul)


@contextlib.contextmanager
def num_threads(n: int):
    """Run the block with `n` torch threads, then restore the previous count."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass(frozen=True)
class DecodeRoofline:
    """Measured decode steps of one model, and the roofline measured beside them."""

    roofline: Roofline
    cost: StepCost
    times: tuple[StepTimes, ...]  # one per batch size, in order

    @property
    def batch_sizes(self) -> list[int]:
        return [t.batch_size for t in self.times]

    @property
    def ridge(self) -> float:
        return self.roofline.ridge(self.cost)

    def at(self, batch_size: int) -> StepTimes:
        return next(t for t in self.times if t.batch_size == batch_size)

    def over_roofline(self, batch_size: int) -> float:
        """Measured median step / the roofline's step at this batch."""
        return self.at(batch_size).median_s / self.roofline.step_s(self.cost, batch_size)

    def table(self) -> str:
        lines = [f"{'batch':>5} | {'step, median [min-max of rounds]':>32} | {'roofline':>9} | {'step / roofline':>15} | "
                 f"{'step / step(1)':>14} | {'tokens/s':>8}"]
        base = self.times[0].median_s
        for t in self.times:
            ms = [s * 1e3 for s in t.step_s]
            lines.append(f"{t.batch_size:>5} | {t.median_s * 1e3:10.1f} ms [{min(ms):7.1f} - {max(ms):7.1f}] ms | "
                         f"{self.roofline.step_s(self.cost, t.batch_size) * 1e3:6.1f} ms | "
                         f"{self.over_roofline(t.batch_size):14.2f}x | {t.median_s / base:13.2f}x | "
                         f"{t.batch_size / t.median_s:8.1f}")
        return "\n".join(lines)


def sweep(model, batch_sizes: list[int], num_rounds: int = 3, num_steps: int = 4,
          read_bytes: int = 1 << 28, matmul_n: int = 2048, num_roofline_repeats: int = 2) -> DecodeRoofline:
    """This machine's roofline, then `model`'s decode steps at every batch size (alternating
    rounds of `num_steps` timed steps each).  The roofline is measured with the same threads,
    `num_roofline_repeats` times before the steps and as many after, and each ceiling is the best
    of them: a ceiling is what the machine can do, and other work on it only ever slows a
    measurement down."""
    measured = [measure_roofline(num_bytes=read_bytes, matmul_n=matmul_n, device=model.device)
                for _ in range(num_roofline_repeats)]
    with torch.inference_mode():
        times = time_steps({"model": model}, batch_sizes, num_rounds=num_rounds, num_steps=num_steps)
    measured += [measure_roofline(num_bytes=read_bytes, matmul_n=matmul_n, device=model.device)
                 for _ in range(num_roofline_repeats)]
    roofline = Roofline(max(r.read_bandwidth for r in measured), max(r.matmul_flops for r in measured))
    return DecodeRoofline(roofline, step_cost(model), tuple(sorted(times, key=lambda t: t.batch_size)))


def _log_ticks(low: float, high: float) -> list[float]:
    """1-2-5 ticks covering [low, high], so a log axis never shows only one or two labels."""
    ticks, exponent = [], math.floor(math.log10(low))
    while 10.0**exponent <= high * 1.5:
        ticks += [m * 10.0**exponent for m in (1, 2, 5) if low / 1.5 <= m * 10.0**exponent <= high * 1.5]
        exponent += 1
    return [round(t, 6) for t in ticks]


def step_figure(result: DecodeRoofline, title: str = ""):
    """Left: the measured step (median and min-max of rounds) over this machine's roofline, with B*.
    Right: tokens/s, measured and at the roofline.  Both axes log, every tick labelled."""
    from plotly.subplots import make_subplots

    batch = result.batch_sizes
    dense = sorted({*batch, *range(1, max(batch) + 1)})
    roof_ms = [result.roofline.step_s(result.cost, b) * 1e3 for b in dense]
    med = [t.median_s * 1e3 for t in result.times]
    low = min(min(med), min(roof_ms), *(min(t.step_s) * 1e3 for t in result.times))
    high = max(max(roof_ms), *(max(t.step_s) * 1e3 for t in result.times))
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.14,
                        subplot_titles=("one decode step", "tokens per second (the whole batch)"))
    fig.add_scatter(x=batch, y=med, mode="lines+markers", name="measured step (median of rounds)",
                    line=dict(color="#1f77b4"), row=1, col=1)
    fig.add_scatter(x=batch + batch, y=[min(t.step_s) * 1e3 for t in result.times] + [max(t.step_s) * 1e3 for t in result.times],
                    mode="markers", marker=dict(color="#1f77b4", symbol="line-ns", size=10, line=dict(width=2)),
                    name="fastest and slowest round", row=1, col=1)
    fig.add_scatter(x=dense, y=roof_ms, mode="lines", line=dict(color="#d62728", dash="dash"),
                    name="roofline: max(weight read, arithmetic)", row=1, col=1)
    fig.add_scatter(x=[result.ridge] * 2, y=[low / 1.3, high * 1.3], mode="lines",
                    line=dict(color="grey", dash="dot"), name=f"B* = {result.ridge:.1f}", row=1, col=1)
    tps = [t.batch_size / t.median_s for t in result.times]
    roof_tps = [b / r * 1e3 for b, r in zip(dense, roof_ms)]
    fig.add_scatter(x=batch, y=tps, mode="lines+markers", line=dict(color="#1f77b4"), showlegend=False, row=1, col=2)
    fig.add_scatter(x=dense, y=roof_tps, mode="lines", line=dict(color="#d62728", dash="dash"), showlegend=False,
                    row=1, col=2)
    fig.add_scatter(x=[result.ridge] * 2, y=[min(tps + roof_tps) / 1.3, max(tps + roof_tps) * 1.3], mode="lines",
                    line=dict(color="grey", dash="dot"), showlegend=False, row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(type="log", tickvals=batch, title_text="batch size B (requests decoding together)",
                         row=1, col=col)
    fig.update_yaxes(type="log", tickvals=_log_ticks(low, high), title_text="step time (ms)", row=1, col=1)
    fig.update_yaxes(type="log", tickvals=_log_ticks(min(tps + roof_tps), max(tps + roof_tps)),
                     title_text="tokens/s", row=1, col=2)
    fig.update_layout(title=title, height=470, margin=dict(l=90, t=120, b=70))
    return fig


def gpu_figure(result: DecodeRoofline, gpu: Datasheet, gpu_cost: StepCost, gpu_label: str,
               published: PublishedStep, published_cost: StepCost, title: str = ""):
    """Left, on one scale: the step relative to batch 1 against B, for this machine (measured and
    its roofline) and for `gpu` (its roofline from the datasheet: modelled).  Right: each machine's
    batch-1 step over its own weight-read floor, this one measured, the GPU's published."""
    from plotly.subplots import make_subplots

    gpu_ridge = gpu.roofline.ridge(gpu_cost)
    xs = sorted({*result.batch_sizes, *(2**k for k in range(0, 11))})
    fig = make_subplots(rows=1, cols=2, column_widths=[0.66, 0.34], horizontal_spacing=0.14,
                        subplot_titles=("step time relative to batch 1", "batch-1 step / its weight-read floor"))
    base = result.times[0].median_s
    cpu_roof = [result.roofline.step_s(result.cost, b) / result.roofline.step_s(result.cost, 1) for b in xs]
    fig.add_scatter(x=result.batch_sizes, y=[t.median_s / base for t in result.times], mode="markers+lines",
                    line=dict(color="#1f77b4"), name="this CPU, measured", row=1, col=1)
    fig.add_scatter(x=xs, y=cpu_roof, mode="lines", line=dict(color="#1f77b4", dash="dash"),
                    name="this CPU's roofline", row=1, col=1)
    fig.add_scatter(x=xs, y=[gpu.roofline.step_s(gpu_cost, b) / gpu.roofline.step_s(gpu_cost, 1) for b in xs],
                    mode="lines", line=dict(color="#2ca02c", dash="dash"), name=f"{gpu_label} (modelled)",
                    row=1, col=1)
    top = max(cpu_roof)
    for x, color, label in ((result.ridge, "#1f77b4", "this CPU"), (gpu_ridge, "#2ca02c", gpu.name.split()[0])):
        fig.add_scatter(x=[x, x], y=[1, top], mode="lines", line=dict(color=color, dash="dot", width=1),
                        name=f"B* {label} = {x:.0f}", row=1, col=1)
    fig.update_xaxes(type="log", tickvals=[b for b in xs if b in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)],
                     title_text="batch size B", row=1, col=1)
    fig.update_yaxes(type="log", tickvals=_log_ticks(1, top), title_text="step(B) / step(1)", row=1, col=1)
    cpu_over = result.over_roofline(result.times[0].batch_size)
    pub_over = published.step_s / published.device.roofline.step_s(published_cost, published.batch_size)
    fig.add_bar(x=["this CPU (measured)", f"{published.device.name.split()[0]} (published)"], y=[cpu_over, pub_over],
                marker_color=["#1f77b4", "#2ca02c"], showlegend=False, row=1, col=2)
    fig.update_xaxes(title_text="batch-1 decode step", row=1, col=2)
    fig.update_yaxes(range=[0, max(cpu_over, pub_over) * 1.2], title_text="measured step / weight-read floor",
                     row=1, col=2)
    fig.update_layout(title=title, height=480, margin=dict(l=90, t=120, b=70))
    return fig


__all__ = ["A100", "DATASHEETS", "GPT_FAST_A100", "DecodeRoofline", "PublishedStep", "config_step_cost", "gpu_figure",
           "num_threads", "step_figure", "sweep"]
