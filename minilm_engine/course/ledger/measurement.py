"""What a ledger entry is computed from: one measured run, and where and how it was measured.

Contract: a `Measurement` holds the totals of one run (requests, input tokens, of which cached,
output tokens, wall time), optional latency percentiles (TTFT, TPOT, end to end) and the offered
request rate, plus a `Provenance` (machine, model, settings, date, source).  It is built from

    Measurement.from_outputs(outputs, duration_s, ...)   offline `LLM.generate` results
                                                         (+ the engine's trace, optional)
    Measurement.from_bench_json(dict | path)             a `bench serve` result file
    Measurement.sweep_from_bench_json(dict | path)       every point of a `--sweep` result
    Measurement.from_dict(...)                           what `to_dict()` wrote

and never changes once built.  Readers of foreign files are tolerant (vLLM's key names, ours,
strings for numbers, missing optional keys) and strict about what the arithmetic needs: a
missing or non-positive duration, or a missing token total, is a `ValueError` naming the key.
`fit_token_seconds` splits the engine's step times between prompt and output tokens, which is
what prices input and output tokens differently (chapter 04: prefill vs decode).
"""

from __future__ import annotations

import datetime
import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from minilm_engine.course.machine import describe_machine
from minilm_engine.course.experiments.batching import percentile

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class Provenance:
    """Which measurement a number came from."""

    machine: str
    model: str
    settings: dict[str, Any] = field(default_factory=dict)
    date: str = ""  # ISO 8601, UTC
    source: str = ""  # "generate", "bench serve", ...

    def describe(self) -> str:
        settings = ", ".join(f"{k}={v}" for k, v in self.settings.items())
        return (
            f"{self.source or 'measured'} on {self.machine}, model {self.model}"
            + (f" ({settings})" if settings else "")
            + (f", {self.date}" if self.date else "")
        )


