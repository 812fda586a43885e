"""Where the exercises' stored cases come from: random inputs answered by the package's own code.

Contract: `SOURCES[fixture]` pairs a case maker (`rng -> JSON-able inputs`) with the package
function that answers those inputs.  `build_fixture(name)` draws `NUM_CASES` cases with a fixed
seed and answers them; `write_fixtures()` stores every fixture in `course/teaching/fixtures/` (run by
`scripts/make_exercise_fixtures.py`).  tests/test_exercises.py rebuilds them and compares, so a
change in the engine that changes an answer shows up as a failing test, not as a checker that
silently teaches the old behaviour.  Notebooks never import this module: its answers are what
the checkers must not hand out.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minilm_engine.course.experiments.kernel_stats import decode_kv_bytes
from minilm_engine.core.kv_cache_utils import slot_mapping
from minilm_engine.core.spec_decode_stats import expected_tokens_per_round
from minilm_engine.course.experiments.cost import cost_per_million_tokens
from minilm_engine.course.experiments.kv_growth import kv_bytes_per_token, max_cached_tokens
from minilm_engine.course.experiments.toy_simulator import continuous_num_steps, static_padding_waste
from minilm_engine.course.teaching import (
    exercises_batching,
    exercises_cost_kv,
    exercises_kernels,
    exercises_ledger,
    exercises_paging,
    exercises_serving,
    exercises_spec,
)
from minilm_engine.course.teaching.exercises import FIXTURES_DIR

NUM_CASES = 50
SEED = 0


@dataclass(frozen=True)
class FixtureSource:
    make_case: Callable[[random.Random], dict[str, Any]]
    answer: Callable[[dict[str, Any]], Any]  # stored inputs -> the expected value


def _with_config(fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda raw: fn(**{**raw, "config": exercises_cost_kv.model_config(raw["config"])})


def _decoded(decode, fn: Callable[..., Any]) -> Callable[[dict[str, Any]], Any]:
    return lambda raw: fn(**decode(raw))


SOURCES: dict[str, FixtureSource] = {
    "cost_per_million_tokens": FixtureSource(
        exercises_cost_kv.make_cost_case, lambda raw: cost_per_million_tokens(**raw)
    ),
    "continuous_num_steps": FixtureSource(
        exercises_batching.make_batching_case, lambda raw: continuous_num_steps(**raw)
    ),
    "static_padding_waste": FixtureSource(
        exercises_batching.make_batching_case, lambda raw: static_padding_waste(**raw)
    ),
    "kv_bytes_per_token": FixtureSource(
        exercises_cost_kv.make_kv_case, _with_config(kv_bytes_per_token)
    ),
    "max_cached_tokens": FixtureSource(
        exercises_cost_kv.make_fit_case, _with_config(max_cached_tokens)
    ),
    "slot_mapping": FixtureSource(
        exercises_paging.make_slot_mapping_case,
        lambda raw: slot_mapping(**raw),
    ),
    "cached_prefix_blocks": FixtureSource(
        exercises_paging.make_cached_prefix_case,
        lambda raw: exercises_paging.engine_cached_prefix_blocks(**raw),
    ),
    "prefill_chunks": FixtureSource(
        exercises_paging.make_prefill_chunks_case,
        lambda raw: exercises_paging.engine_prefill_chunks(**raw),
    ),
    "decode_kv_bytes": FixtureSource(
        exercises_kernels.make_decode_bytes_case,
        _decoded(
            exercises_kernels.decode_dtype,
            lambda num_heads, **rest: decode_kv_bytes(**rest),  # GQA: query heads read nothing
        ),
    ),
    "tokens_per_round": FixtureSource(
        exercises_spec.make_tokens_per_round_case, lambda raw: expected_tokens_per_round(**raw)
    ),
    "tail_and_goodput": FixtureSource(
        exercises_serving.make_case,
        lambda raw: [float(v) for v in exercises_serving.engine_tail_and_goodput(**raw)],  # JSON: a list
    ),
    "break_even_output_price": FixtureSource(
        exercises_ledger.make_break_even_case,
        lambda raw: exercises_ledger.engine_break_even_output_price(**raw),
    ),
    "gpus_for_load": FixtureSource(
        exercises_ledger.make_fleet_case, lambda raw: exercises_ledger.engine_gpus_for_load(**raw)
    ),
}


def build_fixture(name: str, num_cases: int = NUM_CASES, seed: int = SEED) -> list[dict[str, Any]]:
    """`num_cases` cases of one exercise with their expected answers, as JSON-able dicts."""
    source = SOURCES[name]
    rng = random.Random(f"{name}:{seed}")
    cases = []
    for _ in range(num_cases):
        # A JSON round trip first, so the answer is computed from exactly what gets stored
        # (dict keys become strings; the exercise's decode turns them back).
        raw = json.loads(json.dumps(source.make_case(rng)))
        cases.append({"inputs": raw, "expected": source.answer(_decode_for(name, raw))})
    return cases


def _decode_for(name: str, raw: dict[str, Any]) -> dict[str, Any]:
    if name == "cached_prefix_blocks":
        return {**raw, "cached": {int(h): b for h, b in raw["cached"].items()}}
    return raw


def write_fixtures(directory: Path = FIXTURES_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for name in SOURCES:
        path = directory / f"{name}.json"
        lines = ",\n".join(json.dumps(case) for case in build_fixture(name))  # a case a line
        path.write_text(f"[\n{lines}\n]\n")
        paths.append(path)
    return paths
