"""The roofline of a decode step, measured on this machine: what a step of B requests should cost,
and what it does.

Contract: `measure_roofline()` measures the two ceilings (`Roofline`: read bandwidth from a large
read-only reduction, FLOP/s from a large fp32 matmul); `Roofline.step_s(cost, B)` is the time they
predict for one decode step of B rows over a model whose `StepCost` (weight bytes one step reads,
matmul parameters) `step_cost(model)` counts; `Roofline.ridge(cost)` is B*, the batch where the
arithmetic catches up with the read.  `time_steps(models, batch_sizes)` times decode steps of
several models in alternating rounds, so a busy moment on a shared machine hits all alike.
Chapter 01 draws these; `benchmarks/roofline.py` prints them as a table.

    predicted(B) = max(weight bytes / read bandwidth,  2 * matmul params * B / matmul FLOP/s)
                        the weights, read once            every row's multiply-adds
    B* = weight bytes * FLOP/s / (2 * matmul params * read bandwidth)

Why a read-only reduction and not a copy: a decode step reads its weights and writes almost
nothing, and a copy's write traffic (plus the read-for-ownership of its destination) makes a
copy's bytes/s a different number from a read's.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from minilm_engine.course.experiments.batching import (
    _median_time,
    measure_matmul_flops,
    step_weight_bytes,
    time_decode_step,
    time_engine_decode_step,
)


def measure_read_bandwidth(num_bytes: int = 1 << 28, num_repeats: int = 5, device: str | torch.device = "cpu") -> float:
    """Bytes/s of a read-only reduction (`sum`) over `num_bytes` of fp32, far larger than the caches."""
    device = torch.device(device)
    data = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    seconds = _median_time(lambda: data.sum(), num_repeats, device)
    return data.numel() * data.element_size() / seconds


@dataclass(frozen=True)
class StepCost:
    """What one decode step must do whatever the kernels: read `weight_bytes` and multiply every
    row of the batch by `num_matmul_params` weights (2 FLOPs each)."""

    weight_bytes: int
    num_matmul_params: int


def step_cost(model) -> StepCost:
    """The `StepCost` of a loaded `CausalLM`: the bytes `batching.step_weight_bytes` counts (every
    weight once, a tied head once) and the parameters of every projection and the LM head, from
    the config (so packed or quantized weights count the same)."""
    c = model.config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    return StepCost(step_weight_bytes(model), c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size)


@dataclass(frozen=True)
class Roofline:
    """This machine's two ceilings."""

    read_bandwidth: float  # bytes/s
    matmul_flops: float  # FLOP/s

    def read_s(self, cost: StepCost) -> float:
        return cost.weight_bytes / self.read_bandwidth

    def compute_s(self, cost: StepCost, batch_size: int) -> float:
        return 2 * cost.num_matmul_params * batch_size / self.matmul_flops

    def step_s(self, cost: StepCost, batch_size: int) -> float:
        """The predicted decode step: the larger of the weight read and the arithmetic."""
        return max(self.read_s(cost), self.compute_s(cost, batch_size))

    def ridge(self, cost: StepCost) -> float:
        """B*: the batch size from which the arithmetic, not the read, sets the step time."""
        return cost.weight_bytes * self.matmul_flops / (2 * cost.num_matmul_params * self.read_bandwidth)


@dataclass(frozen=True)
class Datasheet:
    """A device's two ceilings as its maker publishes them: what this CPU cannot show, modelled."""

    name: str
    roofline: Roofline
    source: str  # document and year, printed beside every modelled number


# Dense (no sparsity) 16-bit tensor-core peaks and memory bandwidth, from the makers' datasheets.
DATASHEETS = {
    "H100": Datasheet("H100 SXM (bf16)", Roofline(read_bandwidth=3.35e12, matmul_flops=989e12),
                      "NVIDIA H100 Tensor Core GPU datasheet, 2023"),
    "T4": Datasheet("T4 (fp16)", Roofline(read_bandwidth=320e9, matmul_flops=65e12),
                    "NVIDIA T4 Tensor Core GPU datasheet, 2019"),
}


def measure_roofline(num_bytes: int = 1 << 28, matmul_n: int = 2048, device: str | torch.device = "cpu") -> Roofline:
    """Read bandwidth (`measure_read_bandwidth`) and fp32 matmul FLOP/s (an n x n product)."""
    return Roofline(measure_read_bandwidth(num_bytes, device=device), measure_matmul_flops(matmul_n, device=device))


@dataclass(frozen=True)
class StepTimes:
    """One model's decode steps at one batch size, one median per round."""

    name: str
    batch_size: int
    step_s: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.step_s)


def time_steps(models: dict, batch_sizes: list[int], num_rounds: int = 3, num_steps: int = 4,
               context_len: int = 16) -> list[StepTimes]:
    """Decode-step medians of every model in `models` at every batch size, in `num_rounds` rounds
    that alternate the models.  A model is a `CausalLM` (the bare model's steps over a contiguous
    cache of `context_len` tokens, `batching.time_decode_step`) or an `LLM` recording its trace
    (the engine's whole step: scheduling, paged attention, sampling; `time_engine_decode_step`)."""
    def one(model, b: int) -> float:
        if hasattr(model, "engine"):
            return time_engine_decode_step(model, b, num_steps).step_s
        return time_decode_step(model, b, context_len, num_steps).step_s

    samples: dict[tuple[str, int], list[float]] = {(n, b): [] for n in models for b in batch_sizes}
    for _ in range(num_rounds):
        for b in batch_sizes:
            for name, model in models.items():
                samples[name, b].append(one(model, b))
    return [StepTimes(n, b, tuple(s)) for (n, b), s in samples.items()]
