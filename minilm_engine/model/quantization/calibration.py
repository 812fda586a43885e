"""Calibration: learn from real activations where rounding hurts, then quantize around it.

Contract: `calibrate(model, tokenizer, config)` runs the full-precision model on calibration
text, and returns, per projection layer name, a `LayerCalibration` (input scales, and for int4
a clip ratio per group) that `quantize_model` uses.  Nothing in the model changes here.

AWQ (Lin et al., 2023), each layer on its own, judged by its output on calibration inputs X:

1. Scale search.  Input channels that carry large activations matter most: multiplying
   column k of W by s_k > 1 before rounding gives it finer steps relative to its size, and
   dividing x_k by s_k keeps the product the same.  With a_k = mean |x_k| over the text,
   s = a ** alpha for the alpha in [0, 1] that minimises || X W^T - (X / s) Q(W s)^T ||^2.
   alpha = 0 is plain round to nearest, so the search never does worse on its own data.
2. Clip search (int4).  Shrinking a group's [min, max] clamps its rare extreme weights but
   gives all the others finer steps; for every group, pick the ratio (1.0 down to 0.70)
   whose share of the output error is smallest.

Default text: documents of the noodle-shop corpus drawn with seed 2 (the models were trained
on seed 0 and are evaluated on seed 1, so calibration sees neither).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from minilm_engine.model.quantization.config import QuantizationConfig
from minilm_engine.model.quantization.linear import fake_quantize, projection_layers
from minilm_engine.model.quantization.schemes import pad_columns, round_to

CALIBRATION_SEED = 2
NUM_DEFAULT_DOCUMENTS = 64
WINDOW_LEN = 512  # tokens per forward pass
NUM_SEARCH_ROWS = 512  # calibration tokens kept per layer for the error measurements
NUM_CLIP_ROWS = 256
ALPHAS = [i / 10 for i in range(11)]
CLIP_RATIOS = [1.0 - 0.05 * i for i in range(7)]  # 1.0 ... 0.70


@dataclass
class LayerCalibration:
    input_scales: torch.Tensor  # (K,) float32: divide x by it, multiply W's columns by it
    clip_ratio: torch.Tensor | float  # (N, G) for int4, 1.0 for int8
    alpha: float  # the chosen exponent (0 = round to nearest)


def default_calibration_texts() -> list[str]:
    """Held-out noodle-shop documents shipped with the models (seed CALIBRATION_SEED)."""
    from minilm_engine.model.loader import shipped_corpus_sample

    return shipped_corpus_sample()["calibration"][:NUM_DEFAULT_DOCUMENTS]


def calibration_windows(tokenizer, texts: list[str], max_tokens: int) -> torch.Tensor:
    """The texts as one stream (each preceded by eos, as in training), cut into windows:
    (num_windows, <= WINDOW_LEN) int64.  Raises if the texts hold no tokens."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for text in texts:
        ids += ([eos] if eos is not None else []) + tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= max_tokens:
            break
    ids = ids[:max_tokens]
    if len(ids) < 2:
        raise ValueError("the calibration texts hold fewer than 2 tokens")
    stream = torch.tensor(ids)
    return [stream[i : i + WINDOW_LEN] for i in range(0, len(stream), WINDOW_LEN)]


