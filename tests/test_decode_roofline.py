"""Tests for course/experiments/decode_roofline.py and shop_figures.py (chapters 01 and 00), and
the results chapter 01's prose states, held against its committed outputs."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
from test_notebook_claims import printed_verdicts
from test_notebook_prose import _output_text

from minilm_engine.course.experiments import decode_roofline, shop_figures
from minilm_engine.course.experiments import roofline as roofline_module
from minilm_engine.course.experiments.cost import Throughput
from minilm_engine.course.experiments.roofline import Roofline, StepCost, StepTimes
from minilm_engine.course.known_configs import known_config
from minilm_engine.course.viz.static_png import figure_to_png

ROOT = Path(__file__).resolve().parents[1]


def _result() -> decode_roofline.DecodeRoofline:
    roofline = Roofline(read_bandwidth=50e9, matmul_flops=100e9)
    cost = StepCost(weight_bytes=2_000_000_000, num_matmul_params=500_000_000)
    times = tuple(StepTimes("model", b, (0.1 * max(1.0, b / 4), 0.11 * max(1.0, b / 4))) for b in (1, 2, 4, 8, 16))
    return decode_roofline.DecodeRoofline(roofline, cost, times)


def test_config_step_cost_counts_the_matmuls_as_the_loaded_model_does(monkeypatch):
    config = known_config("Qwen/Qwen3-0.6B")
    cost = decode_roofline.config_step_cost(config, bytes_per_weight=2)
    assert cost.weight_bytes == config.num_parameters() * 2
    monkeypatch.setattr(roofline_module, "step_weight_bytes", lambda model: 0)  # no weights loaded here
    assert roofline_module.step_cost(SimpleNamespace(config=config)).num_matmul_params == cost.num_matmul_params


def test_ridge_is_where_the_two_ceilings_meet():
    h100 = decode_roofline.DATASHEETS["H100"].roofline
    cost = decode_roofline.config_step_cost(known_config("Qwen/Qwen3-0.6B"), bytes_per_weight=2)
    ridge = h100.ridge(cost)
    assert h100.read_s(cost) == pytest.approx(h100.compute_s(cost, 1) * ridge)
    # A GPU's ridge is far beyond a CPU-like machine's for the same model.
    assert ridge > 50 * Roofline(read_bandwidth=50e9, matmul_flops=100e9).ridge(cost)


def test_published_step_is_its_tokens_per_second_inverted():
    pub = decode_roofline.GPT_FAST_A100
    assert pub.step_s == pytest.approx(pub.batch_size / pub.tokens_per_s)
    assert "2023" in pub.source and "2021" in pub.device.source


def test_table_and_ratios_follow_the_timings():
    result = _result()
    assert result.batch_sizes == [1, 2, 4, 8, 16]
    assert result.over_roofline(1) == pytest.approx(result.at(1).median_s / result.roofline.read_s(result.cost))
    lines = result.table().splitlines()
    assert len(lines) == 1 + len(result.times) and "roofline" in lines[0]


def test_num_threads_restores_the_count():
    before = torch.get_num_threads()
    with decode_roofline.num_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before


def test_figures_label_their_axes_and_render():
    result = _result()
    h100 = decode_roofline.DATASHEETS["H100"]
    qwen = decode_roofline.config_step_cost(known_config("Qwen/Qwen3-0.6B"), 2)
    llama = decode_roofline.config_step_cost(known_config("meta-llama/Llama-2-7b-hf"), 2)
    figs = [decode_roofline.step_figure(result, "t"),
            decode_roofline.gpu_figure(result, h100, qwen, "H100", decode_roofline.GPT_FAST_A100, llama, "t")]
    runs = {"one at a time": Throughput(4, 40, 128, 1.0, 0.008), "batch of 4": Throughput(4, 40, 128, 0.4, 0.012)}
    figs += [shop_figures.ledger_figure(120_000, [1_000, 2_000], [1_000]),
             shop_figures.serving_figure(runs, "t"),
             shop_figures.cost_curve_figure({"$1/h": 1.0}, (10, 1000), [("a", 1.0, 100)], "t")]
    for fig in figs:
        layout = fig.to_plotly_json()["layout"]
        for name, axis in layout.items():
            if name.startswith(("xaxis", "yaxis")):
                assert axis.get("title", {}).get("text"), f"{name} has no title"
        assert figure_to_png(fig)[:4] == b"\x89PNG"


def _chapter_01_verdicts() -> dict[str, list[str]]:
    nb = nbformat.read(ROOT / "notebooks" / "01_batching.ipynb", as_version=4)
    return printed_verdicts(_output_text(nb))


def test_chapter_01_prose_matches_its_committed_verdicts():
    """The Explain paragraphs state: far below B* a batch costs little more than one, past B* four
    times the batch at least doubles the step, and the seed's '32 cost little more than 1' fails on this CPU."""
    verdicts = _chapter_01_verdicts()

    def verdict(prefix: str) -> str:
        found = [v for claim, v in verdicts.items() if claim.startswith(prefix)]
        assert found, f"chapter 01 prints no verdict on {prefix!r}"
        return found[0][2]

    assert verdict("far below B*, a decode step of").startswith("verdict:  holds here")
    assert verdict("past B*, four times the batch").startswith("verdict:  holds here")
    assert verdict("batching 32 requests costs little more than 1").startswith("verdict:  does not hold here")
    assert verdict("continuous batching serves a mixed workload").startswith("verdict:  holds here")
