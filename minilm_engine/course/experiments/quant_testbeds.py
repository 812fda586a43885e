"""Chapter 06's testbeds: quantization's quality effects where they are resolved.

Contract:
  - `sweep_bits(llm, windows, bits, group_sizes)`: held-out window losses of the model with
    every decoder projection fake-quantized (asymmetric, `bits` bits, one scale and offset per
    group of `group_size` inputs; `None` = one per row), for each (bits, group size); the
    weights are restored after each setting.  The shipped chef hides INT4's loss; fewer bits
    show where loss appears.
  - `add_outlier_channels(model, num_channels, factor)`: a function-preserving change that gives
    the model outlier activation channels, as large LLMs have: in every layer, the RMSNorm gain of
    `num_channels` hidden channels is multiplied by `factor` and the matching input columns of the
    projections that read it (q/k/v, gate/up) are divided by it.  The float model computes the
    same function (up to rounding); its activations now have a few channels `factor` times
    larger, and the weights that meet them are `factor` times smaller, which is the case
    activation-aware quantization (AWQ) was designed for.
  - `quantized_copy(llm, config, calibrate)`: a quantized deep copy of `llm.model` (RTN or AWQ with
    the package's calibration), for the readable decoder.
  - `perplexity_change(base, other)`: the paired change of perplexity in %, bootstrapped over
    windows.

Quality only: these run the readable decoder (`model_backend="reference"`), whose projections
are `nn.Linear`s the functions can rewrite.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from minilm_engine.course.experiments.quantization import window_losses
from minilm_engine.course.teaching.claims import Measurement
from minilm_engine.model.quantization import QuantizationConfig, calibration, quantize_model
from minilm_engine.model.quantization.schemes import pad_columns

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def fake_quantize_asym(w: torch.Tensor, bits: int, group_size: int | None) -> torch.Tensor:
    """(N, K) -> (N, K): round each group of `group_size` inputs (None: the whole row) to
    2**bits levels between its minimum and maximum, and back.  A row whose length is not a
    multiple of the group is padded as the package's INT4 scheme pads it (`pad_columns`)."""
    N, K = w.shape
    g = K if group_size is None else group_size
    groups = pad_columns(w.float(), g).view(N, -1, g)  # (N, G, g)
    lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp(min=1e-12)
    codes = torch.round((groups - lo) / scale).clamp(0, 2**bits - 1)
    return (codes * scale + lo).view(N, -1)[:, :K].to(w.dtype)


def projections(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules()
            if isinstance(m, nn.Linear) and name.rsplit(".", 1)[-1] in PROJECTIONS}


@torch.no_grad()
def sweep_bits(model: nn.Module, windows: torch.Tensor, bits: list[int],
               group_sizes: list[int | None]) -> dict[tuple[int, int | None], list[float]]:
    """(bits, group_size) -> window losses (see the module docstring)."""
    layers = projections(model)
    originals = {name: m.weight.detach().clone() for name, m in layers.items()}
    out = {}
    try:
        for b in bits:
            for g in group_sizes:
                for name, m in layers.items():
                    m.weight.copy_(fake_quantize_asym(originals[name], b, g))
                out[(b, g)] = window_losses(model, windows)
    finally:
        for name, m in layers.items():
            m.weight.copy_(originals[name])
    return out


@torch.no_grad()
def add_outlier_channels(model: nn.Module, num_channels: int, factor: float, seed: int = 0) -> list[int]:
    """Give every layer's projection inputs `num_channels` outlier channels (see the module
    docstring), in place; returns the channels chosen."""
    hidden = model.config.hidden_size
    channels = torch.randperm(hidden, generator=torch.Generator().manual_seed(seed))[:num_channels]
    for layer in model.model.layers:
        for norm, readers in ((layer.input_layernorm, (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                                       layer.self_attn.v_proj)),
                              (layer.post_attention_layernorm, (layer.mlp.gate_proj, layer.mlp.up_proj))):
            norm.weight[channels] *= factor
            for proj in readers:
                proj.weight[:, channels] /= factor
    return channels.tolist()


def quantized_copy(model: nn.Module, tokenizer, config: QuantizationConfig) -> nn.Module:
    """A deep copy of `model` with its projections quantized: round to nearest, or AWQ
    (`config.method == "awq"`: the package's calibration on its default calibration text)."""
    clone = copy.deepcopy(model)
    found = calibration.calibrate(clone, tokenizer, config) if config.method == "awq" else None
    return quantize_model(clone, config, found)


def perplexity_change(base: list[float], other: list[float], label: str = "") -> Measurement:
    """Perplexity of `other` over `base`, minus 1, in %: paired windows, bootstrapped."""
    def change(pairs):
        n = len(pairs)
        return 100 * (math.exp(sum(o for _, o in pairs) / n) / math.exp(sum(b for b, _ in pairs) / n) - 1)

    return Measurement.bootstrap(list(zip(base, other, strict=True)), change, unit="%", label=label)


def channel_magnitudes(model: nn.Module, tokenizer, layer_name: str, num_texts: int = 8) -> torch.Tensor:
    """Mean |x| per input channel entering `layer_name` on calibration text: (K,)."""
    windows = calibration.calibration_windows(tokenizer, calibration.default_calibration_texts()[:num_texts], 1024)
    return calibration.collect_inputs(model, windows)[layer_name][0]


# -- figures ----------------------------------------------------------------------------------


def sweep_figure(changes: dict[tuple[int, int | None], Measurement], title: str = ""):
    """Perplexity change (%, log axis) against bits per weight, one line per group size."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    for g in sorted({g for _, g in changes}, key=lambda g: -(g or 10**9)):
        pts = sorted((b, m) for (b, gg), m in changes.items() if gg == g)
        xs = [b for b, _ in pts]
        ys = [max(m.value, 1e-3) for _, m in pts]
        lo = [max(m.value, 1e-3) - max(m.low, 1e-3) for _, m in pts]
        hi = [max(m.high, 1e-3) - max(m.value, 1e-3) for _, m in pts]
        ax.errorbar(xs, ys, yerr=[lo, hi], marker="o", capsize=3, label="one scale per row" if g is None else f"groups of {g}")
    ax.set_yscale("log")
    ax.set_xlabel("bits per weight code")
    ax.set_ylabel("perplexity change vs fp32 (%, log)")
    ax.axhline(1.0, color="#888", lw=0.8, ls=":")
    ax.legend(title="scale and offset per")
    ax.set_title(title or "Where quantization loss appears")
    fig.tight_layout()
    return fig
