"""`minilm-engine quantize`: load a full-precision checkpoint, quantize it, save it.

Contract: `quantize_checkpoint(model, out, scheme, options)` quantizes `model` as `LLM(...,
quantization=scheme, quantization_config=options)` would and writes a checkpoint `LLM(out)`
loads back.  It sits above `model/`: the loader builds quantized layers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from minilm_engine.entrypoints.llm import _load_tokenizer
from minilm_engine.model import load_model, resolve_model_path
from minilm_engine.model.quantization.checkpoint import save_quantized
from minilm_engine.model.quantization.config import QuantizationError
from minilm_engine.model.quantization.setup import config_from_user, quantize_in_place


def quantize_checkpoint(model: str | Path | None, out: str | Path, scheme: str, options: dict | None = None) -> Path:
    """Load `model` (folder or shipped name) on the CPU in fp32, quantize it, write `out`."""
    source = resolve_model_path(model)
    full = load_model(source, dtype=torch.float32, device="cpu")
    if full.quantization_config is not None:
        raise QuantizationError(
            f"{source} is already quantized ({full.quantization_config.describe()}); "
            "quantize the original full-precision checkpoint"
        )
    config = config_from_user(full, scheme, options)
    quantize_in_place(full, _load_tokenizer(source), config)
    return save_quantized(full, source, out)
