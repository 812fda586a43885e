"""Back-of-envelope serving arithmetic the interview drills compute: parallelism, MoE, low-bit
GEMMs, speculation trees, routing, LoRA adapters.

Contract: pure functions of shapes and rates, no I/O.  Every hardware figure a caller may use
lives in `LINKS` (interconnects) or `drills.GPUS` (chips) with its source; a model's shape comes
from `course/known_configs.py` or, for the MoE model the dense table cannot describe,
`MOE_SHAPES` (copied from its `config.json`).  Each function states the model it assumes (ring
all-reduce, uniform routing, independent draft candidates), because an interviewer will ask.
"""

from __future__ import annotations

import math

from minilm_engine.model.config import ModelConfig

# Interconnect bandwidth per direction, bytes/s, quoted (a link's "bidirectional" figure halved):
#   NVLink 4 (H100 SXM): 900 GB/s bidirectional -> 450 GB/s each way
#       https://glennklockwood.com/garden/processors/h100 ("900 GB/s NVLink (D2D)", NVIDIA, 2022);
#       https://github.com/scaleway/docs-content/pull/5834.patch ("900 GB/s of bidirectional", 2025)
#   PCIe Gen5 x16 (H100): 128 GB/s bidirectional -> 64 GB/s each way
#       https://glennklockwood.com/garden/processors/h100 ("128 GB/s PCIe Gen5 (H2D)", NVIDIA, 2022)
#   NVLink 3 (A100 SXM): 600 GB/s bidirectional -> 300 GB/s each way
#       https://gist.github.com/askainet/forked (AWS p4d table, "NVLink gen 3 (600 GB/s)", 2020)
#   InfiniBand NDR (ConnectX-7, one port): 400 Gb/s = 50 GB/s each way
#       https://docs.nvidia.com/networking/display/mms4x00ns400/overview (NVIDIA, 2022)
LINKS = {
    "NVLink4": 450e9,
    "PCIe5": 64e9,
    "NVLink3": 300e9,
    "IB-NDR": 50e9,
}

# A mixture-of-experts shape (the dense `ModelConfig` has no experts), from
# https://huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json; the paper states
# "47B parameters, but only uses 13B active parameters" (arXiv:2401.04088, Mistral AI, 2024).
MOE_SHAPES = {
    "Mixtral-8x7B": {
        "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
        "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
        "vocab_size": 32000, "num_experts": 8, "top_k": 2,
    },
}

# OCP FP8 E4M3: largest finite value 448 ("FP8 Formats for Deep Learning", arXiv:2209.05433, 2022).
FP8_E4M3_MAX = 448.0


def ring_allreduce_s(num_bytes: float, num_gpus: int, link_bytes_per_s: float) -> float:
    """Bandwidth term of a ring all-reduce: each GPU sends and receives 2(N-1)/N of the buffer
    (a reduce-scatter then an all-gather), so time = 2(N-1)/N x bytes / per-direction link rate.
    Per-message latency (a few microseconds per hop) is ignored: it dominates small buffers."""
    return 2 * (num_gpus - 1) / num_gpus * num_bytes / link_bytes_per_s


def tp_allreduce_bytes_per_layer(config: ModelConfig, num_tokens: int, bytes_per_element: float = 2) -> float:
    """Megatron-style tensor parallelism all-reduces the (tokens, hidden) activation twice per
    layer: after the attention output projection and after the MLP down projection."""
    return 2 * num_tokens * config.hidden_size * bytes_per_element


def pipeline_bubble_fraction(num_stages: int, num_microbatches: int) -> float:
    """GPipe's idle fraction: (p - 1) / (m + p - 1); stages wait while the pipe fills and drains."""
    return (num_stages - 1) / (num_microbatches + num_stages - 1)


def expected_distinct(num_bins: int, num_draws: int, picks_per_draw: int = 1) -> float:
    """Expected number of bins hit when each draw picks `picks_per_draw` of `num_bins` uniformly
    (distinct experts a batch touches; replicas a shared prefix lands on under random routing):
    num_bins x (1 - (1 - picks/num_bins) ** draws)."""
    return num_bins * (1 - (1 - picks_per_draw / num_bins) ** num_draws)


