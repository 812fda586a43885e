"""A model of a real shape, without a download: Qwen3-0.6B's config (`course/known_configs.py`)
with random weights, for the lessons about bytes and FLOPs that the shipped 7M-parameter
chef cannot show (on a CPU its steps are mostly fixed per-step overhead).

Contract: `random_qwen3_folder(num_layers)` writes the checkpoint once (with
`quantization.write_random_qwen3`, the benchmarks' writer) into a cache folder and returns it;
`load_random_qwen3(num_layers, **llm_args)` loads it as an `LLM` in `default_dtype(device)`: bf16
where the machine multiplies bf16 natively (a GPU from capability 8.0, a CPU with AVX512_BF16 /
AMX), else fp16 on an older GPU and fp32 on a CPU.  A CPU without native bf16 emulates every bf16
matmul in software, many times slower than fp32, so a bf16 step there measures the emulation,
not the bytes and FLOPs the lessons are about.  `num_layers=None` is
the real depth (28); a smoke run passes fewer layers, which shrinks every cost in proportion and
keeps each layer's shapes.

Why random weights are enough: a forward pass costs the same whatever values its weights hold
(the same matmuls over the same bytes), so its timings are the real model's; the tokens it
produces are noise, so nothing here reads them.

    floors of one step (chapter 01's `DecodeCostModel`, measured on this machine):
      decode  (1 token per request)   weight bytes / memory bandwidth     -> weight-read bound
      prefill (T tokens)              prefill FLOPs(T) / matmul FLOP/s    -> compute bound

`step_vs_floor(model, batch_sizes)` times decode steps with the package's one decode-step timer
(`batching.time_decode_step`, which chapters 01 and 02 share) in interleaved rounds, and in every
round also measures the copy bandwidth and the rate a one-token matvec in the model's dtype streams
a large weight matrix (`measure_matvec_bandwidth`: a copy counts bytes read and written, and a
CPU's matvec kernels may stream slower than a copy), so each round gives a step and its two weight-read
floors taken close together in time:

    copy floor   (round i) = weight bytes / copy bandwidth (round i)
    matvec floor (round i) = weight bytes / matvec streaming rate (round i)

Returns plain samples; the chapter turns them into intervals (`teaching.claims`).  Chapter 08's
`decode_floor.settings_vs_floor` measures the whole engine's step instead (`LLM.generate`, one
batch size, several settings); both floors divide `batching.step_weight_bytes` by a bandwidth.
"""

from __future__ import annotations

import os
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minilm_engine.model.device import native_bf16_matmul, resolve_device
from minilm_engine.entrypoints.llm import LLM
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.course.experiments.batching import (
    _median_time,
    measure_copy_bandwidth,
    step_weight_bytes,
    time_decode_step,
)

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
    from minilm_engine.course.experiments.quantization import write_random_qwen3

    fields = qwen3_fields(num_layers)
    folder = cache_root() / f"random-qwen3-0.6b-{fields['num_hidden_layers']}layers"
    if not (folder / "config.json").exists() or not any(folder.glob("*.safetensors")):
        partial = folder.with_name(folder.name + ".partial")
        write_random_qwen3(partial, **fields)
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete one from an older run
        partial.rename(folder)  # a run killed mid-write leaves no folder that looks complete
    return folder


def default_dtype(device: str | torch.device | None = None) -> str:
    """The dtype a real-shaped model runs in here: "bfloat16" where bf16 matmuls are native (a
    GPU of capability 8.0 or later, a CPU with `native_bf16_matmul()`), "float16" on an older
    GPU (a T4), "float32" on a CPU that would only emulate bf16."""
    device = resolve_device(device)
    if device.type == "cuda":
        return "bfloat16" if torch.cuda.get_device_capability(device) >= (8, 0) else "float16"
    return "bfloat16" if native_bf16_matmul() else "float32"


