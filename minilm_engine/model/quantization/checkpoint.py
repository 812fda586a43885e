"""Quantized checkpoints: the same folder layout as any Hugging Face checkpoint.

Contract: `save_quantized(model, source, out)` writes `out/model.safetensors` (the quantized
layers' codes, scales and offsets under the layer's name, `...q_proj.qweight`; every other tensor
as in the source), `out/config.json` (the source's plus a `quantization_config` entry) and copies
the tokenizer files.  The loader reads such a folder back without calibrating again.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from minilm_engine.model.quantization.config import SCALE_DTYPES, QuantizationError
from minilm_engine.model.quantization.linear import QuantizedLinear

COPIED_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                "generation_config.json", "vocab.json", "merges.txt", "tokenizer.model")


def save_quantized(model, source: str | Path, out: str | Path) -> Path:
    source, out = Path(source), Path(out)
    config = model.quantization_config
    if config is None:
        raise QuantizationError("this model is not quantized; nothing to save as a quantized checkpoint")
    if out.resolve() == source.resolve():
        raise QuantizationError(f"refusing to overwrite the source checkpoint {source}")
    for name, module in model.named_modules():
        if isinstance(module, QuantizedLinear) and not hasattr(module, "qweight"):
            raise QuantizationError(f"{name} runs the {module.kernel.name!r} kernel in its own "
                                    "layout; save a model whose layers use the reference kernel "
                                    "(quantization_config={'kernel': 'reference'})")
    save_dtype = SCALE_DTYPES[config.scale_dtype]
    tensors = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight" and model.config.tie_word_embeddings:
            continue  # the same matrix as the embedding
        tensors[name] = (tensor.to(save_dtype) if tensor.is_floating_point() else tensor).contiguous().cpu()
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.torch import save_file

    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((source / "config.json").read_text())
    raw["quantization_config"] = config.to_checkpoint_dict()
    (out / "config.json").write_text(json.dumps(raw, indent=2) + "\n")
    for file in COPIED_FILES:
        if (source / file).is_file():
            shutil.copy(source / file, out / file)
    return out
