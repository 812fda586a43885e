"""Quantization-aware training (QAT): train with the rounding in the forward pass.

Contract: inside `with fake_quantized(model, config):` every decoder projection computes with
`fake_quantize(W)` (the weight it will have once quantized) while gradients flow to the float W
as if rounding were the identity (the straight-through estimator).  Leaving the block restores
plain float weights, trained to sit well on the grid: `quantize_model(model, config)` then
loses little.  Post-training quantization (PTQ) rounds a model trained without this.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.utils import parametrize

from minilm_engine.model.quantization.config import QuantizationConfig
from minilm_engine.model.quantization.linear import fake_quantize, projection_layers


class FakeQuantize(nn.Module):
    """W -> W + (Q(W) - W).detach(): the forward sees Q(W), the backward sees the identity."""

    def __init__(self, config: QuantizationConfig):
        super().__init__()
        self.config = config

    def forward(self, w: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            rounded = fake_quantize(w, self.config).to(w.dtype)
        return w + (rounded - w).detach()


@contextmanager
def fake_quantized(model: nn.Module, config: QuantizationConfig):
    layers = list(projection_layers(model).values())
    for layer in layers:
        parametrize.register_parametrization(layer, "weight", FakeQuantize(config))
    try:
        yield model
    finally:
        for layer in layers:
            # keep the trained float weight (not its rounded view)
            parametrize.remove_parametrizations(layer, "weight", leave_parametrized=False)
