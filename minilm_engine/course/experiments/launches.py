"""Appendix A1's last experiment: how many operations a decode step launches, and what CUDA
graphs buy back.

Contract: `count_ops(fn)` runs `fn()` once and returns how many times each tensor operation was
dispatched (views, which launch nothing, left out); on a GPU each of these is at least one
kernel launch.  Triton kernels are not torch operations and are not counted.
`decode_tokens_per_s(llm, prompt, num_tokens)` is the batch-1 decode speed of one request, from
its token times; `graph_speedup(model_path, ...)` compares it between an engine that replays
CUDA graphs and one that runs eagerly (`enforce_eager=True`); it needs a CUDA GPU.
`padding_per_bucket(max_batch_size)` is the share of padding rows each batch size carries
when it runs in its graph's bucket.

Why it matters: a GPU runs a small kernel in a few microseconds, about what Python and the
driver take to launch one.  At batch 1 a decode step of a 28-layer model is hundreds of such
launches, so the GPU waits on the CPU; a graph launches them all with one call.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minilm_engine.worker.cuda_graphs import capture_sizes


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # `_unsafe_view` reshapes a fresh tensor: a view in all but its schema, no launch.
        if not func.is_view and func.overloadpacket.__name__ != "_unsafe_view":
            self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))


def count_ops(fn: Callable[[], object]) -> Counter[str]:
    """{operation name: calls} for every non-view tensor operation `fn()` dispatches."""
    counter = _OpCounter()
    with counter:
        fn()
    return counter.counts


def padding_per_bucket(max_batch_size: int) -> dict[int, float]:
    """batch size -> share of its bucket's rows that are padding (0 when a bucket fits exactly)."""
    sizes = capture_sizes(max_batch_size)
    return {b: 1 - b / next(s for s in sizes if s >= b) for b in range(1, max_batch_size + 1)}


@dataclass
class GraphSpeedup:
    graphs_tokens_per_s: float
    eager_tokens_per_s: float
    num_replays: int

    @property
    def ratio(self) -> float:
        return self.graphs_tokens_per_s / self.eager_tokens_per_s


def decode_tokens_per_s(llm, prompt, num_tokens: int) -> float:
    """Batch-1 decode tokens/s of one greedy request: 1 / the mean gap between its tokens (the
    prefill, before the first token, is left out)."""
    from minilm_engine import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=num_tokens, ignore_eos=True)
    (out,) = llm.generate([prompt], params, use_tqdm=False)
    return 1 / out.metrics.tpot


def graph_speedup(model_path, num_tokens: int = 128, prompt: str = "Order for table 7:", **llm_args) -> GraphSpeedup:
    """Batch-1 decode tokens/s with CUDA graphs and without (two engines on the same GPU)."""
    from minilm_engine import LLM

    if not torch.cuda.is_available():
        raise RuntimeError("graph_speedup needs a CUDA GPU: graphs are a CUDA feature")
    llm_args.setdefault("num_kv_blocks", 512)  # one request: left alone, each engine would take 90% of the GPU
    tokens_per_s = {}
    replays = 0
    for eager in (False, True):
        llm = LLM(model_path, device="cuda", enforce_eager=eager, max_num_seqs=1, record_trace=False, **llm_args)
        decode_tokens_per_s(llm, prompt, 8)  # warm-up
        tokens_per_s[eager] = decode_tokens_per_s(llm, prompt, num_tokens)
        if not eager:
            replays = llm.engine.decode_graphs.num_replays
        del llm
        torch.cuda.empty_cache()
    return GraphSpeedup(tokens_per_s[False], tokens_per_s[True], replays)
