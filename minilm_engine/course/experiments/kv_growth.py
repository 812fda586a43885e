"""Chapter 02's measurements: what the KV cache saves in time, and what it costs in memory.

Contract: the timing functions run the package's real strategies ("no_cache" recomputes the
whole sequence every step, "kv_cache" keeps keys and values) through `LLM.generate` with greedy
decoding and EOS ignored, so both produce exactly `num_tokens` identical tokens;
`token_time_rounds` alternates them round by round and, in each round, also times the bare
model's decode step with `batching.time_decode_step` (the timer chapter 01 uses too).  The memory
functions are arithmetic on a `ModelConfig`, plus `measure_kv_growth`, which steps the paged
engine and reads how many KV blocks one request holds after each step.

Work per generated token, for a prompt of P tokens and N new tokens:

    no_cache:  step i feeds all P + i tokens     -> sum over i of (P + i) = N*P + N(N-1)/2   O(N^2)
    kv_cache:  step 0 feeds P, later steps feed 1 -> P + N - 1                             O(N)

and the cache holds, per token, one key and one value vector per layer and per KV head:

    kv bytes per token = 2 (K and V) x num_layers x num_kv_heads x head_dim x bytes per element
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from minilm_engine.model.attention.kv_cache import PagedKVCache
from minilm_engine.model.config import ModelConfig
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.batching import time_decode_step

GiB = 1 << 30


# -- time: recompute vs cache ----------------------------------------------------------------


def num_token_passes(num_prompt_tokens: int, num_new_tokens: int, cached: bool) -> int:
    """Tokens pushed through the model to generate `num_new_tokens` (see the module docstring)."""
    if num_new_tokens < 1:
        return 0
    if cached:
        return num_prompt_tokens + num_new_tokens - 1
    return num_new_tokens * num_prompt_tokens + num_new_tokens * (num_new_tokens - 1) // 2


def num_attention_key_reads(num_prompt_tokens: int, num_new_tokens: int, cached: bool) -> int:
    """Keys the queries read in attention (per layer and head) to generate `num_new_tokens`.

    Causal attention over T tokens reads T(T+1)/2 keys.  With the cache the prompt's square is
    computed once and each new token's one query reads the P+i keys before it: quadratic in N.
    Without it every step recomputes the whole square of P+i tokens: cubic.  The cache makes the
    token passes linear (`num_token_passes`); attention's work it only takes down one power.
    """
    if num_new_tokens < 1:
        return 0
    P = num_prompt_tokens
    if cached:
        return P * (P + 1) // 2 + sum(P + i + 1 for i in range(1, num_new_tokens))
    return sum((P + i) * (P + i + 1) // 2 for i in range(num_new_tokens))


def mla_kv_bytes_per_token(num_layers: int, kv_lora_rank: int, qk_rope_head_dim: int, bytes_per_element: int = 2) -> int:
    """Multi-head latent attention (DeepSeek-V2/V3): each layer caches one compressed latent of
    `kv_lora_rank` numbers and one decoupled RoPE key of `qk_rope_head_dim`, shared by all heads,
    instead of a key and a value per KV head."""
    return num_layers * (kv_lora_rank + qk_rope_head_dim) * bytes_per_element


def sequence_kv_bytes(kv_bytes_per_token: int, num_tokens: int, sliding_window: int | None = None) -> int:
    """KV bytes one sequence holds after `num_tokens` tokens; a sliding-window layer keeps only the
    last `sliding_window` tokens (a rolling buffer), so its cache stops growing."""
    held = num_tokens if sliding_window is None else min(num_tokens, sliding_window)
    return kv_bytes_per_token * held


def _greedy(num_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)


def time_generation(llm, prompt: str, num_tokens: int) -> float:
    """Seconds to generate exactly `num_tokens` tokens for one prompt (wall clock)."""
    start = time.perf_counter()
    (out,) = llm.generate(prompt, _greedy(num_tokens), use_tqdm=False)
    elapsed = time.perf_counter() - start
    if len(out.outputs[0].token_ids) != num_tokens:
        raise RuntimeError(f"asked for {num_tokens} tokens, got {len(out.outputs[0].token_ids)}")
    return elapsed


@dataclass(frozen=True)
class TokenTimes:
    """When each output token of one generation appeared."""

    strategy: str
    num_prompt_tokens: int
    token_ids: list[int]
    latencies_s: list[float]  # [i] = time to produce output token i (i = 0 includes the prefill)

    @property
    def positions(self) -> list[int]:
        """Position in the sequence of the token each step fed last (P - 1 for the first)."""
        return [self.num_prompt_tokens - 1 + i for i in range(len(self.latencies_s))]

    @property
    def total_s(self) -> float:
        return sum(self.latencies_s)


def measure_token_times(llm, prompt: str, num_tokens: int, num_repeats: int = 1) -> TokenTimes:
    """Per-token latencies of one greedy generation, the elementwise minimum of `num_repeats`
    runs (noise on a shared machine only adds time)."""
    best: list[float] | None = None
    for _ in range(num_repeats):
        (out,) = llm.generate(prompt, _greedy(num_tokens), use_tqdm=False)
        m = out.metrics
        latencies = [m.token_times[0] - m.first_scheduled_time, *m.inter_token_latencies]
        best = latencies if best is None else [min(a, b) for a, b in zip(best, latencies)]
    return TokenTimes(getattr(llm, "strategy_name", "continuous"), len(out.prompt_token_ids), out.outputs[0].token_ids, best)


@dataclass(frozen=True)
class TokenTimeRounds:
    """Alternating rounds of one generation per strategy, plus the bare model's decode step.

    `runs[name][i]`: strategy `name`'s token times in round i (each strategy generated once per
    round, taking turns, so a burst of load elsewhere hits every strategy of a round).
    `decode_step_s[i]`: in the same round, `batching.time_decode_step` at batch 1 (the one
    decode-step timer chapters 01 and 02 share: the model alone, contiguous cache, argmax) on the
    "kv_cache" LLM's model at context `decode_context_len`.
    """

    runs: dict[str, list[TokenTimes]]
    decode_step_s: list[float]
    decode_context_len: int

    def fastest(self, name: str) -> TokenTimes:
        """Strategy `name`'s token times, each token's fastest over the rounds (noise only adds)."""
        runs = self.runs[name]
        latencies = [min(times) for times in zip(*(run.latencies_s for run in runs))]
        return TokenTimes(runs[0].strategy, runs[0].num_prompt_tokens, runs[0].token_ids, latencies)

    def per_token_s(self, name: str, start: int = 1, stop: int | None = None) -> list[float]:
        """Per round, the median time of output tokens [start, stop) (token 0 holds the prefill)."""
        return [statistics.median(run.latencies_s[start:stop]) for run in self.runs[name]]


def token_time_rounds(
    llms: dict[str, object], prompt: str, num_tokens: int, num_rounds: int = 5, num_decode_steps: int = 16
) -> TokenTimeRounds:
    """`num_rounds` rounds; in each, every LLM generates `num_tokens` once (`measure_token_times`),
    then the "kv_cache" LLM's bare model is timed by `time_decode_step` at batch 1, at the
    context of the middle of the generation.  See `TokenTimeRounds`."""
    if num_rounds < 1:
        raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
    if "kv_cache" not in llms:
        raise ValueError(f"the decode step is timed on the 'kv_cache' LLM's model; got {sorted(llms)}")
    runs: dict[str, list[TokenTimes]] = {name: [] for name in llms}
    steps: list[float] = []
    context_len = None
    for _ in range(num_rounds):
        for name, llm in llms.items():
            runs[name].append(measure_token_times(llm, prompt, num_tokens))
        if context_len is None:
            context_len = runs["kv_cache"][0].num_prompt_tokens + num_tokens // 2
        steps.append(time_decode_step(llms["kv_cache"].model, 1, context_len, num_decode_steps).step_s)
    return TokenTimeRounds(runs, steps, context_len)


def compare_strategies(
    llms: dict[str, object], prompt: str, lengths: list[int], num_repeats: int = 2
) -> list[dict[str, float]]:
    """For each length, the fastest of `num_repeats` generations with each LLM.

    The LLMs take turns inside every repeat, so a burst of load from elsewhere hits both.
    Returns one row per length: {"num_new_tokens": n, name: seconds, ..., "repeats_s": {name:
    [seconds of each repeat]}} (repeat i of two LLMs ran back to back: a paired measurement).
    """
    rows = []
    for n in lengths:
        repeats: dict[str, list[float]] = {name: [] for name in llms}
        for _ in range(num_repeats):
            for name, llm in llms.items():
                repeats[name].append(time_generation(llm, prompt, n))
        rows.append({"num_new_tokens": n, **{name: min(r) for name, r in repeats.items()}, "repeats_s": repeats})
    return rows


# -- memory: bytes per token and what fits ---------------------------------------------------


def kv_bytes_per_token(config: ModelConfig, bytes_per_element: int = 2) -> int:
    """KV-cache bytes of one token, spelled out (`ModelConfig.kv_bytes_per_token` is the same)."""
    num_vectors = 2 * config.num_hidden_layers * config.num_key_value_heads  # a K and a V each
    return num_vectors * config.head_dim * bytes_per_element


def weight_bytes(config: ModelConfig, bytes_per_element: int = 2) -> int:
    """Bytes of the weights, from the parameter count the shapes imply."""
    return config.num_parameters() * bytes_per_element


def max_cached_tokens(config: ModelConfig, memory_bytes: int, bytes_per_element: int = 2) -> int:
    """How many tokens of KV cache fit in `memory_bytes` once the weights are loaded (weights
    and cache in the same dtype); 0 when the weights alone do not fit."""
    free = memory_bytes - weight_bytes(config, bytes_per_element)
    return max(0, free // kv_bytes_per_token(config, bytes_per_element))


def kv_capacity_rows(
    configs: dict[str, ModelConfig], memory_gib: list[float], bytes_per_element: int = 2
) -> list[dict[str, float | int | str]]:
    """One row per model: weights, KV per token, and tokens that fit next to the weights
    in each memory size (GiB)."""
    rows: list[dict[str, float | int | str]] = []
    for name, config in configs.items():
        row: dict[str, float | int | str] = {
            "model": name,
            "params (B)": config.num_parameters() / 1e9,
            "weights (GiB)": weight_bytes(config, bytes_per_element) / GiB,
            "layers": config.num_hidden_layers,
            "kv heads": config.num_key_value_heads,
            "head_dim": config.head_dim,
            "KV KiB/token": kv_bytes_per_token(config, bytes_per_element) / 1024,
        }
        for gib in memory_gib:
            num_tokens = max_cached_tokens(config, int(gib * GiB), bytes_per_element)
            row[f"tokens in {gib:g} GiB"] = num_tokens
        rows.append(row)
    return rows


# -- memory, measured: one request growing in the paged engine -------------------------------


@dataclass(frozen=True)
class KVGrowthPoint:
    """KV memory of one request after one engine step."""

    step: int
    num_tokens: int  # tokens whose keys/values are in the cache
    exact_bytes: int  # num_tokens x kv bytes per token: what the tokens themselves need
    paged_bytes: int  # blocks in the request's block table x bytes per block
    contiguous_bytes: int  # what a contiguous cache reserves for it up front


def measure_kv_growth(
    llm, prompt: str, max_tokens: int, ignore_eos: bool = True
) -> list[KVGrowthPoint]:
    """Run one greedy request through the paged engine (`strategy="continuous"`) step by step
    and record, after each step, the KV bytes it holds.

    The contiguous figure is what `strategy="kv_cache"` allocates for the same request: room for
    prompt + max_tokens tokens, reserved before the first step.  The step that finishes the
    request frees its blocks at once, so it is not recorded.
    """
    engine = llm.engine
    if engine.has_unfinished_requests():
        raise RuntimeError("measure_kv_growth needs an idle engine (other requests hold blocks)")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    (request,) = llm.make_requests(prompt, params)
    element = torch.empty((), dtype=llm.model.dtype).element_size()
    per_token = llm.config.kv_bytes_per_token(element)
    per_block = PagedKVCache.bytes_per_block(llm.config, engine.config.block_size, llm.model.dtype)
    reserved = (request.num_prompt_tokens + request.max_new_tokens) * per_token
    engine.add_prepared_request(request)
    points = []
    step = 0
    while True:
        engine.step()  # raises rather than loop forever if the pool is too small
        if request.finished:
            break
        num_blocks = len(engine.block_manager.get_block_table(request.request_id))
        points.append(
            KVGrowthPoint(
                step=step,
                num_tokens=request.num_computed_tokens,
                exact_bytes=request.num_computed_tokens * per_token,
                paged_bytes=num_blocks * per_block,
                contiguous_bytes=reserved,
            )
        )
        step += 1
    return points


# -- pictures --------------------------------------------------------------------------------


def token_times_figure(runs: list[TokenTimes], title: str = ""):
    """Time to produce each output token against its position, one line per strategy."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for run in runs:
        # The first token includes the prompt's prefill: drawn as a marker, not on the line.
        fig.add_trace(go.Scatter(
            x=run.positions[1:], y=[s * 1e3 for s in run.latencies_s[1:]], mode="lines",
            name=run.strategy,
        ))
    fig.update_layout(
        title=title or "Time per generated token as the sequence grows",
        xaxis_title="position of the token fed to the model",
        yaxis_title="ms per token (fastest of the repeats)",
        height=420,
    )
    return fig


