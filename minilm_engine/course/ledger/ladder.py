"""The technique ladder: one workload served by ever better engines, each rung measured.

Contract: a rung is data, a name and the `LLM(...)` arguments that add one technique to the rung
before it (`compose` gives each rung its full arguments).  `run_ladder(rungs, workload)` builds
each rung's engine on this machine, serves the same workload with it and returns a
`RungResult` per rung: its `Measurement` (throughput,
latency, with provenance), or, for a rung whose arguments this version of the engine does not
accept, the reason it was not run; the rungs after a missing one build on the last rung that
ran, and say so.  No number is ever made up for a missing rung.

    rung                     LLM(...) arguments                      what it adds
    no KV cache              strategy="no_cache"                     (the chef remakes the broth
                                                                      for every spoonful)
    KV cache                 strategy="kv_cache"                     keys/values kept; 1 at a time
    static batching          strategy="static_batch"                 max_num_seqs padded together
    continuous batching      strategy="continuous", no prefix cache  seats refilled every step
    + prefix caching         enable_prefix_caching=True              shared prompt computed once
    + quantization           quantization="int8"                     weights in 8 bits
    + speculative decoding   speculative_config={...}                the apprentice guesses ahead

`verdicts(results)` puts the seed article's two claims next to the measured ladder.
"""

from __future__ import annotations

import gc
import inspect
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from minilm_engine.course.noodle_corpus import SYSTEM_PROMPT
from minilm_engine.core.config import EngineConfig
from minilm_engine.course.experiments.batching import timed_generate
from minilm_engine.course.experiments.workloads import LengthMix, Workload, mixed_workload
from minilm_engine.course.ledger.books import Ledger
from minilm_engine.course.ledger.measurement import Measurement
from minilm_engine.course.ledger.prices import Prices

BATCHING_STRATEGIES = ("static_batch", "continuous")


@dataclass(frozen=True)
class Rung:
    """One step of the ladder: the `LLM(...)` arguments it adds to (or changes in) the rung
    before it.  `compose` turns the steps into each rung's full arguments."""

    name: str
    adds: str  # the technique this rung adds, in a few words
    llm_kwargs: dict[str, Any] = field(default_factory=dict)


LADDER: tuple[Rung, ...] = (
    Rung("no KV cache", "recompute the whole sequence for every token", {"strategy": "no_cache"}),
    Rung("KV cache", "keep keys and values; one request at a time", {"strategy": "kv_cache"}),
    Rung("static batching", "a padded batch runs until its longest request ends",
         {"strategy": "static_batch"}),
    Rung("continuous batching", "a finished request's seat is refilled the next step",
         {"strategy": "continuous", "enable_prefix_caching": False}),
    Rung("+ prefix caching", "the shared system prompt is computed once",
         {"enable_prefix_caching": True}),
    Rung("+ quantization", "int8 weights: a quarter of fp32's bytes read per step (half of bf16's)",
         {"quantization": "int8"}),
    Rung("+ speculative decoding", "the apprentice drafts 3 tokens, the chef checks them at once",
         {"speculative_config": {"model": "noodle-apprentice", "num_speculative_tokens": 3}}),
)


def compose(rungs: Sequence[Rung]) -> list[tuple[Rung, str]]:
    """Each rung with its full `LLM` arguments (the last runnable rung's, updated with its
    own), and the reason it cannot run ("" when it can).  A rung this version lacks is left
    out of the ones after it, which say so in their `adds`."""
    composed, kwargs, skipped = [], {}, []
    for rung in rungs:
        missing = sorted(set(rung.llm_kwargs) - engine_arguments())
        full = {**kwargs, **rung.llm_kwargs}
        adds = rung.adds + (f" (without {', '.join(skipped)}: not in this version)"
                            if skipped else "")
        composed.append((Rung(rung.name, adds, full),
                         f"not available in this version: LLM has no {missing}" if missing else ""))
        if missing:
            skipped.append(rung.name)
        else:
            kwargs = full
    return composed


def engine_arguments() -> set[str]:
    """Every argument `BaselineLLM(...)` (the engine's `LLM` plus `strategy`) accepts in this
    version of the package."""
    from minilm_engine.course.baselines import BaselineLLM
    from minilm_engine.entrypoints.llm import LLM

    named = {
        name for cls in (LLM, BaselineLLM) for name, p in inspect.signature(cls.__init__).parameters.items()
        if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and name != "self"
    }
    return named | set(EngineConfig.__dataclass_fields__)


def missing_arguments(rung: Rung) -> list[str]:
    """The rung's `LLM` arguments this version of the engine does not have."""
    return sorted(set(rung.llm_kwargs) - engine_arguments())


# Mostly short answers, one in five long: static batching waits on the long ones.
LADDER_MIX = LengthMix(short=(8, 32), long=(96, 128), long_fraction=0.2)


