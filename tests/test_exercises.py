"""The exercise checkers: stored cases equal to the package's answers, feedback on every kind of
wrong answer, the edge each hint names covered, and no answer one attribute away."""

from __future__ import annotations

import json

import pytest
import torch

from minilm_engine.model.config import ModelConfig
from minilm_engine.course.teaching import exercise_fixtures
from minilm_engine.course.teaching.exercises import FIXTURES_DIR, Exercise, close, exact
from minilm_engine.course.teaching.exercises_batching import continuous_steps, static_padding
from minilm_engine.course.teaching.exercises_cost_kv import (
    COST_PER_MILLION,
    KV_BYTES_PER_TOKEN,
    MAX_CACHED_TOKENS,
    model_config,
)
from minilm_engine.course.teaching.exercises_kernels import decode_kv_bytes_exercise
from minilm_engine.course.teaching.exercises_ledger import BREAK_EVEN, GPUS_FOR_LOAD
from minilm_engine.course.teaching.exercises_paging import (
    cached_prefix_exercise,
    prefill_chunks_exercise,
    slot_mapping_exercise,
)
from minilm_engine.course.teaching.exercises_serving import tail_and_goodput_exercise
from minilm_engine.course.teaching.exercises_spec import tokens_per_round_exercise

ALL = [
    COST_PER_MILLION, continuous_steps, static_padding, KV_BYTES_PER_TOKEN, MAX_CACHED_TOKENS,
    slot_mapping_exercise, cached_prefix_exercise, prefill_chunks_exercise,
    decode_kv_bytes_exercise, tokens_per_round_exercise, tail_and_goodput_exercise, BREAK_EVEN,
    GPUS_FOR_LOAD,
]


def stub(**_):
    raise NotImplementedError


@pytest.mark.parametrize("name", sorted(exercise_fixtures.SOURCES))
def test_stored_cases_are_what_the_package_answers_today(name: str) -> None:
    stored = json.loads((FIXTURES_DIR / f"{name}.json").read_text())
    assert stored == exercise_fixtures.build_fixture(name), (
        f"{name}.json is stale: run scripts/make_exercise_fixtures.py"
    )


def test_every_exercise_has_a_fixture_and_no_callable_reference() -> None:
    assert {e.fixture for e in ALL} == set(exercise_fixtures.SOURCES)
    for exercise in ALL:
        assert len(exercise.cases) == exercise_fixtures.NUM_CASES
        assert not hasattr(exercise, "reference") and not hasattr(exercise, "make_case")
        assert exercise.solutions and exercise.shows


@pytest.mark.parametrize("exercise", ALL, ids=[e.fixture for e in ALL])
def test_wrong_answers_get_feedback_not_a_traceback(exercise: Exercise) -> None:
    result = exercise.check(stub)
    assert not result.passed and "not implemented" in result.message
    for wrong_type in (lambda **_: None, lambda **_: "42", lambda **_: object(), lambda **_: (1,)):
        result = exercise.check(wrong_type)
        assert not result.passed and "expected" in result.message

    def buggy(**_):
        raise KeyError("oops")

    assert "raised KeyError" in exercise.check(buggy).message
    assert "pass your function" in exercise.check(42).message
    # A comparison that itself raises (e.g. an object whose == raises) is feedback too.

    class Weird:
        def __eq__(self, other):
            raise TypeError("cannot compare")

    assert "raised TypeError" in Exercise("x", exercise.fixture, compare=lambda g, w: g == w).check(
        lambda **_: Weird()
    ).message


