"""Tests for minilm_engine.course.viz.dashboard: the three modes from a measured ladder, and the widget."""

from __future__ import annotations

import pytest

from minilm_engine import LLM
from minilm_engine.course.experiments.workloads import LengthMix
from minilm_engine.course.ledger import Ledger, Prices
from minilm_engine.course.ledger.ladder import LADDER, Rung, ladder_workload, run_ladder
from minilm_engine.course.viz.dashboard import MODES, LedgerDashboard, load_measured_ladder

pytestmark = pytest.mark.slow  # the fixture measures a whole ladder (about 10 s)


@pytest.fixture(scope="module")
def ladder(checkpoints):
    workload = ladder_workload(4, seed=0, shared_prefix="the same opening words " * 3,
                               mix=LengthMix(short=(2, 4), long=(8, 10), long_fraction=0.3))
    # The first five rungs, one this version cannot have, and one after it: the test does not
    # depend on which later techniques (quantization, ...) a version of the engine has.
    rungs = [*LADDER[:5], Rung("+ warp drive", "nothing real", {"warp_drive": True}),
             Rung("+ smaller blocks", "a rung after a missing one", {"block_size": 8})]
    return workload, run_ladder(workload, rungs, model=checkpoints["llama"].path, max_num_seqs=2,
                                num_kv_blocks=64)


PRICES = Prices(gpu_cost_per_hour=2.0, input_price_per_mtok=1.0, output_price_per_mtok=4.0,
                cached_input_discount=0.5, batch_discount=0.5)


def test_toggles_pick_the_rung_of_the_ladder(ladder) -> None:
    workload, results = ladder
    dash = LedgerDashboard(results, PRICES, workload=workload, num_seats=2)
    last_measured = max(i for i, r in enumerate(results) if r.available)
    assert dash.selected_index == last_measured == len(results) - 1  # past the missing rung
    dash.set_technique("static batching", False)  # everything after it is off too
    assert dash.selected.rung.name == "KV cache"
    dash.set_technique("static batching", True)
    dash.set_technique("KV cache", False)
    assert dash.selected.rung.name == "no KV cache"
    for r in results:
        if not r.available:
            with pytest.raises(ValueError, match="not measured"):
                dash.set_technique(r.rung.name, True)
    with pytest.raises(ValueError, match="no technique"):
        dash.set_technique("warp drive", True)
    with pytest.raises(ValueError, match="first rung"):
        LedgerDashboard([r for r in results if not r.available], PRICES)
    with pytest.raises(TypeError, match="Prices"):
        LedgerDashboard(results, prices=0.1)


def test_books_are_the_ledgers(ladder) -> None:
    workload, results = ladder
    dash = LedgerDashboard(results, PRICES, workload=workload, num_seats=2,
                           target_tokens_per_s=1e6)
    books = Ledger(dash.selected.measurement, PRICES)
    rows = dict(dash.books_rows())
    assert rows["configuration"] == dash.selected.rung.name
    assert rows["cost per Mtok output (all costs on output)"] == PRICES.money(
        books.blended_cost_per_mtok, 3)
    assert rows["margin at your prices"] == f"{books.margin():+.0%}"
    assert "batch tier" in " ".join(rows)
    machines = rows["machines for 1,000,000 output tokens/s"].split()[0]
    per_machine = dash.selected.measurement.output_tokens_per_s
    assert int(machines.replace(",", "")) == -(-1e6 // per_machine)
    assert dash.selected.measurement.provenance.describe() in dash.books_html()


def test_the_three_figures(ladder) -> None:
    workload, results = ladder
    dash = LedgerDashboard(results, PRICES, workload=workload, num_seats=2)
    pipeline = dash.figure(MODES[0])
    tps, cost, price_line = pipeline.data
    assert list(tps.y) == [r.rung.name for r in results]  # horizontal bars, a rung per row
    for r, x, text in zip(results, tps.x, tps.text):
        if r.available:
            assert x == pytest.approx(r.measurement.output_tokens_per_s)
        else:
            assert x == 0 and text == "not in this version"
    assert list(price_line.x) == [4.0, 4.0]
    assert dash.selected.rung.name in pipeline.layout.title.text
    reuse = dash.figure(MODES[1])
    computed, cached, ttft, blocks = reuse.data
    assert list(computed.y) == [r.rung.name for r in results if r.available]
    assert computed.x[0] > computed.x[1]  # recomputing costs more tokens than caching
    assert cached.x[list(cached.y).index("+ prefix caching")] > 0
    assert list(blocks.y) == ["continuous batching", "+ prefix caching", "+ smaller blocks"]
    assert blocks.x[1] <= blocks.x[0]  # shared prefix blocks are held once
    batching = dash.figure(MODES[2])
    assert "tables turned per minute" in batching.layout.title.text
    assert len(batching.data) == 2  # static and continuous seats
    with pytest.raises(ValueError, match="mode"):
        dash.figure("nonsense")


def test_widget_inputs_redraw_the_books_and_figures(ladder, checkpoints) -> None:
    workload, results = ladder
    llm = LLM(checkpoints["llama"].path, max_num_seqs=2, num_kv_blocks=64)
    dash = LedgerDashboard(results, PRICES, llm=llm, workload=workload, num_seats=2)
    assert len(llm.engine.scheduler.waiting) == workload.num_requests
    box = dash.widget()
    assert box.children[1].get_title(0) == "1 · pipeline"
    pipeline = dash._figure_widgets[MODES[0]]
    before = list(pipeline.data[1].x)
    dash._widgets["gpu_cost"].value = 4.0  # twice the price: twice the cost per token
    after = list(pipeline.data[1].x)
    assert all(a == pytest.approx(2 * b) for a, b in zip(after, before))
    assert PRICES.money(2 * Ledger(dash.selected.measurement, PRICES).blended_cost_per_mtok, 3) \
        in dash._widgets["books"].value
    kv_box = next(b for b in dash._widgets["toggles"] if b.description == "KV cache")
    kv_box.value = False
    assert dash.selected.rung.name == "no KV cache"
    assert "no KV cache" in pipeline.layout.title.text
    unavailable = [b for b in dash._widgets["toggles"] if b.disabled]
    assert all("not in this version" in b.description for b in unavailable)
    assert len(unavailable) == sum(not r.available for r in results)
    dash._widgets["utilization"].value = 0.5
    assert dash.prices.utilization == 0.5
    # Mode 3's live batch view follows the real engine.
    dash._live_view.controls[0].step()
    assert llm.engine.num_steps == 1


def test_the_shipped_measured_ladder_loads() -> None:
    results = load_measured_ladder()
    assert [r.rung.name for r in results] == [r.name for r in LADDER]
    assert results[0].available and results[0].measurement.provenance.model == "noodle-chef"
    dash = LedgerDashboard(results)
    assert dash.figure(MODES[0]).data[0].x[dash.selected_index] > 0


def test_show_static(ladder, capsys) -> None:
    workload, results = ladder
    LedgerDashboard(results, PRICES, workload=workload, num_seats=2).show(mode="static")
    out = capsys.readouterr().out
    assert out.count("plotly figure") == 3 and "HTML object" in out  # the books, after them
