"""A model's batch-1 decode, setting by setting (dtype, quantization), against its weight-read floor.

Contract: `settings_vs_floor(model, settings)` (a model of a real shape, from
`real_shape.random_qwen3_folder`, or the shipped chef) measures each setting's batch-1 decode
through the whole engine (chapter 06's `decode_speed_table`: `LLM.generate` tokens/s, so the
scheduler, the sampler and Python are in the step; alternating repeats, each run paired with a
baseline run) and puts its step next to the floor its weight bytes set:

    floor  = weight bytes (`LLM.weight_bytes`: codes, scales, the bf16 embedding) / copy bandwidth
    step   = 1 / decode tokens per second
    step / floor ~ 1   the step is the weight read: fewer bytes (int8) give a faster step
    step / floor >> 1  the step is fixed per-step work (Python, launches, small operations):
                       fewer bytes buy nothing, and dequantizing can cost time

Its sibling `real_shape.step_vs_floor(model, batch_sizes)` times the model's forward alone
(`batching.time_decode_step`, no engine around it) at several batch sizes for one setting:
chapter 01 asks how a step grows with the batch, chapter 08 what a setting does to the whole
engine's step, so 08's steps are the longer by the engine's own per-step work.  Both floors
divide `batching.step_weight_bytes` by a measured bandwidth.

The same function measures the shipped chef, so a chapter can print both models side by side
and say which effect each one shows.
"""

from __future__ import annotations

import pandas as pd

from minilm_engine.course.experiments.batching import measure_copy_bandwidth
from minilm_engine.course.experiments.quantization import Setting, decode_speed_table


def settings_vs_floor(model, settings: list[Setting], num_tokens: int = 16, repeats: int = 5,
                  bandwidth: float | None = None) -> pd.DataFrame:
    """One row per setting: decode tokens/s (median of `repeats`; the first setting's over all
    its runs, the paired ones included), `speedup` (median of the paired ratios to the first
    setting), its step in ms, the weight bytes, the weight-read floor in ms and step / floor;
    `ratios` and `runs` keep the repeats.  `bandwidth` (bytes/s) is measured when
    not given (`batching.measure_copy_bandwidth`, a copy much larger than the cache)."""
    import statistics

    bandwidth = bandwidth or measure_copy_bandwidth()
    rows = decode_speed_table(model, settings, num_tokens=num_tokens, repeats=repeats)
    # The baseline ran again just before every run of every other setting (the pairs): its speed
    # is the median over all its runs, so it is measured across the same stretch of time as the
    # others, not only at the start (a shared machine's speed drifts).
    base_runs = list(rows[0]["runs"]) + [s / r for row in rows[1:] for s, r in zip(row["runs"], row["ratios"])]
    rows[0] = {**rows[0], "runs": base_runs, "tokens_per_s": statistics.median(base_runs)}
    table = pd.DataFrame(rows).set_index("setting")
    table["step ms"] = 1e3 / table["tokens_per_s"]
    table["floor ms"] = 1e3 * table["weight_bytes"] / bandwidth
    table["step / floor"] = table["step ms"] / table["floor ms"]
    table.attrs["bandwidth"] = bandwidth
    return table
