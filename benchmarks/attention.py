"""Attention on the CPU: the torch reference against the CPU backend, in whole model steps.

Times, on a Qwen3-0.6B-shaped model (random weights, the fused CPU path), one prefill of T
tokens and one decode step of B sequences each holding C cached tokens, with the attention
backend "torch" (the readable reference: it writes the T x L scores and gathers every key into
a padded copy) and "cpu" (attention/cpu.py: SDPA's flash kernel for the prompt, the compiled
paged decode that reads each key once where it lies).  Same model, same cache, the two backends
alternating in every round; a cell is the median of the rounds, with their spread [min-max].
The reference's score tensor per layer (H x T x L float32, written and read back) is printed
beside the prefill rows: it is what the CPU backend does not write.

    python benchmarks/attention.py --threads 2                    # full size (minutes)
    python benchmarks/attention.py --prefill 512 --decode 8x1024  # one of each
    python benchmarks/attention.py --quick                        # a tiny config (the smoke test)
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from common import QUICK_OVERRIDES, QWEN3_0_6B, add_threads_option, apply_threads_option

from minilm_engine import LLM
from minilm_engine.course.experiments.batching import hardware_summary
from minilm_engine.course.experiments.quantization import write_random_qwen3
from minilm_engine.course.experiments.real_shape import default_dtype
from minilm_engine.course.known_configs import KNOWN_CONFIGS
from minilm_engine.model.attention.backends import get_attention_backend
from minilm_engine.model.attention.context import PagedAttention
from minilm_engine.model.attention.paged import HostMetadata, PagedAttentionMetadata
from minilm_engine.model.attention.kv_cache import PagedKVCache

BLOCK_SIZE = 16


def metadata(num_queries: list[int], context_lens: list[int]) -> PagedAttentionMetadata:
    """Sequences side by side, each in its own run of blocks (sequence s: blocks after s - 1's),
    the last num_queries[s] of its context_lens[s] tokens new this step."""
    widths = [-(-n // BLOCK_SIZE) for n in context_lens]
    starts = np.cumsum([0] + widths[:-1])
    tables = np.zeros((len(widths), max(widths)), dtype=np.int64)
    slots = []
    for s, (start, width) in enumerate(zip(starts, widths)):
        tables[s, :width] = np.arange(start, start + width)
        first = context_lens[s] - num_queries[s]
        slots += [start * BLOCK_SIZE + p for p in range(first, context_lens[s])]  # contiguous blocks
    host = HostMetadata(np.cumsum([0] + num_queries).astype(np.int64), np.array(context_lens, dtype=np.int64), tables)
    return PagedAttentionMetadata(torch.tensor(slots), torch.from_numpy(host.query_start_loc),
                                  torch.from_numpy(host.context_lens), torch.from_numpy(tables),
                                  max_query_len=max(num_queries), host=host)


def step(model, cache, meta: PagedAttentionMetadata, backend) -> None:
    """One forward pass of the step's new tokens (random ids), and the logits of each sequence's
    last token: what an engine step computes before sampling."""
    host = meta.host
    positions = torch.from_numpy(np.concatenate(
        [np.arange(c - q, c) for q, c in zip(host.num_queries, host.context_lens)]))
    ids = torch.randint(0, model.config.vocab_size, positions.shape)
    hidden = model(ids, positions, PagedAttention(cache, meta, backend))  # (N, hidden)
    model.compute_logits(hidden[torch.from_numpy(host.query_start_loc[1:] - 1)])


def time_backends(model, cache, meta, backends: dict, num_rounds: int) -> dict[str, list[float]]:
    """Seconds of one step per backend and round, the backends alternating (order flipped every
    round), after one warm-up call each."""
    times = {name: [] for name in backends}
    for backend in backends.values():
        step(model, cache, meta, backend)
    for r in range(num_rounds):
        for name in (list(backends) if r % 2 == 0 else list(reversed(backends))):
            start = time.perf_counter()
            step(model, cache, meta, backends[name])
            times[name].append(time.perf_counter() - start)
    return times


def cell(seconds: list[float]) -> str:
    ms = [s * 1e3 for s in seconds]
    return f"{statistics.median(ms):9.1f} ms [{min(ms):.1f}-{max(ms):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tiny config, short sequences, one round")
    parser.add_argument("--prefill", default="512,2048", help="prompt lengths T (comma-separated; '' for none)")
    parser.add_argument("--decode", default="8x512,8x2048", help="decode steps BxC: B sequences of C cached tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--num-layers", type=int, default=None, help="fewer layers (same shapes per layer)")
    parser.add_argument("--dtype", default=None, help="float32 or bfloat16 (default: bfloat16 where native, else float32)")
    parser.add_argument("--json", type=Path, default=None)
    add_threads_option(parser, default=2, why="the issue's machine has 2 cores")
    args = parser.parse_args()
    apply_threads_option(args)
    prefills = [int(t) for t in args.prefill.split(",") if t]
    decodes = [tuple(int(n) for n in d.split("x")) for d in args.decode.split(",") if d]
    if args.quick:
        prefills, decodes = sorted({min(t, 64) for t in prefills}), sorted({(b, min(c, 64)) for b, c in decodes})
    num_rounds = 1 if args.quick else args.rounds
    dtype = args.dtype or default_dtype("cpu")

    print(hardware_summary())
    results = {"hardware": hardware_summary(), "dtype": dtype, "rows": []}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "model"
        fields = {k: v for k, v in KNOWN_CONFIGS[QWEN3_0_6B].items() if k not in ("architectures", "torch_dtype")}
        fields.update(QUICK_OVERRIDES if args.quick else {})
        if args.num_layers:
            fields["num_hidden_layers"] = args.num_layers
        write_random_qwen3(folder, **fields)
        llm = LLM(folder, dtype=dtype, record_trace=False, kv_cache_memory=1 << 20)
        model, config = llm.model, llm.config
        backends = {"torch": get_attention_backend("torch", "cpu"), "cpu": get_attention_backend("cpu", "cpu")}
        kernel = "compiled paged decode" if backends["cpu"].micro is not None else "SDPA (no compiled kernel)"
        print(f"\n{QWEN3_0_6B} shape{' (tiny, --quick)' if args.quick else ''}, {config.num_hidden_layers} layers, "
              f"{dtype}, model backend {llm.model_backend}; cpu backend decodes with the {kernel}; "
              f"{num_rounds} round(s)\n")
        print(f"{'step':<22} {'torch (reference)':<30} {'cpu (attention/cpu.py)':<30} speedup  reference's scores")
        cases = [(f"prefill T={t}", [t], [t]) for t in prefills]
        cases += [(f"decode B={b} C={c}", [1] * b, [c] * b) for b, c in decodes]
        for label, num_queries, context_lens in cases:
            num_blocks = sum(-(-n // BLOCK_SIZE) for n in context_lens)
            cache = PagedKVCache(config, num_blocks, BLOCK_SIZE, model.dtype, "cpu")
            for layer in range(config.num_hidden_layers):  # cached tokens: random keys and values
                cache.k[layer].normal_()
                cache.v[layer].normal_()
            meta = metadata(num_queries, context_lens)
            with torch.inference_mode():
                times = time_backends(model, cache, meta, backends, num_rounds)
            scores = sum(q * c for q, c in zip(num_queries, context_lens)) * config.num_attention_heads * 4
            print(f"{label:<22} {cell(times['torch']):<30} {cell(times['cpu']):<30} "
                  f"{statistics.median(times['torch']) / statistics.median(times['cpu']):6.2f}x  "
                  f"{scores / 2**20:.0f} MiB per layer")
            results["rows"].append({"step": label, "num_queries": num_queries[0], "num_seqs": len(num_queries),
                                    "context_len": context_lens[0], **{f"{k}_s": v for k, v in times.items()}})
            del cache
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