def this_machine() -> str:
    """One line naming this machine (`machine.describe_machine`) and the torch threads it ran with."""
    import torch

    if torch.cuda.is_available():
        return describe_machine()
    return f"{describe_machine()}, {torch.get_num_threads()} torch thread(s)"


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Measurement:
    """Totals of one measured run on `num_gpus` accelerators (or one CPU machine)."""

    provenance: Provenance
    num_requests: int
    num_input_tokens: int  # prompt tokens billed, cached ones included
    num_output_tokens: int
    duration_s: float  # wall time of the run
    num_cached_input_tokens: int = 0  # prompt tokens served from the prefix cache
    num_gpus: int = 1
    request_rate: float | None = None  # offered requests/s; None = all at once
    ttft_s: dict[int, float] = field(default_factory=dict)  # percentile -> seconds
    tpot_s: dict[int, float] = field(default_factory=dict)
    e2e_s: dict[int, float] = field(default_factory=dict)
    mean_ttft_s: float | None = None
    mean_tpot_s: float | None = None
    mean_e2e_s: float | None = None
    # seconds of engine time one prompt token / one output token costs (fit_token_seconds)
    input_token_s: float | None = None
    output_token_s: float | None = None
    # tokens fed through the model, padding and recomputation included (None: not known)
    num_computed_tokens: int | None = None
    peak_kv_blocks: int | None = None  # most KV blocks in use at once (paged engine)

    def __post_init__(self) -> None:
        for name in ("num_requests", "num_input_tokens", "num_output_tokens",
                     "num_cached_input_tokens", "num_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        if self.num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {self.num_gpus}")
        if self.num_cached_input_tokens > self.num_input_tokens:
            raise ValueError(
                f"num_cached_input_tokens ({self.num_cached_input_tokens}) > num_input_tokens "
                f"({self.num_input_tokens})"
            )
        if not _positive_number(self.duration_s):
            raise ValueError(f"duration_s must be a positive finite number, got {self.duration_s!r}")

    # -- rates ----------------------------------------------------------------------------------

    @property
    def output_tokens_per_s(self) -> float:
        """Output tokens per second of the whole run: the ledger's denominator."""
        return self.num_output_tokens / self.duration_s

    @property
    def input_tokens_per_s(self) -> float:
        return self.num_input_tokens / self.duration_s

    @property
    def requests_per_s(self) -> float:
        return self.num_requests / self.duration_s

    @property
    def input_token_weight(self) -> float | None:
        """What one prompt token costs in output tokens (from `fit_token_seconds`), or None."""
        if self.input_token_s is None or not self.output_token_s:
            return None
        return self.input_token_s / self.output_token_s

    def describe(self) -> str:
        return (
            f"{self.num_requests} requests, {self.num_input_tokens:,} input tokens "
            f"({self.num_cached_input_tokens:,} cached), {self.num_output_tokens:,} output tokens "
            f"in {self.duration_s:.2f} s = {self.output_tokens_per_s:,.0f} output tokens/s; "
            f"{self.provenance.describe()}"
        )

    # -- readers --------------------------------------------------------------------------------

    @classmethod
    def from_outputs(
        cls,
        outputs: Sequence[Any],
        duration_s: float,
        *,
        model: str,
        settings: Mapping[str, Any] | None = None,
        trace_records: Sequence[Any] | None = None,
        machine: str | None = None,
        num_gpus: int = 1,
        request_rate: float | None = None,
        num_computed_tokens: int | None = None,
    ) -> "Measurement":
        """From `LLM.generate` results (`RequestOutput`s) and the wall time of the call.

        `trace_records` (the continuous engine's `engine.trace.records` for exactly this run)
        adds the prefix-cache hits, the tokens computed, the peak KV blocks and the split of step
        time between prompt and output tokens.  `num_computed_tokens` gives the tokens computed
        where no trace exists (see `ladder.computed_tokens`).
        """
        if not outputs:
            raise ValueError("outputs must not be empty")
        metrics = [o.metrics for o in outputs if getattr(o, "metrics", None) is not None]
        ttfts = [m.ttft for m in metrics if m.ttft is not None]
        tpots = [m.tpot for m in metrics if m.tpot is not None]
        e2es = [m.e2e_latency for m in metrics if m.e2e_latency is not None]
        num_cached, input_s, output_s, peak_blocks = 0, None, None, None
        if trace_records:
            num_cached = sum(c.num_cached_tokens for r in trace_records for c in r.chunks)
            input_s, output_s = fit_token_seconds(trace_records)
            peak_blocks = max(r.num_used_blocks for r in trace_records)
            if num_computed_tokens is None:
                num_computed_tokens = sum(r.num_prefill_tokens + r.num_decode_tokens
                                          for r in trace_records)
        return cls(
            provenance=Provenance(
                machine=machine or this_machine(),
                model=model,
                settings=dict(settings or {}),
                date=utc_now(),
                source="generate",
            ),
            num_requests=len(outputs),
            num_input_tokens=sum(len(o.prompt_token_ids) for o in outputs),
            num_output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
            duration_s=duration_s,
            num_cached_input_tokens=num_cached,
            num_gpus=num_gpus,
            request_rate=request_rate,
            ttft_s=_percentiles(ttfts),
            tpot_s=_percentiles(tpots),
            e2e_s=_percentiles(e2es),
            mean_ttft_s=_mean(ttfts),
            mean_tpot_s=_mean(tpots),
            mean_e2e_s=_mean(e2es),
            input_token_s=input_s,
            output_token_s=output_s,
            num_computed_tokens=num_computed_tokens,
            peak_kv_blocks=peak_blocks,
        )

    @classmethod
    def from_bench_json(
        cls, result: Mapping[str, Any] | str | os.PathLike, *, machine: str | None = None
    ) -> "Measurement":
        """From a `bench serve` result: a dict, or the path of its JSON file.

        Required: the duration (`duration` or `duration_s`, seconds), the completed requests
        (`completed`, `num_completed` or `num_requests`) and the token totals (`total_input_tokens`,
        `total_output_tokens`).  Optional: `request_rate` ("inf" = all at once),
        `max_concurrency`, `model_id` / `model`, `date`, `num_gpus`, `machine`,
        `total_cached_tokens`, and latencies in milliseconds, each as `mean_ttft_ms`,
        `median_ttft_ms` / `p50_ttft_ms`, `p90_ttft_ms`, `p99_ttft_ms` (same for `tpot` and
        `e2el`; what vLLM's and this package's `bench serve` write), as `ttft_ms: {"mean",
        "median", "p90", "p99"}` (what this package's `bench serve` wrote before), or as
        `percentiles_ttft_ms: [[50, value], ...]`.  Unknown keys go into the provenance's
        settings when they are small scalars, so nothing measured is lost.
        """
        result = _read_json(result)
        if not isinstance(result, Mapping):
            raise ValueError(f"a bench serve result must be a JSON object, got {type(result).__name__}")
        duration = _number(result, ("duration", "duration_s"), required=True)
        num_requests = _count(result, ("completed", "num_requests", "num_completed"), required=True)
        num_input = _count(result, ("total_input_tokens", "total_input", "num_input_tokens"),
                           required=True)
        num_output = _count(result, ("total_output_tokens", "num_output_tokens"), required=True)
        rate = _number(result, ("request_rate",))
        rate = None if rate is None or math.isinf(rate) else rate
        known = {"duration", "duration_s", "completed", "num_requests", "num_completed",
                 "total_input_tokens", "total_input", "num_input_tokens", "total_output_tokens",
                 "num_output_tokens", "request_rate", "date", "model_id", "model", "machine",
                 "num_gpus", "total_cached_tokens"}
        settings = {
            k: v for k, v in result.items()
            if k not in known and isinstance(v, (str, int, float, bool)) and not _is_latency(k)
            and not k.endswith("_throughput") and len(str(v)) <= 80
        }
        if rate is not None or "request_rate" in result:
            settings["request_rate"] = result.get("request_rate")
        ttft, mean_ttft = _latencies(result, "ttft")
        tpot, mean_tpot = _latencies(result, "tpot")
        e2e, mean_e2e = _latencies(result, "e2el")
        return cls(
            provenance=Provenance(
                machine=str(result.get("machine") or machine or "unknown machine"),
                model=str(result.get("model_id") or result.get("model") or "unknown model"),
                settings=settings,
                date=str(result.get("date") or ""),
                source="bench serve",
            ),
            num_requests=num_requests,
            num_input_tokens=num_input,
            num_output_tokens=num_output,
            duration_s=duration,
            num_cached_input_tokens=_count(result, ("total_cached_tokens",)) or 0,
            num_gpus=_count(result, ("num_gpus",)) or 1,
            request_rate=rate,
            ttft_s=ttft, tpot_s=tpot, e2e_s=e2e,
            mean_ttft_s=mean_ttft, mean_tpot_s=mean_tpot, mean_e2e_s=mean_e2e,
        )

    @classmethod
    def sweep_from_bench_json(
        cls, result: Mapping[str, Any] | str | os.PathLike, *, machine: str | None = None
    ) -> list["Measurement"]:
        """Every point of a `bench serve --sweep` result (`{"sweep": [result, ...]}`), or the
        one point of a single result, in order."""
        result = _read_json(result)
        if isinstance(result, Mapping) and isinstance(result.get("sweep"), Sequence):
            return [cls.from_bench_json(point, machine=machine) for point in result["sweep"]]
        return [cls.from_bench_json(result, machine=machine)]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able data; `from_dict` reads it back."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        data = dict(data)
        data["provenance"] = Provenance(**data["provenance"])
        for name in ("ttft_s", "tpot_s", "e2e_s"):  # JSON turned the int keys into strings
            data[name] = {int(k): float(v) for k, v in (data.get(name) or {}).items()}
        return cls(**data)