def test_exact_wants_the_right_kind() -> None:
    assert exact([1, 2], [1, 2]) and not exact((1, 2), [1, 2]) and not exact(3.0, 3)
    assert exact(torch.tensor(3).item(), 3) and not exact(True, 1)
    assert close(1.0 + 1e-12, 1.0) and not close("1.0", 1.0) and not close(None, 1.0)
    message = slot_mapping_exercise.check(lambda block_table, block_size, start, end: tuple(
        block_table[p // block_size] * block_size + p % block_size for p in range(start, end)
    )).message
    assert "(a tuple; expected a list)" in message


# -- chapter 00 / 01 ---------------------------------------------------------------------------


def test_cost_checker() -> None:
    right = lambda price_per_hour, tokens_per_second: price_per_hour / (tokens_per_second * 3600) * 1e6  # noqa: E731
    assert COST_PER_MILLION.check(right).passed
    per_second = COST_PER_MILLION.check(
        lambda price_per_hour, tokens_per_second: price_per_hour / tokens_per_second * 1e6
    )
    assert not per_second.passed and "expected" in per_second.message


def test_batching_checkers_cover_the_edges_and_the_usual_mistake() -> None:
    inputs = [c["inputs"] for c in continuous_steps.cases]
    assert any(not c["lengths"] for c in inputs), "an empty list of requests"
    assert any(c["num_seats"] == 1 and c["lengths"] for c in inputs), "a single seat"
    assert any(c["num_seats"] > len(c["lengths"]) > 0 for c in inputs), "more seats than requests"
    import heapq

    def right(lengths, num_seats):
        free_at = [0] * num_seats
        for length in lengths:
            heapq.heappush(free_at, heapq.heappop(free_at) + length)
        return max(free_at) if lengths else 0

    assert continuous_steps.check(right).passed
    # perfect packing, as if requests could be split across seats
    assert not continuous_steps.check(lambda lengths, num_seats: -(-sum(lengths) // num_seats)).passed
    assert not continuous_steps.check(lambda lengths, num_seats: max(free for free in [0, *lengths])).passed

    def padding(lengths, num_seats):
        tables = [lengths[i:i + num_seats] for i in range(0, len(lengths), num_seats)]
        return sum(max(t) - n for t in tables for n in t)

    assert static_padding.check(padding).passed
    assert not static_padding.check(lambda lengths, num_seats: padding(lengths, 1 + num_seats)).passed


# -- chapter 02 --------------------------------------------------------------------------------


def test_kv_checker_cannot_be_passed_by_asking_the_config() -> None:
    config = KV_BYTES_PER_TOKEN.decode(KV_BYTES_PER_TOKEN.cases[0]["inputs"])["config"]
    assert not hasattr(config, "kv_bytes_per_token")
    asks = KV_BYTES_PER_TOKEN.check(lambda config, bytes_per_element: config.kv_bytes_per_token(bytes_per_element))
    assert not asks.passed and "AttributeError" in asks.message
    right = lambda config, bytes_per_element: (  # noqa: E731
        2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * bytes_per_element
    )
    assert KV_BYTES_PER_TOKEN.check(right).passed
    query_heads = KV_BYTES_PER_TOKEN.check(
        lambda config, bytes_per_element: 2 * config.num_hidden_layers * config.num_attention_heads
        * config.head_dim * bytes_per_element
    )
    assert not query_heads.passed and "num_key_value_heads=" in query_heads.message
    hidden_over_heads = KV_BYTES_PER_TOKEN.check(
        lambda config, bytes_per_element: 2 * config.num_hidden_layers * config.num_key_value_heads
        * (config.hidden_size // config.num_attention_heads) * bytes_per_element
    )
    assert not hidden_over_heads.passed

    def fit(config, memory_bytes, bytes_per_element):
        free = memory_bytes - config.num_parameters() * bytes_per_element
        return max(0, free // right(config, bytes_per_element))

    assert MAX_CACHED_TOKENS.check(fit).passed
    assert not MAX_CACHED_TOKENS.check(
        lambda config, memory_bytes, bytes_per_element: memory_bytes // right(config, bytes_per_element)
    ).passed
    assert not MAX_CACHED_TOKENS.check(  # negative when the weights do not fit
        lambda config, memory_bytes, bytes_per_element: (
            (memory_bytes - config.num_parameters() * bytes_per_element) // right(config, bytes_per_element)
        )
    ).passed


def test_exercise_config_has_the_parameter_count_of_the_full_config() -> None:
    raw = KV_BYTES_PER_TOKEN.cases[3]["inputs"]
    config = KV_BYTES_PER_TOKEN.decode(raw)["config"]
    assert config.num_parameters() == model_config(raw["config"]).num_parameters()
    assert isinstance(model_config(raw["config"]), ModelConfig)


# -- chapters 03 / 04 --------------------------------------------------------------------------


def test_paging_checkers() -> None:
    from minilm_engine.core.block_pool import hash_block_tokens

    def slots(block_table, block_size, start, end):
        return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]

    assert slot_mapping_exercise.check(slots).passed
    assert not slot_mapping_exercise.check(
        lambda block_table, block_size, start, end: [block_table[p // block_size] + p % block_size for p in range(start, end)]
    ).passed

    def walk(token_ids, block_size, cached, chain=True, cap=True, stop=True):
        hits, parent = [], None
        num_blocks = (len(token_ids) - 1) // block_size if cap else len(token_ids) // block_size
        for i in range(num_blocks):
            parent = hash_block_tokens(parent if chain else None, token_ids[i * block_size : (i + 1) * block_size])
            if parent in cached:
                hits.append(cached[parent])
            elif stop:
                break
        return hits

    assert cached_prefix_exercise.check(walk).passed
    for mistake in ({"chain": False}, {"cap": False}, {"stop": False}):
        assert not cached_prefix_exercise.check(lambda m=mistake, **case: walk(**case, **m)).passed, mistake

    def chunks(num_prompt_tokens, num_decoding, max_num_batched_tokens, decoders_first=True):
        out, remaining = [], num_prompt_tokens
        while remaining:
            out.append(min(remaining, max_num_batched_tokens - (num_decoding if decoders_first else 0)))
            remaining -= out[-1]
        return out

    assert prefill_chunks_exercise.check(chunks).passed
    assert not prefill_chunks_exercise.check(lambda **case: chunks(**case, decoders_first=False)).passed


# -- appendix A1 -------------------------------------------------------------------------------


def test_decode_bytes_checker_covers_the_query_heads_the_hint_names() -> None:
    inputs = [c["inputs"] for c in decode_kv_bytes_exercise.cases]
    assert any(c["num_heads"] > c["num_kv_heads"] for c in inputs)
    assert {c["dtype"] for c in inputs} == {"float32", "float16", "bfloat16", "float8_e4m3fn"}

    def right(num_seqs, context_len, num_heads, num_kv_heads, head_dim, dtype):
        return 2 * num_seqs * context_len * num_kv_heads * head_dim * dtype.itemsize

    assert decode_kv_bytes_exercise.check(right).passed
    query_heads = decode_kv_bytes_exercise.check(
        lambda num_seqs, context_len, num_heads, num_kv_heads, head_dim, dtype:
        right(num_seqs, context_len, num_heads, num_heads, head_dim, dtype)
    )
    assert not query_heads.passed and "num_heads=" in query_heads.message
    two_bytes = decode_kv_bytes_exercise.check(
        lambda num_seqs, context_len, num_heads, num_kv_heads, head_dim, dtype:
        2 * num_seqs * context_len * num_kv_heads * head_dim * 2
    )
    assert not two_bytes.passed


def test_solutions_show_the_engine_code_and_link_the_worked_solution() -> None:
    pytest.importorskip("IPython")
    from pathlib import Path

    solutions = Path(__file__).resolve().parent.parent / "notebooks" / "solutions"
    for exercise in ALL:
        html = exercise.solution().data
        assert exercise.solutions in html and (solutions / exercise.solutions).exists()
    assert "get_computed_blocks" in cached_prefix_exercise.solution().data
    assert "num_tokens_to_compute" in prefill_chunks_exercise.solution().data


def test_an_exercise_takes_stored_cases_only() -> None:
    """The older form `Exercise(name, reference, make_case)` is gone: a checker holding the
    answering function would hand it to the notebook one attribute away."""
    with pytest.raises(TypeError, match="fixture name"):
        Exercise("double", lambda x: 2 * x)
    with pytest.raises(TypeError):
        Exercise("double", "tokens_per_round", lambda rng: {})  # no make_case any more


# -- the package's own function gets a nudge, as build.check answers it -------------------------


@pytest.mark.parametrize("exercise", ALL, ids=[e.fixture for e in ALL])
def test_the_package_function_gets_a_nudge_not_a_pass(exercise: Exercise) -> None:
    from minilm_engine.course.teaching.exercises import resolve

    for target in exercise.package:
        result = exercise.check(resolve(target))
        assert not result.passed and "package's own" in result.message, (target, result)
        assert "write it yourself" in result.message and exercise.hint_text in result.message


def test_calling_the_package_function_inside_gets_a_nudge() -> None:
    from minilm_engine.core.kv_cache_utils import slot_mapping
    from minilm_engine.course.experiments.toy_simulator import continuous_num_steps
    from minilm_engine.course.teaching.exercises_ledger import engine_gpus_for_load

    for exercise, fn in ((slot_mapping_exercise, lambda **case: slot_mapping(**case)),
                         (continuous_steps, lambda **case: continuous_num_steps(**case)),
                         (GPUS_FOR_LOAD, lambda **case: engine_gpus_for_load(**case))):
        result = exercise.check(fn)
        assert not result.passed and "your function calls it" in result.message, result


def test_a_learners_own_function_still_passes_and_the_profile_hook_is_restored() -> None:
    import sys

    def mine(block_table, block_size, start, end):
        return [block_table[p // block_size] * block_size + p % block_size for p in range(start, end)]

    before = sys.getprofile()
    assert slot_mapping_exercise.check(mine).passed
    assert sys.getprofile() is before


def test_int4_exercise_accepts_a_quantizer_with_a_zero_point() -> None:
    # Not the package's recipe (offset = min) but within half a step on 16 levels: a right answer.
    from minilm_engine.course.teaching.exercises_quantization import int4_exercise

    def zero_point(w, group_size):
        g = w.view(w.shape[0], -1, group_size)
        lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
        scale = ((hi - lo) / 15).clamp(min=1e-12)
        zero = torch.round(-lo / scale)
        codes = (torch.round(g / scale) + zero).clamp(0, 15)
        return ((codes - zero) * scale).view_as(w)

    result = int4_exercise.check(zero_point)
    assert result.passed, result
    assert "not the scheme's rounding" in int4_exercise.check(lambda w, group_size: w + 0.0).message
