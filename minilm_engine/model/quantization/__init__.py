"""Weight-only quantization: INT8 per channel and INT4 per group, with calibration.

    config.py       QuantizationConfig: scheme, group size, method, checked at the boundary
    schemes.py      quantize / pack / unpack / dequantize as pure functions
    linear.py       QuantizedLinear (drop-in for nn.Linear) and the module swap
    calibration.py  activation statistics and the AWQ-style scale / clip search
    kernels/        reference (dequantize + matmul), cpu (micro-kernel), triton (fused dequant)
    checkpoint.py   save a quantized checkpoint; read its config entry back
    setup.py        what LLM(..., quantization=...) does with a loaded model
"""

from minilm_engine.model.quantization.config import (GROUP_SIZES, METHODS, SCHEMES,
                                                     QuantizationConfig, QuantizationError)
from minilm_engine.model.quantization.linear import QuantizedLinear, quantize_model, weight_bytes

__all__ = ["GROUP_SIZES", "METHODS", "SCHEMES", "QuantizationConfig", "QuantizationError",
           "QuantizedLinear", "quantize_model", "weight_bytes"]
