"""Tests for minilm_engine.course.ledger.ladder_repeats: every rung repeated, rotated, fresh each run."""

from __future__ import annotations

import pytest

from minilm_engine.course.experiments.workloads import LengthMix
from minilm_engine.course.ledger import Prices
from minilm_engine.course.ledger import ladder_repeats
from minilm_engine.course.ledger.ladder import LADDER, Rung, ladder_workload

SHORT = LengthMix(short=(2, 4), long=(6, 8), long_fraction=0.3)


def test_every_rung_repeated_in_rotated_order_with_paired_costs(checkpoints, monkeypatch) -> None:
    order = []  # the rung of each measurement, in the order they ran
    measure = ladder_repeats.measure_workload
    monkeypatch.setattr(ladder_repeats, "measure_workload",
                        lambda llm, w, settings, machine=None: order.append(settings["rung"]) or measure(llm, w, settings, machine))
    workload = ladder_workload(3, seed=0, shared_prefix="the same opening words " * 3, mix=SHORT)
    rungs = [LADDER[1], LADDER[3], LADDER[4], Rung("+ warp drive", "nothing real", {"warp_drive": True}),
             Rung("+ a bad setting", "refused", {**LADDER[4].llm_kwargs, "block_size": 0})]
    out = ladder_repeats.run_ladder_repeats(workload, rungs, model=checkpoints["llama"].path, max_num_seqs=2,
                                            num_repeats=3, num_kv_blocks=64)
    names = [r.name for r in rungs[:3]]
    assert order == names + names[1:] + names[:1] + names[2:] + names[:2], "each repeat starts one rung later"
    assert [len(out.runs[n]) for n in names] == [3, 3, 3]
    assert out.reasons["+ warp drive"].endswith("['warp_drive']")
    assert out.reasons["+ a bad setting"].startswith("refused by this version: ValueError")
    for n in names:
        assert all(m.num_output_tokens == workload.num_output_tokens for m in out.runs[n])
    # Prefix caching is measured on a fresh engine every repeat: never a fully cached workload.
    assert all(m.num_computed_tokens > m.num_output_tokens for m in out.runs["+ prefix caching"])
    results = out.median_results()
    assert [r.available for r in results] == [True, True, True, False, False]
    for r in results[:3]:
        assert r.measurement in out.runs[r.rung.name]
        durations = sorted(m.duration_s for m in out.runs[r.rung.name])
        assert r.measurement.duration_s == durations[1]  # the median of three
    costs = out.costs(Prices(2.0))
    for n in names:
        assert costs[n] == pytest.approx([2.0 / (m.output_tokens_per_s * 3600) * 1e6 for m in out.runs[n]])
    assert list(out.tokens_per_s()) == names
