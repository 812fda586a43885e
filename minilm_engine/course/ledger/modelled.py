"""What this CPU cannot show: a big model's cost ladder on datacenter GPUs, modelled, and the prices
it is set against, quoted with their sources and dates.

Contract: `modelled_ladder(config, datasheet, ...)` runs chapter 01's roofline (a step costs the
larger of its bytes over the read bandwidth and its FLOPs over the matmul peak,
`course/experiments/roofline.py`) over one workload (every request `prompt_len` tokens in,
`output_len` out) for each `ModelledRung`, on `num_gpus` devices sharing the weights by tensor
parallelism.  Every number it returns is a projection, not a measurement, and optimistic: full
bandwidth and peak FLOP/s, no communication between the devices, no scheduler or sampler time.

    no KV cache      every new token recomputes the whole sequence so far (compute-bound)
    KV cache         one token a step; a step reads the weights once and each request's KV
    batch B          B requests share every weight read; each reads its own KV cache
    weight bytes     bytes per parameter read each step (2: bf16, 1: fp8 / int8)

Per rung: tokens/s = B * output_len / (prefill time + decode time), and cost per million output
tokens = num_gpus * price per GPU-hour / (tokens/s * 3600) * 1e6 (prompt tokens ride along).
`QUOTED` holds the prices the chapter sets beside it: each with its primary source and the date
it was read.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from minilm_engine.course.experiments.roofline import Datasheet


@dataclass(frozen=True)
class Quote:
    """A price someone publishes: the value, its unit, what it is for, where and when it was read."""

    value: float
    unit: str
    what: str
    source: str  # the provider's own page
    read: str  # when the price was read (prices move: always print it)


QUOTED = {
    "H100, Lambda": Quote(3.99, "$/GPU-hour", "8x H100 SXM on demand", "https://lambda.ai/pricing", "2026-09"),
    "H100, AWS": Quote(55.04 / 8, "$/GPU-hour", "p5.48xlarge (8x H100 SXM) on demand, us-east-1, per GPU",
                       "https://aws.amazon.com/ec2/pricing/on-demand/", "2026-11"),
    "Llama 3.1 70B, Together": Quote(0.88, "$/Mtok", "Llama 3.1 70B Instruct Turbo, input and output",
                                     "https://www.together.ai/pricing", "2025"),
}


@dataclass(frozen=True)
class ModelledRung:
    name: str
    batch_size: int
    kv_cache: bool = True
    bytes_per_param: int = 2


DEFAULT_RUNGS = (
    ModelledRung("no KV cache, batch 1, bf16", 1, kv_cache=False),
    ModelledRung("KV cache, batch 1, bf16", 1),
    ModelledRung("KV cache, batch 8, bf16", 8),
    ModelledRung("continuous batching, batch 64, bf16", 64),
    ModelledRung("+ 8-bit weights, batch 64", 64, bytes_per_param=1),
)


def _params(config) -> tuple[int, int]:
    """(matmul parameters a step multiplies by, KV bytes per token in bf16) of a `ModelConfig`."""
    c = config
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    per_layer = c.hidden_size * (q + 2 * kv) + q * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    return c.num_hidden_layers * per_layer + c.vocab_size * c.hidden_size, 2 * c.num_hidden_layers * kv * 2


def modelled_ladder(config, datasheet: Datasheet, num_gpus: int, price_per_gpu_hour: float, prompt_len: int = 512,
                    output_len: int = 256, rungs: tuple[ModelledRung, ...] = DEFAULT_RUNGS) -> pd.DataFrame:
    """One row per rung: modelled step time, output tokens/s and cost per million output tokens."""
    params, kv_per_token = _params(config)
    bandwidth = datasheet.roofline.read_bandwidth * num_gpus
    flops = datasheet.roofline.matmul_flops * num_gpus
    rows = []
    for rung in rungs:
        weight_bytes = rung.bytes_per_param * params
        b = rung.batch_size
        if rung.kv_cache:
            prefill_s = 2 * params * b * prompt_len / flops  # compute-bound: hundreds of tokens a weight read
            decode_s = 0.0
            for t in range(output_len):
                read = weight_bytes + b * (prompt_len + t) * kv_per_token
                decode_s += max(read / bandwidth, 2 * params * b / flops)
        else:  # every token recomputes the sequence so far: prefill-sized work for each one
            prefill_s = 0.0
            decode_s = sum(max(weight_bytes / bandwidth, 2 * params * b * (prompt_len + t) / flops)
                           for t in range(output_len))
        tokens_per_s = b * output_len / (prefill_s + decode_s)
        rows.append({"rung": rung.name, "batch": b, "weight GB": weight_bytes / 1e9,
                     "decode step ms": 1e3 * decode_s / output_len, "output tok/s": tokens_per_s,
                     "$/Mtok output": num_gpus * price_per_gpu_hour / (tokens_per_s * 3600) * 1e6})
    table = pd.DataFrame(rows).set_index("rung")
    table.attrs["setup"] = (f"modelled: {config.num_hidden_layers}-layer model, {params / 1e9:.0f}B matmul parameters, "
                            f"on {num_gpus}x {datasheet.name} ({datasheet.source}), {prompt_len} tokens in, "
                            f"{output_len} out, at {price_per_gpu_hour:.2f} $/GPU-hour; peak bandwidth and FLOP/s, "
                            "no communication")
    return table