def ladder_workload(
    num_requests: int = 16, seed: int = 0, shared_prefix: str = SYSTEM_PROMPT,
    mix: LengthMix = LADDER_MIX,
) -> Workload:
    """Noodle-shop prompts behind one shared system prompt (what prefix caching can reuse),
    with skewed output lengths (what static batching waits on); greedy, EOS ignored."""
    workload = mixed_workload(num_requests, seed, mix)
    return Workload([shared_prefix + p for p in workload.prompts], workload.sampling_params)


@dataclass
class RungResult:
    rung: Rung
    measurement: Measurement | None  # None: not run
    reason: str = ""  # why it was not run

    @property
    def available(self) -> bool:
        return self.measurement is not None


def rung_arguments(rung: Rung, common: dict, max_num_seqs: int) -> tuple[dict, dict]:
    """(the `LLM` arguments of `rung` over `common`, the settings a measurement records)."""
    kwargs = {**common, **rung.llm_kwargs}
    if kwargs.get("strategy", "continuous") in BATCHING_STRATEGIES:  # the others run 1 at a time
        kwargs.setdefault("max_num_seqs", max_num_seqs)
    settings = {"rung": rung.name, **{k: v for k, v in kwargs.items() if k != "speculative_config"}}
    if "speculative_config" in kwargs:
        settings["speculative"] = str(kwargs["speculative_config"])
    return kwargs, settings


def run_rung(
    rung: Rung, workload: Workload, *, model=None, device=None, max_num_seqs: int = 8,
    num_repeats: int = 1, machine: str | None = None, **common: Any,
) -> RungResult:
    """Serve `workload` with `LLM(model, **rung.llm_kwargs)` (full arguments, see `compose`;
    `measure_workload`); keep the fastest of
    `num_repeats` runs (on a shared machine, noise only ever adds time).  `common` are extra
    `LLM` arguments for every rung (e.g. num_kv_blocks)."""
    from minilm_engine.course.baselines import BaselineLLM

    missing = missing_arguments(rung)
    if missing:
        return RungResult(rung, None, f"not available in this version: LLM has no {missing}")
    kwargs, settings = rung_arguments(rung, common, max_num_seqs)
    best = None
    for _ in range(num_repeats):
        # A fresh engine per repeat: with prefix caching on, a second run of the same prompts
        # on the same engine would find every prompt cached and flatter the rung.
        try:
            llm = BaselineLLM(model, device=device, **kwargs)
        except (ValueError, TypeError, NotImplementedError) as e:
            # The arguments exist but this combination is refused (e.g. two techniques that
            # do not compose yet): said as the engine said it, and no numbers.
            return RungResult(rung, None, f"refused by this version: {type(e).__name__}: {e}")
        m = measure_workload(llm, workload, settings, machine=machine)
        if best is None or m.duration_s < best.duration_s:
            best = m
        del llm
        gc.collect()
    return RungResult(rung, best)


def measure_workload(
    llm, workload: Workload, settings: dict[str, Any], machine: str | None = None
) -> Measurement:
    """Serve `workload` with `llm` in one timed `generate` call, after a one-request warm-up,
    into a `Measurement` (with the engine's trace where there is one).  The warm-up also puts
    a shared system prompt in the prefix cache, as a server that has been up a while has it."""
    llm.generate(workload.prompts[:1], workload.sampling_params[:1], use_tqdm=False)
    timed = timed_generate(llm, workload)
    strategy = getattr(llm, "strategy_name", "continuous")
    computed = None if timed.records else computed_tokens(
        strategy, timed.outputs, llm.engine_config.max_num_seqs)
    return Measurement.from_outputs(
        timed.outputs, timed.wall_s, model=_model_name(llm), settings=settings,
        trace_records=timed.records, machine=machine, num_computed_tokens=computed,
    )