# -- splitting step time between prompt and output tokens ------------------------------------


def fit_token_seconds(records: Sequence[Any]) -> tuple[float | None, float | None]:
    """Seconds one prompt token and one output token cost, fitted over the engine's steps.

    Each step's wall time is modelled as `a * prefill_tokens + b * decode_tokens`, fitted by
    least squares over the steps of `engine.trace.records`.  The fixed per-step
    cost has no term of its own: it lands mostly on `b`, because nearly every step decodes, and
    that is fair: decode steps are the ones that pay it over and over.  Returns (None, None)
    when the steps cannot separate the two (no prefill or no decode step, or a fit that makes
    one kind of token free or negative).
    """
    import numpy as np

    rows = [(r.num_prefill_tokens, r.num_decode_tokens, r.duration_s) for r in records]
    if not any(p for p, _, _ in rows) or not any(d for _, d, _ in rows):
        return None, None
    data = np.array(rows, dtype=float)
    x, y = data[:, :2], data[:, 2]
    # A coefficient at or below zero means these steps cannot tell the two kinds of token
    # apart (a kind that costs nothing is noise, not a measurement): no split then.
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    if a <= 0 or b <= 0:
        return None, None
    return float(a), float(b)


# -- tolerant readers ----------------------------------------------------------------------------


