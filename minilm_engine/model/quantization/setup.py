"""What `LLM(model, quantization=..., quantization_config=...)` does once the model is loaded.

Contract: `setup_quantization(model, tokenizer, quantization, options)` leaves `model` with
the quantization the user asked for (or the one its checkpoint carries), every quantized layer
on its kernel, and returns the `QuantizationConfig` in force (None: not quantized).  Errors:
an unknown scheme or option, a group size that does not fit, options without a scheme, and
asking to quantize a checkpoint that is already quantized.
"""

from __future__ import annotations

from typing import Any

from minilm_engine.model.quantization.calibration import calibrate
from minilm_engine.model.quantization.config import QuantizationConfig, QuantizationError
from minilm_engine.model.quantization.kernels import prepare_kernels
from minilm_engine.model.quantization.linear import quantize_model


def default_scale_dtype(torch_dtype: str | None) -> str:
    """Scales are rounded to the dtype the checkpoint was saved in (if 16-bit): a quantized
    checkpoint written in that dtype then reloads bit for bit."""
    return torch_dtype if torch_dtype in ("float16", "bfloat16") else "float32"


def config_from_user(model, quantization: Any, options: dict[str, Any] | None) -> QuantizationConfig:
    if options is not None and not isinstance(options, dict):
        raise QuantizationError(f"quantization_config must be a dict, got {type(options).__name__}")
    options = {"scale_dtype": default_scale_dtype(model.config.torch_dtype), **(options or {})}
    return QuantizationConfig.from_user(quantization, options)


def quantize_in_place(model, tokenizer, config: QuantizationConfig) -> None:
    """Calibrate (for "awq") and swap the layers; kernels stay the reference."""
    calibration = calibrate(model, tokenizer, config) if config.method == "awq" else None
    quantize_model(model, config, calibration)
    model.quantization_config = config


def setup_quantization(model, tokenizer, quantization: Any = None,
                       options: dict[str, Any] | None = None) -> QuantizationConfig | None:
    loaded: QuantizationConfig | None = model.quantization_config
    if loaded is not None:
        if quantization is not None:
            raise QuantizationError(f"this checkpoint is already quantized ({loaded.describe()}); "
                                    "load it without quantization=, or quantize the original "
                                    "full-precision checkpoint")
        config = loaded.with_runtime(options)
        model.quantization_config = config
    elif quantization is None:
        if options:
            raise QuantizationError("quantization_config was given without quantization= "
                                    "('int8' or 'int4')")
        return None
    else:
        config = config_from_user(model, quantization, options)
        quantize_in_place(model, tokenizer, config)
    prepare_kernels(model, config.kernel)
    return config
