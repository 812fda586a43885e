"""Tests for minilm_engine.course.viz: the figures show exactly what the engine did and holds.

A tiny random Llama runs in the continuous engine with requests that share a prompt prefix.
Each check reads the figure itself (its traces, colours and texts) and compares it with the
engine's trace, its block pool and an independent recount, so a picture that looks plausible
but shows the wrong blocks or the wrong waste fails.
"""

from __future__ import annotations

import asyncio
import base64
import re

import plotly.graph_objects as go
import pytest

from minilm_engine import LLM, SamplingParams
from minilm_engine.course import viz
from minilm_engine.course.viz.colors import CACHED_FREE_COLOR, FREE_COLOR

from conftest import build_hf_model, hf_config, save_checkpoint

BLOCK_SIZE = 4
PREFIX = "The Golden Bowl is open every day from eleven until late, "
SUFFIXES = ["and the miso ramen", "order for table 7", "hello there", "a bowl of noodles"]
MAX_TOKENS = 6


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory, tokenizer):
    config = hf_config(
        "llama", len(tokenizer), tokenizer.eos_token_id,
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False,
    )
    folder = tmp_path_factory.mktemp("viz") / "llama"
    return save_checkpoint(folder, build_hf_model("llama", config), tokenizer)


def make_engine(folder, num_kv_blocks: int = 40, num_requests: int = 4):
    llm = LLM(
        folder, num_kv_blocks=num_kv_blocks, block_size=BLOCK_SIZE,
        max_num_batched_tokens=32, max_num_seqs=4,
    )
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True)
    for i in range(num_requests):
        engine.add_request(f"r{i}", PREFIX + SUFFIXES[i % len(SUFFIXES)], params)
    return engine


# ---------------------------------------------------------------------- reading figures back
def batch_cells_in(fig: go.Figure) -> list[tuple[int, int, str, bool]]:
    """(step, slot, request_id, is_prefill) of every cell drawn (traces 0 and 1)."""
    cells = []
    for trace, is_prefill in zip(fig.data[:2], (True, False)):
        for base, slot, hover in zip(trace.base, trace.y, trace.hovertext):
            request_id = re.match(r"<b>request (\S+)</b>", hover).group(1)
            cells.append((round(base + 0.5), slot, request_id, is_prefill))
    return cells


def grid_colors(fig: go.Figure) -> dict[int, tuple[str, str]]:
    """block_id -> (fill colour, text) of every grid cell drawn (trace 0, a discrete heatmap)."""
    heatmap = fig.data[0]
    stops = heatmap.colorscale  # [[k/n, colour k], [(k+1)/n, colour k], ...]
    out = {}
    for z_row, id_row, text_row in zip(heatmap.z, heatmap.customdata, heatmap.text):
        for z, block_id, text in zip(z_row, id_row, text_row):
            if z is not None:
                assert block_id not in out
                out[block_id] = (stops[2 * int(z)][1], text)
    return out


def independent_waste(engine) -> tuple[int, int, int, int]:
    """(paged slots, paged empty, contiguous slots, contiguous empty), recounted from scratch:
    paged = blocks in use x block_size minus the distinct cache slots that hold a token."""
    manager, running = engine.block_manager, engine.scheduler.running
    num_used_blocks = sum(b.ref_cnt > 0 for b in engine.block_pool.blocks)
    filled = set()
    for r in running:
        filled.update(manager.slot_mapping(r.request_id, 0, r.num_computed_tokens))
    reserved = sum(
        r.num_prompt_tokens + min(MAX_TOKENS, engine.max_model_len - r.num_prompt_tokens)
        for r in running
    )
    used = sum(r.num_computed_tokens for r in running)
    num_slots = num_used_blocks * BLOCK_SIZE
    return num_slots, num_slots - len(filled), reserved, reserved - used