def moe_parameters(name: str) -> dict[str, float]:
    """Total, active-per-token, and one expert's parameters of a `MOE_SHAPES` model (SwiGLU
    experts of 3 x hidden x intermediate, a router of hidden x experts, untied embeddings)."""
    s = MOE_SHAPES[name]
    h, d = s["hidden_size"], s["head_dim"]
    q, kv = s["num_attention_heads"] * d, s["num_key_value_heads"] * d
    attn = h * q + 2 * h * kv + q * h
    expert = 3 * h * s["intermediate_size"]
    shared_per_layer = attn + h * s["num_experts"] + 2 * h  # attention, router, two norms
    embed_and_head = 2 * s["vocab_size"] * h + h  # + final norm
    layers = s["num_hidden_layers"]
    return {
        "total": embed_and_head + layers * (shared_per_layer + s["num_experts"] * expert),
        "active": embed_and_head + layers * (shared_per_layer + s["top_k"] * expert),
        "expert": expert,
        "non_expert": embed_and_head + layers * shared_per_layer,
    }


def moe_bytes_read_per_step(name: str, batch: int, bytes_per_element: float = 2) -> float:
    """Weight bytes one decode step reads: every non-expert weight, plus in each layer the experts
    the batch's tokens route to (uniform, independent top-k routing assumed)."""
    s, p = MOE_SHAPES[name], moe_parameters(name)
    touched = expected_distinct(s["num_experts"], batch, s["top_k"])
    return (p["non_expert"] + s["num_hidden_layers"] * touched * p["expert"]) * bytes_per_element


def ep_all_to_all_bytes(name: str, num_tokens: int, bytes_per_element: float = 2) -> float:
    """Expert parallelism: every layer sends each token's hidden state to its top-k experts'
    GPUs (dispatch) and gets the outputs back (combine); the upper bound, all experts remote."""
    s = MOE_SHAPES[name]
    return 2 * num_tokens * s["top_k"] * s["hidden_size"] * bytes_per_element * s["num_hidden_layers"]


def bytes_per_weight(bits: int, group_size: int | None = None, scale_bytes: int = 2) -> float:
    """Storage of one quantized weight: bits / 8, plus one fp16 scale shared by a group."""
    return bits / 8 + (scale_bytes / group_size if group_size else 0)


def gemm_time_per_weight(batch: int, weight_bytes: float, flops: float, bandwidth: float) -> float:
    """Roofline time per weight element of a (batch x K) @ (K x N) GEMM: the weight is read once
    (weight_bytes) and used for 2 x batch FLOPs; activations are small next to the weight."""
    return max(weight_bytes / bandwidth, 2 * batch / flops)


def smoothquant_scale(act_max: float, weight_max: float, alpha: float = 0.5) -> float:
    """SmoothQuant's per-input-channel factor s = max|X|^alpha / max|W|^(1 - alpha): X / s and
    s x W give the same product with the activation outlier moved into the weight."""
    return act_max**alpha / weight_max ** (1 - alpha)


def tree_tokens_per_step(alpha: float, widths: list[int]) -> float:
    """Expected tokens per verification of a draft tree with `widths[d]` candidates at depth d+1
    below the accepted path, if each candidate matches the target independently with
    probability alpha: 1 + sum_d prod_{i<=d} (1 - (1 - alpha) ** widths[i]) (the bonus token is
    the 1).  widths all 1 is a chain: (1 - alpha^(K+1)) / (1 - alpha)."""
    total, reach = 1.0, 1.0
    for width in widths:
        reach *= 1 - (1 - alpha) ** width
        total += reach
    return total


def tree_num_nodes(widths: list[int]) -> int:
    """Draft tokens a full tree verifies in one target pass: sum_d prod_{i<=d} widths[i]."""
    return sum(math.prod(widths[: d + 1]) for d in range(len(widths)))


def bf16_spacing(x: float) -> float:
    """Gap between adjacent bf16 numbers near x: 8 significant bits, so 2^(floor(log2|x|) - 7)."""
    return 2.0 ** (math.floor(math.log2(abs(x))) - 7)


# LoRA target modules -> (in, out) features of the projection they adapt.
def lora_module_shapes(config: ModelConfig) -> dict[str, tuple[int, int]]:
    h, d, inter = config.hidden_size, config.head_dim, config.intermediate_size
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}


def lora_parameters(config: ModelConfig, rank: int, modules: list[str]) -> int:
    """A LoRA adapter adds A (rank x in) and B (out x rank) per targeted projection per layer."""
    shapes = lora_module_shapes(config)
    return config.num_hidden_layers * sum(rank * sum(shapes[m]) for m in modules)


def lora_flops_fraction(config: ModelConfig, rank: int, modules: list[str]) -> float:
    """Extra FLOPs of the adapter over the projections it adapts: r(in + out) / (in x out)."""
    shapes = lora_module_shapes(config)
    return sum(rank * (i + o) for i, o in (shapes[m] for m in modules)) / sum(i * o for i, o in (shapes[m] for m in modules))