@torch.no_grad()
def collect_inputs(model: nn.Module, windows: list[torch.Tensor]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Per projection layer: (mean |x| per input channel (K,), a random sample of rows (n, K))."""
    from minilm_engine.model.attention import NoKVCache

    layers = projection_layers(model)
    sums = {name: 0.0 for name in layers}
    rows = {name: [] for name in layers}
    num_tokens = sum(len(w) for w in windows)
    generator = torch.Generator().manual_seed(0)
    # Keep each token's activations with this probability: about NUM_SEARCH_ROWS rows per layer.
    keep = torch.rand(num_tokens, generator=generator) < NUM_SEARCH_ROWS / num_tokens
    position = [0]

    def hook(name):
        def record(module, args):
            x = args[0].detach().float().reshape(-1, args[0].shape[-1])  # (T, K)
            sums[name] = sums[name] + x.abs().sum(0)
            start = position[0]
            rows[name].append(x[keep[start : start + len(x)].to(x.device)].cpu())

        return record

    handles = [layer.register_forward_pre_hook(hook(name)) for name, layer in layers.items()]
    try:
        for window in windows:
            ids = window.to(model.device)  # (T,)
            positions = torch.arange(len(ids), device=model.device)
            valid = torch.ones(1, len(ids), dtype=torch.bool, device=model.device)  # (1, T)
            model(ids, positions, NoKVCache(valid))
            position[0] += len(window)
    finally:
        for handle in handles:
            handle.remove()
    return {name: ((sums[name] / num_tokens).cpu(), torch.cat(rows[name])) for name in layers}


def output_error(X: torch.Tensor, W: torch.Tensor, W_hat: torch.Tensor) -> float:
    """Mean squared difference of the layer outputs X W^T and X W_hat^T."""
    return ((X @ (W - W_hat).T) ** 2).mean().item()


def search_scales(W: torch.Tensor, X: torch.Tensor, act_mean: torch.Tensor, config: QuantizationConfig):
    """The AWQ scale search for one layer: returns (input scales (K,), alpha)."""
    best = (float("inf"), None, 0.0)
    for alpha in ALPHAS:
        s = act_mean.clamp(min=1e-4) ** alpha
        s = round_to(s / (s.max() * s.min()).sqrt(), config.torch_scale_dtype)  # centre on 1
        W_hat = fake_quantize(W * s[None, :], config) / s[None, :]
        err = output_error(X, W, W_hat)
        if err < best[0]:
            best = (err, s, alpha)
    return best[1], best[2]


def search_clip(W_scaled: torch.Tensor, X_scaled: torch.Tensor, config: QuantizationConfig) -> torch.Tensor:
    """Per (row, group), the clip ratio whose share of the output error is smallest: (N, G)."""
    g = config.group_size
    N = W_scaled.shape[0]
    num_pad = -X_scaled.shape[1] % g  # the pad columns multiply zeros, as in the real matmul
    Xg = F.pad(X_scaled, (0, num_pad)).view(len(X_scaled), -1, g)  # (T, G, g)
    Wg = pad_columns(W_scaled, g).view(N, -1, g)  # (N, G, g)
    best_err, best_ratio = None, None
    for ratio in CLIP_RATIOS:
        W_hat = pad_columns(fake_quantize(W_scaled, config, clip_ratio=ratio), g).view(N, -1, g)
        partial = torch.einsum("tgk,ngk->ngt", Xg, Wg - W_hat)  # each group's output error
        err = (partial**2).sum(-1)  # (N, G)
        if best_err is None:
            best_err, best_ratio = err, torch.full_like(err, ratio)
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_ratio = torch.where(better, torch.full_like(err, ratio), best_ratio)
    return best_ratio


def calibrate(model: nn.Module, tokenizer, config: QuantizationConfig) -> dict[str, LayerCalibration]:
    """Run the model on the calibration text and search every layer (see the module docstring)."""
    texts = list(config.calibration_texts or default_calibration_texts())
    windows = calibration_windows(tokenizer, texts, config.max_calibration_tokens)
    found = {}
    layers = projection_layers(model)
    for name, (act_mean, X) in collect_inputs(model, windows).items():
        W = layers[name].weight.detach().float().cpu()
        s, alpha = search_scales(W, X, act_mean, config)
        clip = 1.0
        if config.scheme == "int4":
            clip = search_clip(W * s[None, :], X[:NUM_CLIP_ROWS] / s[None, :], config)
        clip = clip.to(model.device) if isinstance(clip, torch.Tensor) else clip
        found[name] = LayerCalibration(s.to(model.device), clip, alpha)
    return found