def _read_json(result: Any) -> Any:
    """`result` itself, or the JSON in the file it names."""
    if not isinstance(result, (str, os.PathLike)):
        return result
    path = Path(result)
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not JSON: {e}") from None


def _positive_number(value: Any) -> bool:
    return (not isinstance(value, bool) and isinstance(value, (int, float))
            and math.isfinite(value) and value > 0)


def _as_float(key: str, value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError(f"{key} must be a number, got {value!r}")
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None


def _number(result: Mapping[str, Any], keys: tuple[str, ...], required: bool = False) -> float | None:
    for key in keys:
        if result.get(key) is not None:
            value = _as_float(key, result[key])
            if required and not (math.isfinite(value) and value > 0):
                raise ValueError(f"{key} must be a positive finite number, got {result[key]!r}")
            return value
    if required:
        raise ValueError(f"the result has no {' or '.join(repr(k) for k in keys)}")
    return None


def _count(result: Mapping[str, Any], keys: tuple[str, ...], required: bool = False) -> int | None:
    for key in keys:
        if result.get(key) is not None:
            value = _as_float(key, result[key])
            if not (value >= 0 and value == int(value)):
                raise ValueError(f"{key} must be a whole number >= 0, got {result[key]!r}")
            return int(value)
    if required:
        raise ValueError(f"the result has no {' or '.join(repr(k) for k in keys)}")
    return None


def _is_latency(key: str) -> bool:
    return key.endswith("_ms") or key.startswith("percentiles_")


def _latencies(result: Mapping[str, Any], metric: str) -> tuple[dict[int, float], float | None]:
    """Percentiles (seconds) and the mean of one latency metric given in milliseconds."""
    found: dict[int, float] = {}
    pairs = result.get(f"percentiles_{metric}_ms")
    if isinstance(pairs, Sequence) and not isinstance(pairs, str):
        for pair in pairs:
            if isinstance(pair, Sequence) and len(pair) == 2:
                q, value = pair
                found[int(_as_float(f"percentiles_{metric}_ms", q))] = (
                    _as_float(f"percentiles_{metric}_ms", value) / 1e3
                )
    nested = result.get(f"{metric}_ms")  # {"mean": .., "median": .., "p90": .., "p99": ..}
    if isinstance(nested, Mapping):
        for key, value in nested.items():
            q = 50 if key == "median" else int(key[1:]) if key[:1] == "p" and key[1:].isdigit() \
                else None
            if q is not None and value is not None:
                found[q] = _as_float(f"{metric}_ms.{key}", value) / 1e3
        mean = nested.get("mean")
        if mean is not None:
            return found, _as_float(f"{metric}_ms.mean", mean) / 1e3
    for key in (f"median_{metric}_ms", f"p50_{metric}_ms"):
        if result.get(key) is not None:
            found[50] = _as_float(key, result[key]) / 1e3
    for q in (90, 95, 99, 999):
        key = f"p{q}_{metric}_ms"
        if result.get(key) is not None:
            found[q] = _as_float(key, result[key]) / 1e3
    mean = result.get(f"mean_{metric}_ms")
    return found, None if mean is None else _as_float(f"mean_{metric}_ms", mean) / 1e3


def _percentiles(values: list[float]) -> dict[int, float]:
    return {q: percentile(values, q) for q in PERCENTILES} if values else {}


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None
