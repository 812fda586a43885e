"""A real-shaped model built at run time, and its decode step against its weight-read floor.

Contract: `build_random_model(folder, name)` writes a checkpoint with the shapes of a known model
(`models/known_configs.py`, e.g. Qwen3-0.6B) and random bf16 weights, through
`quantization.write_random_qwen3` (transformers writes it; nothing is downloaded), and returns
the `LLM` that serves it.  `step_vs_floor(model, batch_sizes)` times decode steps with the
package's one decode-step timer (`batching.time_decode_step`, which chapters 01 and 02 share) in
interleaved rounds, and measures the copy bandwidth in every round too, so each round gives a
step and its floor taken close together in time:

    weight-read floor (round i) = weight bytes / copy bandwidth (round i)
    step / floor      (round i) = median step of round i / floor of round i

and a second floor at the rate a one-token matrix-vector product of the model's width and dtype
really streams weights from memory (`measure_matvec_bandwidth`): a copy counts bytes read and
written, and a bf16 matvec kernel on a CPU may stream slower than a copy does, so the step of a
weight-bound model sits at that floor rather than at the copy's.

The shipped noodle-chef (27 MiB in fp32) sits in a server CPU's last-level cache and its step is
mostly fixed per-step work; a 0.6B model in bf16 (about 1.1 GiB) does not fit, so its step is
close to the time to stream its weights from memory once, and a few more requests ride along.
Returns plain samples; the chapter turns them into intervals (`teaching.claims`).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ..llm import LLM
from ..models.known_configs import KNOWN_CONFIGS
from .batching import _median_time, measure_copy_bandwidth, time_decode_step, weight_bytes
from .quantization import write_random_qwen3

QWEN3_0_6B = "Qwen/Qwen3-0.6B"


def random_model_fields(name: str = QWEN3_0_6B, **overrides) -> dict:
    """The config fields of known model `name` that a Qwen3 config takes, with `overrides`
    (a smoke run passes fewer `num_hidden_layers`)."""
    if name not in KNOWN_CONFIGS:
        raise KeyError(f"no known config {name!r}; known: {sorted(KNOWN_CONFIGS)}")
    fields = {k: v for k, v in KNOWN_CONFIGS[name].items() if k not in ("architectures", "torch_dtype")}
    if fields.get("model_type") != "qwen3":
        raise ValueError(f"{name} is a {fields.get('model_type')} model; write_random_qwen3 writes Qwen3 only")
    unknown = set(overrides) - set(fields)
    if unknown:
        raise ValueError(f"unknown config fields {sorted(unknown)}")
    return fields | overrides


def build_random_model(folder: str | Path, name: str = QWEN3_0_6B, max_num_seqs: int = 16, **overrides) -> LLM:
    """Write a random-weight bf16 checkpoint with `name`'s shapes into `folder` and load it
    (bf16, a small KV pool: the measurements here use their own contiguous caches)."""
    write_random_qwen3(folder, **random_model_fields(name, **overrides))
    return LLM(folder, dtype="bfloat16", max_num_seqs=max_num_seqs, record_trace=False,
               kv_cache_memory=64 << 20, enable_prefix_caching=False)


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
    num_bytes = weight_bytes(model)
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
