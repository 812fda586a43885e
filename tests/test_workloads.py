"""Tests for minilm_engine.course.experiments.workloads: seeded, skewed, exactly as long as promised."""

from __future__ import annotations

import pytest

from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.course.experiments.workloads import LengthMix, Workload, draw_output_lens, mixed_workload


def test_same_seed_same_workload_and_other_seed_differs():
    a, b = mixed_workload(30, seed=3), mixed_workload(30, seed=3)
    assert a.prompts == b.prompts and a.output_lens == b.output_lens
    assert mixed_workload(30, seed=4).output_lens != a.output_lens


def test_prompts_come_from_the_corpus_and_params_are_exact():
    w = mixed_workload(12, seed=0)
    assert w.prompts == sample_prompts(12, seed=0)
    assert w.num_requests == 12 and len(w.sampling_params) == 12
    for p in w.sampling_params:
        # greedy + ignore_eos: each request produces exactly max_tokens tokens
        assert p.temperature == 0 and p.ignore_eos and p.max_tokens >= 1
    assert w.num_output_tokens == sum(w.output_lens)


def test_lengths_are_skewed_most_short_few_long():
    mix = LengthMix(short=(4, 24), long=(96, 160), long_fraction=0.15)
    lens = draw_output_lens(2000, seed=0, mix=mix)
    assert all(4 <= n <= 24 or 96 <= n <= 160 for n in lens)
    num_long = sum(n >= 96 for n in lens)
    assert 0.10 < num_long / len(lens) < 0.20
    assert min(lens) == 4 and max(lens) == 160  # both ends of both ranges are reachable
    assert max(draw_output_lens(200, 1, LengthMix(long_fraction=0))) <= 24


def test_slicing_keeps_prompts_and_params_together():
    w = mixed_workload(10, seed=0)
    head = w[:4]
    assert isinstance(head, Workload)
    assert head.prompts == w.prompts[:4] and head.output_lens == w.output_lens[:4]


@pytest.mark.parametrize(
    "kwargs",
    [dict(short=(0, 3)), dict(short=(5, 4)), dict(long=(1.5, 3)), dict(long_fraction=1.5)],
)
def test_bad_mix_is_rejected(kwargs):
    with pytest.raises(ValueError):
        LengthMix(**kwargs)


def test_negative_count_is_rejected():
    with pytest.raises(ValueError):
        draw_output_lens(-1)
