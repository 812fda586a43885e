"""`QuantizedLinear`: the drop-in replacement for `nn.Linear`, and the module swap.

Contract: `QuantizedLinear.from_linear(linear, config)` computes what `linear` does with its
weight in INT8 or INT4 (schemes.py): `y = (x / input_scales) @ dequantized_weight().T + bias`,
by the layer's `kernel` (kernels/: the reference dequantizes then multiplies, the fast ones never
build the float weight).  `quantize_model(model, config, calibration)` swaps every decoder
projection (q/k/v/o, gate/up/down) in place, and the LM head with `config.lm_head` (round to
nearest; a tied embedding keeps its own table: a lookup reads one row, the head every row).
Embeddings and norms keep the model dtype.  To the engine it is an ordinary `CausalLM`.

Buffers of one layer (N = out_features, K = in_features, G = groups per row):

    int8: qweight (N, K) int8            scales (N,)
    int4: qweight (N, K_padded/2) uint8  scales (N, G)   offsets (N, G)
    awq:  input_scales (K,)  W is stored as Q(W * s) and x divided by s on the way in (kept
          here rather than folded into the previous norm: every layer self-contained)
"""

from __future__ import annotations

import torch
from torch import nn

from minilm_engine.pluggable import replaceable
from minilm_engine.model.quantization import schemes
from minilm_engine.model.quantization.config import GROUP_SIZES, QuantizationConfig, QuantizationError

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class QuantizedLinear(nn.Module):
    """A linear layer whose weight is stored quantized.  Invariant: the buffers are the
    canonical layout above, unless `kernel.prepare` converted them to its own (the CPU int4
    kernel does); `kernel` is the object that computes the product."""

    def __init__(self, in_features: int, out_features: int, bias: bool, config: QuantizationConfig,
                 has_input_scales: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None):
        super().__init__()
        from minilm_engine.model.quantization.kernels import REFERENCE_KERNEL

        self.in_features, self.out_features = in_features, out_features
        self.scheme, self.group_size = config.scheme, config.group_size
        N, K = out_features, in_features
        float_kw = dict(dtype=dtype or torch.float32, device=device)
        if config.scheme == "int8":
            self.register_buffer("qweight", torch.zeros(N, K, dtype=torch.int8, device=device))
            self.register_buffer("scales", torch.zeros(N, **float_kw))
        else:
            K_padded = self.padded_in_features
            num_groups = K_padded // config.group_size
            self.register_buffer("qweight", torch.zeros(N, K_padded // 2, dtype=torch.uint8, device=device))
            self.register_buffer("scales", torch.zeros(N, num_groups, **float_kw))
            self.register_buffer("offsets", torch.zeros(N, num_groups, **float_kw))
        self.register_buffer("input_scales", torch.ones(K, **float_kw) if has_input_scales else None)
        bias_param = nn.Parameter(torch.zeros(N, **float_kw), requires_grad=False) if bias else None
        self.register_parameter("bias", bias_param)
        self.kernel = REFERENCE_KERNEL

    @property
    def padded_in_features(self) -> int:
        if self.scheme == "int8":
            return self.in_features
        return schemes.padded_in_features(self.in_features, self.group_size)

    @classmethod
    @torch.no_grad()
    def from_linear(cls, linear: nn.Linear, config: QuantizationConfig,
                    input_scales: torch.Tensor | None = None,
                    clip_ratio: torch.Tensor | float = 1.0) -> QuantizedLinear:
        """Quantize `linear` (its weight scaled by `input_scales` per input column, if given)."""
        w = linear.weight.detach().float()  # (N, K)
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, config,
                    has_input_scales=input_scales is not None, dtype=linear.weight.dtype,
                    device=linear.weight.device)
        if input_scales is not None:
            w = w * input_scales.float()[None, :]
            layer.input_scales.copy_(input_scales)
        if linear.bias is not None:
            layer.bias.copy_(linear.bias)
        layer.qweight, layer.scales, *rest = quantize_weight(w, config, clip_ratio)
        layer.scales = layer.scales.to(linear.weight.dtype)
        if rest:
            layer.offsets = rest[0].to(linear.weight.dtype)
        return layer

    def dequantize(self) -> torch.Tensor:
        """(N, K) in the layer's dtype: the weight as stored (times the input scales, if any)."""
        if self.scheme == "int8":
            return schemes.dequantize_int8(self.qweight, self.scales)
        codes = schemes.unpack_int4(self.qweight)
        return schemes.dequantize_int4(codes, self.scales, self.offsets, self.in_features)

    def dequantized_weight(self) -> torch.Tensor:
        """(N, K): the weight this layer stands for, input scales divided back out."""
        w = self.dequantize()
        return w if self.input_scales is None else w / self.input_scales[None, :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_scales is not None:
            x = x / self.input_scales
        return self.kernel.linear(self, x)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.scheme == "int4" else ""
        awq = ", input_scales" if self.input_scales is not None else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"scheme={self.scheme}{group}{awq}, kernel={self.kernel.name}")


def quantize_weight(w: torch.Tensor, config: QuantizationConfig,
                    clip_ratio: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, ...]:
    """(N, K) float32 -> (qweight, scales) for int8, (qweight, scales, offsets) for int4."""
    if config.scheme == "int8":
        return quantize_int8_weight(w, config.torch_scale_dtype)
    codes, scales, offsets = quantize_int4_weight(w, config.group_size, clip_ratio, config.torch_scale_dtype)
    return schemes.pack_int4(codes), scales, offsets


@replaceable("quantization.int8_weight")
def quantize_int8_weight(w: torch.Tensor, scale_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, K) float32 -> codes (N, K) int8, scales (N,): one scale per output channel."""
    scales = schemes.int8_scales(w, scale_dtype)
    return schemes.quantize_int8(w, scales), scales


@replaceable("quantization.int4_weight")
def quantize_int4_weight(w: torch.Tensor, group_size: int, clip_ratio: torch.Tensor | float,
                         scale_dtype: torch.dtype) -> tuple[torch.Tensor, ...]:
    """(N, K) float32 -> codes (N, K_padded) uint8 0..15 (unpacked), scales and offsets
    (N, num_groups): one (scale, offset) pair per group of `group_size` inputs."""
    scales, offsets = schemes.int4_params(w, group_size, clip_ratio, scale_dtype)
    return schemes.quantize_int4(w, scales, offsets, group_size), scales, offsets


def fake_quantize(w: torch.Tensor, config: QuantizationConfig,
                  clip_ratio: torch.Tensor | float = 1.0) -> torch.Tensor:
    """(N, K) float -> (N, K) float32: quantize then dequantize (what the layer will compute with)."""
    w = w.float()
    if config.scheme == "int8":
        scales = schemes.int8_scales(w, config.torch_scale_dtype)
        return schemes.dequantize_int8(schemes.quantize_int8(w, scales), scales)
    scales, offsets = schemes.int4_params(w, config.group_size, clip_ratio, config.torch_scale_dtype)
    codes = schemes.quantize_int4(w, scales, offsets, config.group_size)
    return schemes.dequantize_int4(codes, scales, offsets, w.shape[1])


def projection_layers(model: nn.Module) -> dict[str, nn.Module]:
    """Name -> module of every projection inside the decoder layers (what gets quantized)."""
    return {name: module for name, module in model.named_modules()
            if name.rsplit(".", 1)[-1] in PROJECTIONS and ".layers." in f".{name}"}


def quantized_layers(model: nn.Module, config: QuantizationConfig) -> dict[str, nn.Module]:
    """Name -> module of every layer `config` quantizes: the projections, and the head if asked."""
    layers = projection_layers(model)
    if config.lm_head:
        layers["lm_head"] = model.lm_head
    return layers


def check_quantizable(model: nn.Module, config: QuantizationConfig) -> None:
    """Raise a QuantizationError before any work if some layer cannot take `config`."""
    layers = quantized_layers(model, config)
    already = [n for n, m in layers.items() if isinstance(m, QuantizedLinear)]
    if already:
        raise QuantizationError(f"this model is already quantized ({already[0]} is a "
                                "QuantizedLinear); quantize the original checkpoint instead")
    if config.scheme == "int4" and not config.pad_in_features:
        for name, layer in layers.items():
            if layer.in_features % config.group_size:
                fits = [g for g in GROUP_SIZES if all(m.in_features % g == 0 for m in layers.values())]
                raise QuantizationError(
                    f"group_size {config.group_size} does not divide in_features "
                    f"{layer.in_features} of {name}; group sizes that divide every layer of this model: "
                    f"{fits or 'none'} (or pass pad_in_features=True to pad rows)")


@torch.no_grad()
def quantize_model(model: nn.Module, config: QuantizationConfig, calibration=None) -> nn.Module:
    """Swap every decoder projection for a QuantizedLinear, in place; returns `model`.
    `calibration`: a `calibration.LayerCalibration` per layer name, or None (round to nearest)."""
    check_quantizable(model, config)
    for name, linear in quantized_layers(model, config).items():
        found = calibration.get(name) if calibration is not None else None
        if found is None:
            layer = QuantizedLinear.from_linear(linear, config)
        else:
            layer = QuantizedLinear.from_linear(linear, config, found.input_scales, found.clip_ratio)
        set_submodule(model, name, layer)
    return model


def empty_quantized_model(model: nn.Module, config: QuantizationConfig) -> nn.Module:
    """Swap the quantized layers for empty QuantizedLinears (same device), for a checkpoint to fill."""
    for name, linear in quantized_layers(model, config).items():
        awq = config.method == "awq" and name != "lm_head"  # the head is round to nearest
        layer = QuantizedLinear(linear.in_features, linear.out_features, linear.bias is not None,
                                config, awq, dtype=linear.weight.dtype, device=linear.weight.device)
        set_submodule(model, name, layer)
    return model


def set_submodule(model: nn.Module, name: str, module: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(model.get_submodule(parent_name), child, module)


def weight_bytes(model: nn.Module) -> int:
    """Bytes the weights occupy: parameters and the quantized layers' buffers (scales and
    offsets included), each storage counted once (a tied embedding and head share one)."""
    seen, total = set(), 0
    tensors = list(model.parameters())
    for module in model.modules():
        if isinstance(module, QuantizedLinear):
            tensors += list(module.buffers(recurse=False))
    for t in tensors:
        key = (t.device, t.untyped_storage().data_ptr()) if t.device.type != "meta" else id(t)
        if key in seen:
            continue
        seen.add(key)
        total += t.numel() * t.element_size()
    return total

