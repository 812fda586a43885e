"""Tests for course/experiments/quantization.py: the receipt checker, the held-out windows, and the
quality and QAT measurements at their smallest sizes (that they run and report sensibly)."""

from __future__ import annotations

import math
import random

import pytest
import torch

from minilm_engine.course.noodle_corpus import make_receipt
from minilm_engine.course.experiments.quantization import (
    Setting,
    decode_speed_table,
    qat_vs_ptq,
    quality_table,
    receipt_adds_up,
    receipt_prompts,
    windows_of,
)
from minilm_engine.model.quantization import QuantizationConfig


def test_real_receipts_add_up_and_broken_ones_do_not():
    rng = random.Random(0)
    for _ in range(50):
        receipt = make_receipt(rng)
        assert receipt_adds_up(receipt), receipt
    receipt = make_receipt(random.Random(1))
    lines = receipt.splitlines()
    total_line = next(i for i, line in enumerate(lines) if line.startswith("Total:"))
    wrong_total = lines[:total_line] + ["Total: $0.01"] + lines[total_line + 1 :]
    assert not receipt_adds_up("\n".join(wrong_total))
    item = next(i for i, line in enumerate(lines) if " x " in line)
    wrong_line = lines[:item] + [lines[item].replace(" = $", " = $1")] + lines[item + 1 :]
    assert not receipt_adds_up("\n".join(wrong_line))
    items_line = next(i for i, line in enumerate(lines) if line.startswith("Items:"))
    wrong_count = lines[:items_line] + ["Items: 99"] + lines[items_line + 1 :]
    assert not receipt_adds_up("\n".join(wrong_count))
    assert not receipt_adds_up("\n".join(lines[:total_line]))  # cut before the total
    assert not receipt_adds_up("Receipt #1\nTotal: $0.00")  # no line items


def test_receipt_prompts_are_receipt_openings():
    prompts = receipt_prompts(3)
    assert prompts == receipt_prompts(3) and all(p.startswith("Receipt #") and p.endswith("\n") and " x " in p for p in prompts)


def test_windows_share_one_token_at_the_seams():
    stream = torch.arange(10)
    w = windows_of(stream, 3)
    assert w.tolist() == [[0, 1, 2, 3], [3, 4, 5, 6], [6, 7, 8, 9]]


@pytest.mark.slow
def test_quality_table_runs_and_int4_costs_more_than_int8():
    settings = [Setting("fp32"), Setting("int8 rtn", "int8"), Setting("int4 g32 rtn", "int4", {"group_size": 32})]
    rows = quality_table("noodle-apprentice", settings, num_heldout_documents=8, num_receipts=2)
    assert [r["setting"] for r in rows] == ["fp32", "int8 rtn", "int4 g32 rtn"]
    assert rows[0]["perplexity_change"] == 0 and all(1 < r["perplexity"] < 3 for r in rows)
    assert abs(rows[1]["perplexity_change"]) < rows[2]["perplexity_change"]
    assert rows[2]["weight_bytes"] < rows[1]["weight_bytes"] < rows[0]["weight_bytes"]
    assert all(0 <= r["receipts_add_up"] <= 1 and r["num_receipts"] == 2 for r in rows)
    # per-window losses, the same windows for every setting: their mean is the perplexity's log
    assert len({len(r["window_losses"]) for r in rows}) == 1
    for r in rows:
        assert math.exp(sum(r["window_losses"]) / len(r["window_losses"])) == pytest.approx(r["perplexity"], rel=1e-4)


def test_decode_speed_table_pairs_every_run_with_a_baseline_run(monkeypatch):
    from minilm_engine.course.experiments import launches

    # Each run's speed is its engine's weight bytes divided by a "machine load" that changes on
    # every run: a ratio of two unpaired medians would mix loads, the pairs' ratios do not.
    loads = iter([1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0] * 4)
    monkeypatch.setattr(launches, "decode_tokens_per_s",
                        lambda llm, prompt, n: 1.0 if n == 2 else llm.weight_bytes / next(loads))
    settings = [Setting("fp32"), Setting("int8", "int8"), Setting("int4 g32", "int4", {"group_size": 32})]
    rows = decode_speed_table("noodle-apprentice", settings, num_tokens=3, repeats=3)
    assert [r["setting"] for r in rows] == ["fp32", "int8", "int4 g32"]
    assert [len(r["runs"]) for r in rows] == [3, 3, 3] and [len(r["ratios"]) for r in rows] == [1, 3, 3]  # the baseline is its own ratio
    assert rows[0]["speedup"] == 1.0 and rows[0]["kernel"] == "-" and rows[1]["kernel"] != "-"
    assert rows[1]["backend"] == "fused"  # quantized models run the fused CPU path too
    # a run right after its baseline run sees twice the load: ratio = bytes ratio / 2, each pair
    for r in rows[1:]:
        assert r["speedup"] == pytest.approx(r["weight_bytes"] / rows[0]["weight_bytes"] / 2)


def test_qat_vs_ptq_smallest():
    result = qat_vs_ptq(config=QuantizationConfig("int4", group_size=128), num_steps=3,
                        batch_size=2, seq_len=32, num_heldout_documents=4)
    assert result["float"] < result["ptq"] and math.isfinite(result["qat"])
    assert len(result["qat_losses"]) == 3 and math.isfinite(result["finetune_ptq"])


def test_int4_exercise_checker_nudges_the_package_and_explains_wrong_answers():
    from minilm_engine.course.teaching.exercises_quantization import int4_exercise, reference_int4
    from minilm_engine.model.quantization import schemes

    # The package's own answer is a nudge, passed directly or called from inside.
    result = int4_exercise.check(reference_int4)
    assert not result.passed and "package's own" in result.message, result.message
    calls_it = int4_exercise.check(lambda w, group_size: schemes.dequantize_int4(
        schemes.quantize_int4(w, *schemes.int4_params(w, group_size), group_size),
        *schemes.int4_params(w, group_size), w.shape[1]))
    assert not calls_it.passed and "your function calls it" in calls_it.message, calls_it.message

    def min_max(w, group_size):  # written from the idea: a right answer passes
        groups = w.view(w.shape[0], -1, group_size)
        lo, hi = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
        step = ((hi - lo) / 15).clamp_min(1e-12)
        return (((groups - lo) / step).round().clamp(0, 15) * step + lo).view_as(w)

    assert int4_exercise.check(min_max).passed

    def not_yet(w, group_size):
        raise NotImplementedError

    def wrong_type(w, group_size):
        return w.tolist()

    def per_row(w, group_size):  # one group per row: coarser steps
        return min_max(w, w.shape[1]) if w.shape[1] > group_size else min_max(w, group_size)

    def no_rounding(w, group_size):
        return w + 0.0

    def symmetric(w, group_size):
        g = w.view(w.shape[0], -1, group_size)
        scale = g.abs().amax(-1, keepdim=True) / 7
        return (torch.round(g / scale).clamp(-8, 7) * scale).view_as(w)

    def wrong_shape(w, group_size):
        return w[:, :1]

    assert "not implemented" in int4_exercise.check(not_yet).message
    assert "returned a list" in int4_exercise.check(wrong_type).message
    assert "returned shape" in int4_exercise.check(wrong_shape).message
    assert "half a step" in int4_exercise.check(per_row).message
    assert "not the scheme's rounding" in int4_exercise.check(no_rounding).message
    assert not int4_exercise.check(symmetric).passed
    assert not int4_exercise.check(lambda w: w).passed  # wrong signature: reported, not raised