def load_random_qwen3(num_layers: int | None = None, **llm_args) -> LLM:
    """`LLM` over `random_qwen3_folder(num_layers)`, in `default_dtype(device)` unless told
    otherwise (`llm_args` are `LLM`'s: device, dtype, max_model_len, num_kv_blocks, ...)."""
    llm_args.setdefault("dtype", default_dtype(llm_args.get("device")))
    llm_args.setdefault("record_trace", True)
    return LLM(random_qwen3_folder(num_layers), **llm_args)


def measure_matvec_bandwidth(
    in_features: int, dtype: torch.dtype, num_bytes: int = 1 << 28, num_repeats: int = 3,
    device: str | torch.device = "cpu",
) -> float:
    """Bytes/s at which one token's matrix-vector product streams a weight matrix of `num_bytes`
    (in_features wide, in `dtype`) that does not fit in the caches: the weight-read rate a decode
    step's linear layers actually get, which a copy (read + write) does not tell."""
    device = torch.device(device)
    num_rows = max(1, num_bytes // (in_features * dtype.itemsize))
    weight = torch.randn(num_rows, in_features, device=device).to(dtype)  # (N, K)
    x = torch.randn(1, in_features, device=device).to(dtype)  # (1, K): one token
    seconds = _median_time(lambda: F.linear(x, weight), num_repeats, device)
    return weight.numel() * weight.element_size() / seconds


@dataclass(frozen=True)
class StepVsFloor:
    """One batch size's decode steps and the weight-read floor, round by round (paired)."""

    batch_size: int
    step_s: tuple[float, ...]  # each round's median decode step
    floor_s: tuple[float, ...]  # each round's weight bytes / copy bandwidth
    matvec_floor_s: tuple[float, ...] = ()  # each round's weight bytes / matvec streaming rate

    @property
    def over_floor(self) -> tuple[float, ...]:
        """step / floor, round by round: 1.0 is a step that only streams the weights."""
        return tuple(s / f for s, f in zip(self.step_s, self.floor_s, strict=True))

    @property
    def over_matvec_floor(self) -> tuple[float, ...]:
        """step / (weight bytes at the rate a one-token matvec streams weights), round by round."""
        return tuple(s / f for s, f in zip(self.step_s, self.matvec_floor_s, strict=True))

    @property
    def median_step_s(self) -> float:
        return statistics.median(self.step_s)


def step_vs_floor(
    model,
    batch_sizes: list[int],
    num_rounds: int = 5,
    num_steps: int = 6,
    context_len: int = 32,
    bandwidth_bytes: int = 1 << 28,
) -> list[StepVsFloor]:
    """Per round: the copy bandwidth (`measure_copy_bandwidth`) and the rate a one-token matvec of
    the model's width and dtype streams weights (`measure_matvec_bandwidth`), then
    `time_decode_step` at every batch size; so a burst of other work on a shared machine moves a
    step and its floors together."""
    if num_rounds < 1 or not batch_sizes:
        raise ValueError(f"need num_rounds >= 1 and at least one batch size, got {num_rounds}, {batch_sizes}")
    num_bytes = step_weight_bytes(model)
    steps: dict[int, list[float]] = {b: [] for b in batch_sizes}
    floors: list[float] = []
    matvec_floors: list[float] = []
    for _ in range(num_rounds):
        bandwidth = measure_copy_bandwidth(bandwidth_bytes, num_repeats=3, device=model.device)
        floors.append(num_bytes / bandwidth)
        rate = measure_matvec_bandwidth(model.config.hidden_size, model.dtype, bandwidth_bytes, device=model.device)
        matvec_floors.append(num_bytes / rate)
        for b in sorted(batch_sizes):
            steps[b].append(time_decode_step(model, b, context_len, num_steps).step_s)
    return [StepVsFloor(b, tuple(steps[b]), tuple(floors), tuple(matvec_floors)) for b in sorted(batch_sizes)]
