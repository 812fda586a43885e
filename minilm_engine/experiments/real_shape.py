"""A model of a real shape, without a download: Qwen3-0.6B's config (`models/known_configs.py`)
with random bf16 weights, for the lessons about bytes and FLOPs that the shipped 7M-parameter
chef cannot show (on a CPU its steps are mostly fixed per-step overhead).

Contract: `random_qwen3_folder(num_layers)` writes the checkpoint once (with
`quantization.write_random_qwen3`, the benchmarks' writer) into a cache folder and returns it;
`load_random_qwen3(num_layers, **llm_args)` loads it as an `LLM` in bf16.  `num_layers=None` is
the real depth (28); a smoke run passes fewer layers, which shrinks every cost in proportion and
keeps each layer's shapes.

Why random weights are enough: a forward pass costs the same whatever values its weights hold
(the same matmuls over the same bytes), so its timings are the real model's; the tokens it
produces are noise, so nothing here reads them.

    floors of one step (chapter 01's `DecodeCostModel`, measured on this machine):
      decode  (1 token per request)   weight bytes / memory bandwidth     -> weight-read bound
      prefill (T tokens)              prefill FLOPs(T) / matmul FLOP/s    -> compute bound
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..llm import LLM
from ..models.known_configs import KNOWN_CONFIGS

MODEL_ID = "Qwen/Qwen3-0.6B"


def cache_root() -> Path:
    """Where written checkpoints are kept: $MINILM_CACHE, else ~/.cache/minilm_engine."""
    return Path(os.environ.get("MINILM_CACHE") or Path.home() / ".cache" / "minilm_engine")


def qwen3_fields(num_layers: int | None = None) -> dict:
    """Qwen3-0.6B's config fields (transformers names), with `num_layers` layers if given."""
    fields = {k: v for k, v in KNOWN_CONFIGS[MODEL_ID].items() if k not in ("architectures", "torch_dtype")}
    if num_layers is not None:
        if num_layers < 1:
            raise ValueError(f"num_layers must be >= 1, got {num_layers}")
        fields["num_hidden_layers"] = num_layers
    return fields


def random_qwen3_folder(num_layers: int | None = None) -> Path:
    """The folder of a random-weight Qwen3-0.6B-shaped checkpoint, written on first use."""
    from .quantization import write_random_qwen3

    fields = qwen3_fields(num_layers)
    folder = cache_root() / f"random-qwen3-0.6b-{fields['num_hidden_layers']}layers"
    if not (folder / "config.json").exists() or not any(folder.glob("*.safetensors")):
        partial = folder.with_name(folder.name + ".partial")
        write_random_qwen3(partial, **fields)
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete one from an older run
        partial.rename(folder)  # a run killed mid-write leaves no folder that looks complete
    return folder


def load_random_qwen3(num_layers: int | None = None, **llm_args) -> LLM:
    """`LLM` over `random_qwen3_folder(num_layers)` in bf16 on the CPU unless told otherwise
    (`llm_args` are `LLM`'s: device, max_model_len, num_kv_blocks, ...)."""
    llm_args.setdefault("dtype", "bfloat16")
    llm_args.setdefault("record_trace", True)
    return LLM(random_qwen3_folder(num_layers), **llm_args)
