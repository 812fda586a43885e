"""The workshop helpers: the reading-time estimate counts what its docstring says, and the setup
check reports every item without changing anything."""

from __future__ import annotations

import nbformat
import pytest

from minilm_engine.course.teaching import workshop


def _notebook(tmp_path, cells):
    nb = nbformat.v4.new_notebook(cells=cells)
    path = tmp_path / "99_test.ipynb"
    nbformat.write(nb, path)
    return path


def test_reading_time_counts_words_code_predictions_exercises_and_the_run(tmp_path) -> None:
    timed = nbformat.v4.new_code_cell("x = run()\nprint(x)")
    timed.metadata["execution"] = {"iopub.execute_input": "2026-12-04T03:00:00.000Z",
                                   "iopub.status.idle": "2026-12-04T03:02:00.000Z"}
    path = _notebook(tmp_path, [
        nbformat.v4.new_markdown_cell(" ".join(["word"] * 240) + " [a link](https://example.org/x)"),
        nbformat.v4.new_code_cell("my_guess = None   # a prediction"),
        timed,
        nbformat.v4.new_code_cell("def f():\n    raise NotImplementedError\n\n\nbuild.check('piece', f)"),
        nbformat.v4.new_code_cell("exercise.check(f)"),
    ])
    t = workshop.reading_time(path)
    assert t.read_min == pytest.approx(240 / 120 + 2 / 120 + (1 + 2 + 3 + 1) * 4 / 60)  # "a link" counts 2 words
    assert t.predict_min == 1
    assert t.run_min == pytest.approx(2.0)
    assert t.exercise_min == workshop.MINUTES_PER_BUILD + workshop.MINUTES_PER_EXERCISE
    assert t.total_min == pytest.approx(t.main_path_min + t.exercise_min)
    assert "| 99_test.ipynb | 10 min | 30 min |" in workshop.reading_time_table(tmp_path)


def test_setup_check_prints_one_line_per_item(capsys) -> None:
    lines = workshop.setup_check(generate=False)
    printed = capsys.readouterr().out.splitlines()
    assert [line.what for line in lines][:3] == ["python", "torch", "minilm_engine"]
    assert len(printed) == len(lines) + 1  # and the summary
    assert printed[-1].startswith("ready") or printed[-1].startswith("fix")