def strategy_times_figure(rows: list[dict[str, float]], title: str = ""):
    """Total generation time against the number of new tokens, one line per strategy."""
    import plotly.graph_objects as go

    lengths = [row["num_new_tokens"] for row in rows]
    names = [key for key in rows[0] if key not in ("num_new_tokens", "repeats_s")]
    fig = go.Figure([
        go.Scatter(x=lengths, y=[row[name] for row in rows], mode="lines+markers", name=name)
        for name in names
    ])
    fig.update_layout(
        title=title or "Total time to generate N tokens",
        xaxis_title="new tokens N", yaxis_title="seconds (fastest of the repeats)", height=420,
    )
    return fig


def kv_growth_figure(points: list[KVGrowthPoint], title: str = ""):
    """KV bytes held by one request as it grows: needed, paged (blocks) and contiguous."""
    import plotly.graph_objects as go

    x = [p.num_tokens for p in points]
    series = {
        "contiguous reservation (prompt + max_tokens)": [p.contiguous_bytes for p in points],
        "paged: blocks held": [p.paged_bytes for p in points],
        "needed: tokens x bytes per token": [p.exact_bytes for p in points],
    }
    fig = go.Figure([
        go.Scatter(x=x, y=[b / 1024 for b in ys], name=name, mode="lines",
                   line_shape="hv" if name.startswith("paged") else "linear")
        for name, ys in series.items()
    ])
    fig.update_layout(
        title=title or "KV cache of one request as it generates",
        xaxis_title="tokens in the cache", yaxis_title="KiB of KV cache", height=420,
    )
    return fig