# ---------------------------------------------------------------------- the tests
def test_batch_view_draws_one_cell_per_scheduled_chunk(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    view = viz.BatchView(engine)
    assert len(view.figure().data[0].x) == 0  # no step yet: an empty figure, not an error
    while engine.has_unfinished_requests():
        engine.step()
    records = engine.trace.records
    fig = view.figure()

    drawn = batch_cells_in(fig)
    expected = sorted(
        (r.step, c.request_id, c.num_prefill_tokens > 0) for r in records for c in r.chunks
    )
    assert sorted((step, rid, pre) for step, _, rid, pre in drawn) == expected
    assert len({(step, slot) for step, slot, _, _ in drawn}) == len(drawn), "two cells share a slot"
    # Prefix sharing happened, and the first step is a (chunked) prefill.
    assert any(c.num_cached_tokens > 0 for r in records for c in r.chunks)
    assert all(pre for step, _, _, pre in drawn if step == 0)
    # One colour per request, the same in every cell, different for the first requests.
    colors = {}
    for trace in fig.data[:2]:
        for color, hover in zip(trace.marker.color, trace.hovertext):
            rid = re.match(r"<b>request (\S+)</b>", hover).group(1)
            assert colors.setdefault(rid, color) == color
    assert len(set(colors.values())) == len(colors)
    assert fig.data[0].marker.pattern.shape == "/" and not fig.data[1].marker.pattern.shape
    assert {t.name for t in fig.data if t.showlegend is not False} >= {"prefill chunk", "decode"}
    # Tokens per step and step time panels.
    assert list(fig.data[5].y) == [r.num_prefill_tokens for r in records]
    assert list(fig.data[6].y) == [r.num_decode_tokens for r in records]
    assert list(fig.data[7].y) == pytest.approx([r.duration_s * 1e3 for r in records])
    assert "step time" in fig.data[0].hovertext[0] and "ms" in fig.data[0].hovertext[0]
    # A window of the last steps.
    last = viz.BatchView(engine, max_steps=3).figure()
    assert {step for step, *_ in batch_cells_in(last)} == {r.step for r in records[-3:]}


def test_memory_view_grid_matches_the_pool_at_every_step(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    view = viz.MemoryView(engine)
    num_shared_seen = 0
    while True:
        fig = view.figure()
        cells = grid_colors(fig)
        assert sorted(cells) == list(range(engine.block_pool.num_blocks))
        owner = {}
        for rid, table in engine.block_manager.block_tables.items():
            for block in table:
                owner.setdefault(block.block_id, rid)
        for block in engine.block_pool.blocks:
            color, text = cells[block.block_id]
            if block.ref_cnt > 0:
                assert color == view.colors(owner[block.block_id])
            elif block.block_hash is not None:
                assert color == CACHED_FREE_COLOR
            else:
                assert color == FREE_COLOR
            assert text == (f"×{block.ref_cnt}" if block.ref_cnt > 1 else "")
        num_shared = sum(b.ref_cnt > 1 for b in engine.block_pool.blocks)
        assert len(fig.layout.shapes) == num_shared  # an outline around each shared block
        num_shared_seen += num_shared
        if not engine.has_unfinished_requests():
            break
        engine.step()
    assert num_shared_seen > 0, "the scenario should share prefix blocks"
    # All finished: their prefixes stay in the pool as cached-free blocks.
    assert CACHED_FREE_COLOR in {c for c, _ in cells.values()}


def test_waste_numbers_match_an_independent_count(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    for reserve in ("max_tokens", "max_model_len"):
        title = viz.MemoryView(engine, reserve=reserve).figure().layout.title.text
        assert title.startswith("KV memory: no")
    for _ in range(3):
        engine.step()
        waste = viz.memory_waste(engine)
        shown = (waste.num_paged_slots, waste.num_paged_empty)
        shown += (waste.num_contiguous_slots, waste.num_contiguous_empty)
        assert shown == independent_waste(engine)
        title = viz.MemoryView(engine).figure().layout.title.text
        if waste.num_blocks_saved_by_sharing:  # the saving is the headline
            assert (f"{waste.num_table_entries} table entries on {waste.num_held_blocks} blocks: "
                    f"sharing saves {waste.num_blocks_saved_by_sharing}") in title
        else:
            assert f"paged {waste.paged_fraction:.1%} wasted," in title
            assert f"contiguous {waste.contiguous_fraction:.1%} wasted" in title
        assert f"{waste.num_paged_empty} of {waste.num_paged_slots} slots empty" in title
        running = engine.scheduler.running
        by_model_len = viz.memory_waste(engine, reserve="max_model_len")
        assert by_model_len.num_contiguous_slots == len(running) * engine.max_model_len
    assert waste.num_blocks_saved_by_sharing > 0
    # The bars: reserved and used tokens per running request, in running order.
    fig = viz.MemoryView(engine).figure()
    assert list(fig.data[4].y) == [r.request_id for r in running]
    assert list(fig.data[5].x) == [r.num_computed_tokens for r in running]
    assert list(fig.data[6].x) == [
        len(engine.block_manager.block_tables[r.request_id]) * BLOCK_SIZE for r in running
    ]


def test_step_button_advances_the_engine_and_the_widgets_follow(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    batch, memory = viz.BatchView(engine, throttle_s=0.0), viz.MemoryView(engine)
    batch_box, memory_box = batch.widget(), memory.widget()
    controls, figure_widget = batch_box.children
    assert isinstance(figure_widget, go.FigureWidget)
    step_button = controls.children[0]
    assert step_button.description == "Step"

    step_button.click()
    assert engine.num_steps == 1
    memory.controls[0].step_button.click()  # either view's button drives the same engine
    assert engine.num_steps == 2
    # The button redraws at once, whatever the throttle.
    assert grid_colors(memory_box.children[1]) == grid_colors(memory.figure())
    # Steps run elsewhere (here: directly) reach the live figure through the step callback.
    engine.step()
    assert len(batch_cells_in(figure_widget)) == sum(len(r.chunks) for r in engine.trace.records)
    assert "3 steps" in batch.controls[0].status.value
    while engine.has_unfinished_requests():
        engine.step()
    num_steps = engine.num_steps
    step_button.click()  # nothing left to do: the button does nothing
    assert engine.num_steps == num_steps
    assert "no unfinished requests" in batch.controls[0].status.value
    batch.close()
    memory.close()
    assert engine.trace.callbacks == []


def test_live_redraws_are_throttled_but_the_last_step_is_drawn(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    view = viz.BatchView(engine, throttle_s=60.0)
    figure_widget = view.widget(controls=False).children[0]
    while engine.has_unfinished_requests():
        engine.step()
    assert view.num_redraws == 1  # throttled until the final step, which always redraws
    assert len(batch_cells_in(figure_widget)) == sum(len(r.chunks) for r in engine.trace.records)


def test_run_toggle_steps_on_the_event_loop_until_done(tiny_checkpoint):
    engine = make_engine(tiny_checkpoint)
    view = viz.MemoryView(engine)
    view.widget()
    controls = view.controls[0]
    controls.delay_slider.value = 0.0
    controls.run_button.value = True  # no event loop runs here: refused, with a message
    assert controls.run_button.value is False and "event loop" in controls.status.value
    assert engine.num_steps == 0

    async def run_then_wait():
        controls.run_button.value = True
        assert controls.run_button.description == "Pause"
        await controls.task

    asyncio.run(run_then_wait())
    assert not engine.has_unfinished_requests()
    assert controls.run_button.value is False and controls.run_button.description == "Run"


def test_preempted_requests_are_marked_and_give_their_slot_back(tiny_checkpoint):
    # 14 blocks: four 40-token requests cannot all stay, so the newest ones are preempted.
    engine = make_engine(tiny_checkpoint, num_kv_blocks=14)
    while engine.has_unfinished_requests():
        engine.step()
    preempted = [(r.step, rid) for r in engine.trace.records for rid in r.preempted]
    assert preempted, "the pool should be too small for all requests"
    fig = viz.BatchView(engine).figure()
    assert len(fig.data[4].x) == len(preempted)
    cells, marks = viz.batch_cells(engine.trace.records)
    assert [(p.step, p.request_id) for p in marks] == preempted
    assert len({(c.step, c.slot) for c in cells}) == len(cells)
    assert max(c.slot for c in cells) < engine.config.max_num_seqs


def test_show_picks_static_or_widget(tiny_checkpoint, monkeypatch):
    import IPython.display

    engine = make_engine(tiny_checkpoint, num_requests=1)
    engine.step()
    shown = []
    monkeypatch.setattr(IPython.display, "display", lambda obj, raw=False: shown.append((obj, raw)))
    monkeypatch.setenv("MINILM_STATIC_FIGURES", "1")
    assert viz.default_mode() == "static"
    viz.show(viz.BatchView(engine))
    viz.show(viz.MemoryView(engine), mode="widget")
    (bundle, raw), (box, _) = shown
    # Static figures for committed outputs: a PNG (GitHub shows images, not plotly's JavaScript).
    assert raw and set(bundle) == {"image/png", "text/plain"}
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    assert "Continuous batching" in bundle["text/plain"]
    assert isinstance(box.children[1], go.FigureWidget)
    monkeypatch.delenv("MINILM_STATIC_FIGURES")
    # Without it, a static figure is plotly's own: interactive in JupyterLab and in HTML exports.
    bundle = viz.static_bundle(viz.BatchView(engine).figure())
    assert {"application/vnd.plotly.v1+json", "text/html", "text/plain"} <= set(bundle)
    assert "Continuous batching" in bundle["text/html"] and "cdn.plot.ly" in bundle["text/html"]
    assert viz.default_mode() == "static"  # no IPython kernel runs under pytest
    with pytest.raises(ValueError, match="mode must be"):
        viz.show(viz.BatchView(engine), mode="html")


def test_views_refuse_an_engine_without_a_trace(tiny_checkpoint):
    engine = LLM(tiny_checkpoint, num_kv_blocks=40, block_size=BLOCK_SIZE, record_trace=False).engine
    for view in (viz.BatchView, viz.MemoryView):
        with pytest.raises(ValueError, match="record_trace=False"):
            view(engine)


# -- frontends: Colab's anywidget view, static PNG figures ---------------------------------------


def test_colab_is_detected_by_its_environment_variable(monkeypatch):
    from minilm_engine.course.viz import frontend

    monkeypatch.delenv("COLAB_NOTEBOOK_ID", raising=False)
    monkeypatch.delenv("MINILM_WIDGET_RENDERER", raising=False)
    assert not viz.in_colab() and viz.live_renderer() == "figurewidget"
    monkeypatch.setenv("COLAB_NOTEBOOK_ID", "1a2b3c")
    assert viz.in_colab() and viz.live_renderer() == "anywidget"
    monkeypatch.setenv("MINILM_WIDGET_RENDERER", "figurewidget")
    assert viz.live_renderer() == "figurewidget"
    monkeypatch.setenv("MINILM_WIDGET_RENDERER", "bokeh")
    with pytest.raises(ValueError, match="MINILM_WIDGET_RENDERER"):
        frontend.live_renderer()


def test_in_colab_the_live_view_is_an_anywidget_that_follows_the_engine(tiny_checkpoint, monkeypatch):
    from minilm_engine.course.viz.anywidget_figure import PlotlyAnyWidget

    monkeypatch.setenv("COLAB_NOTEBOOK_ID", "1a2b3c")
    monkeypatch.delenv("MINILM_WIDGET_RENDERER", raising=False)
    engine = make_engine(tiny_checkpoint, num_requests=2)
    view = viz.BatchView(engine, throttle_s=0)
    box = view.widget()
    figure_widget = box.children[1]
    assert isinstance(figure_widget, PlotlyAnyWidget) and not isinstance(figure_widget, go.FigureWidget)
    assert "Plotly.react" in figure_widget._esm and "cdn.plot.ly/plotly-" in figure_widget._esm
    before = figure_widget.figure["layout"]["title"]["text"]
    engine.step()
    engine.step()
    after = figure_widget.figure["layout"]["title"]["text"]
    assert before != after and "2 steps" in after
    assert len(figure_widget.figure["data"]) == len(view.figure().data)
    view.close()


def test_static_png_draws_every_kind_of_trace_the_chapters_use(tiny_checkpoint):
    from plotly.subplots import make_subplots

    from minilm_engine.course.viz.static_png import figure_to_png, png_bundle

    engine = make_engine(tiny_checkpoint, num_requests=3)
    for _ in range(4):
        engine.step()
    for view in (viz.BatchView(engine), viz.MemoryView(engine)):
        assert figure_to_png(view.figure()).startswith(b"\x89PNG")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("a", "b"))
    fig.add_scatter(x=[1, 2, 4], y=[3, None, 5], mode="lines+markers", line=dict(dash="dash", color="rgb(10,20,30)"), row=1, col=1)
    fig.add_bar(x=["x", "y"], y=[1, 2], marker=dict(color=["#123456", "rgba(1,2,3,0.5)"]), row=1, col=2)
    fig.add_heatmap(z=[[1, 2], [3, None]], colorscale=[[0, "white"], [1, "red"]], row=1, col=2)
    fig.add_hline(y=2, line=dict(dash="dot"), row=1, col=1)
    fig.update_xaxes(type="log", row=1, col=1)
    fig.update_layout(title="<b>all</b> kinds<br><sub>sub</sub>")
    bundle = png_bundle(fig)
    assert set(bundle) == {"image/png", "text/plain"} and bundle["text/plain"] == "<figure: all kinds>"


def test_static_png_keeps_the_labels_written_on_bars_and_ticks(monkeypatch):
    import matplotlib.axes
    import plotly.graph_objects as go

    from minilm_engine.course.viz.static_png import figure_to_png

    drawn, real = [], matplotlib.axes.Axes.bar_label

    def spy(self, container, labels=None, **kwargs):
        drawn.append(list(labels))
        return real(self, container, labels=labels, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "bar_label", spy)
    fig = go.Figure(go.Bar(x=["alone", "batched"], y=[99, 867], text=["$0.28 / M", "<b>$0.03</b> / M"]))
    assert figure_to_png(fig).startswith(b"\x89PNG")
    assert drawn == [["$0.28 / M", "$0.03 / M"]]
    drawn.clear()
    figure_to_png(go.Figure(go.Bar(x=["a"], y=[1], text=["hidden"], textposition="none")))
    ticks = []
    monkeypatch.setattr(matplotlib.axes.Axes, "set_yticks", lambda self, values, labels=None, **kw: ticks.append(labels))
    fig = go.Figure(go.Heatmap(z=[[1, 2], [3, 4]]))
    fig.update_yaxes(tickvals=[0, 1], ticktext=["block 0", "block 16"])
    figure_to_png(fig)
    assert ticks == [["block 0", "block 16"]]
    figure_to_png(go.Figure(go.Bar(x=["a"], y=[1])))
    assert drawn == []


def test_png_renderer_makes_fig_show_leave_a_png(monkeypatch):
    import plotly.io as pio

    from minilm_engine.course.viz.static_png import use_png_renderer

    monkeypatch.setattr(pio.renderers, "_default_name", pio.renderers.default)
    monkeypatch.setattr(pio.renderers, "_default_renderers", list(pio.renderers._default_renderers))
    use_png_renderer()
    assert pio.renderers.default == "minilm_png"
    fig = go.Figure(go.Scatter(x=[1, 2], y=[2, 1]), layout=dict(title="two points"))
    bundle = pio.renderers["minilm_png"].to_mimebundle(fig.to_dict())
    assert set(bundle) == {"image/png", "text/plain"} and "two points" in bundle["text/plain"]