def computed_tokens(strategy: str, outputs: Sequence[Any], max_num_seqs: int) -> int:
    """Tokens the baseline strategies feed through the model for `outputs` (the continuous
    engine's own trace counts its tokens).  With P prompt and O output tokens per request:

        no_cache       every new token re-feeds the whole sequence:  sum of (P + i), i < O
        kv_cache       the prompt once, then one token per step:      P + O - 1
        static_batch   per batch of B rows, padded to the longest prompt and run until the
                       longest request ends:                          B * (max P + max O - 1)
    """
    lens = [(len(o.prompt_token_ids), len(o.outputs[0].token_ids)) for o in outputs]
    if strategy == "no_cache":
        return sum(o * p + o * (o - 1) // 2 for p, o in lens)
    if strategy == "kv_cache":
        return sum(p + o - 1 for p, o in lens)
    if strategy == "static_batch":
        total = 0
        for first in range(0, len(lens), max_num_seqs):
            batch = lens[first : first + max_num_seqs]
            total += len(batch) * (max(p for p, _ in batch) + max(o for _, o in batch) - 1)
        return total
    raise ValueError(f"no token count for strategy {strategy!r} without a trace")


def run_ladder(
    workload: Workload, rungs: Sequence[Rung] = LADDER, *, model=None, device=None,
    max_num_seqs: int = 8, num_repeats: int = 1, machine: str | None = None,
    progress: bool = False, **common: Any,
) -> list[RungResult]:
    """`run_rung` for each rung of `compose(rungs)` in order (see the module docstring)."""
    results = []
    for rung, reason in compose(rungs):
        result = RungResult(rung, None, reason) if reason else run_rung(
            rung, workload, model=model, device=device, max_num_seqs=max_num_seqs,
            num_repeats=num_repeats, machine=machine, **common)
        if progress:
            m = result.measurement
            print(f"{rung.name:24s} " + (f"{m.output_tokens_per_s:8.1f} output tokens/s"
                                         if m else result.reason), flush=True)
        results.append(result)
    return results


def _model_name(llm) -> str:
    path = str(llm.model_path)
    return path.rstrip("/").rsplit("/", 1)[-1]


# -- reading the ladder ------------------------------------------------------------------------


def ladder_rows(results: Sequence[RungResult], prices: Prices) -> list[dict[str, Any]]:
    """One row per rung: throughput, latency, cost per Mtok at `prices`, gains."""
    first = next((r.measurement for r in results if r.available), None)
    rows, previous = [], None
    for r in results:
        m = r.measurement
        if m is None:
            rows.append({"rung": r.rung.name, "adds": r.rung.adds, "output tokens/s": None,
                         "note": r.reason})
            continue
        books = Ledger(m, prices)
        rows.append({
            "rung": r.rung.name,
            "adds": r.rung.adds,
            "output tokens/s": m.output_tokens_per_s,
            "x first rung": m.output_tokens_per_s / first.output_tokens_per_s,
            "x previous": m.output_tokens_per_s / previous.output_tokens_per_s if previous else 1.0,
            "mean latency s": m.mean_e2e_s,
            "p99 latency s": m.e2e_s.get(99),
            "mean TTFT s": m.mean_ttft_s,
            "mean TPOT ms": None if m.mean_tpot_s is None else 1e3 * m.mean_tpot_s,
            f"cost {prices.currency}/Mtok": books.blended_cost_per_mtok,
            "note": "",
        })
        previous = m
    return rows


def ladder_table(results: Sequence[RungResult], prices: Prices):
    import pandas as pd

    return pd.DataFrame(ladder_rows(results, prices)).set_index("rung")


@dataclass(frozen=True)
class Verdict:
    claim: str
    measured: str
    verdict: str  # "held", "partly", "not held"


def verdicts(results: Sequence[RungResult], prices: Prices) -> list[Verdict]:
    """The seed's claims against the ladder: "hundreds -> thousands of tokens/s per card" (about
    ten times the throughput) and "30 -> under 10 per Mtok" (at least three times cheaper), from
    the first rung (no KV cache) and from a plain KV-cache server (batch 1) to the best rung."""
    by_name = {r.rung.name: r.measurement for r in results if r.available}
    if not by_name:
        raise ValueError("no rung of the ladder was measured")
    best_name = max(by_name, key=lambda n: by_name[n].output_tokens_per_s)
    best = by_name[best_name]
    baselines = [(n, by_name[n]) for n in ("no KV cache", "KV cache") if n in by_name]
    if not baselines:
        first = next(r for r in results if r.available)
        baselines = [(first.rung.name, first.measurement)]
    out = []
    gains = {n: best.output_tokens_per_s / m.output_tokens_per_s for n, m in baselines}
    base_text = "; ".join(
        f"{m.output_tokens_per_s:,.0f} ({n}) -> {best.output_tokens_per_s:,.0f} ({best_name}), "
        f"{gains[n]:.2f}x" for n, m in baselines)
    top = max(gains.values())
    low = min(gains.values())
    out.append(Verdict(
        "throughput: hundreds -> thousands of tokens/s per card (about 10x)",
        f"output tokens/s {base_text}",
        "held" if low >= 10 else "partly" if top >= 3 else "not held",
    ))
    costs = {n: Ledger(m, prices).blended_cost_per_mtok for n, m in baselines}
    best_cost = Ledger(best, prices).blended_cost_per_mtok
    cost_text = "; ".join(
        f"{prices.money(costs[n], 3)} ({n}) -> {prices.money(best_cost, 3)} per Mtok, "
        f"{costs[n] / best_cost:.2f}x cheaper" for n, _ in baselines)
    out.append(Verdict(
        "cost: 30 -> under 10 per Mtok (at least 3x cheaper)",
        cost_text,
        "held" if low >= 3 else "partly" if top >= 3 else "not held",
    ))
    return out


# -- keeping a measured ladder -------------------------------------------------------------------


def results_to_json(results: Sequence[RungResult]) -> list[dict[str, Any]]:
    """JSON-able data for a measured ladder; `results_from_json` reads it back."""
    return [
        {"rung": {"name": r.rung.name, "adds": r.rung.adds, "llm_kwargs": r.rung.llm_kwargs},
         "measurement": None if r.measurement is None else r.measurement.to_dict(),
         "reason": r.reason}
        for r in results
    ]


def results_from_json(data: Sequence[dict[str, Any]]) -> list[RungResult]:
    return [
        RungResult(Rung(**d["rung"]),
                   None if d["measurement"] is None else Measurement.from_dict(d["measurement"]),
                   d.get("reason", ""))
        for d in data
    ]
