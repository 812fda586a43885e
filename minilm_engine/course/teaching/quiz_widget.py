"""The quiz as ipywidgets (works with Colab's ipywidgets 7 and JupyterLab's 8).

    [chapter ▾] [difficulty ▾] [Draw]          score: 3 / 5 correct
    question
    [your answer ........] [Check] [Reveal]   [I had it] [I missed it]
    feedback / model answer, and the link to the cell that measures it
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from minilm_engine.course.teaching.quiz import Quiz, render_html


def quiz_widget(quiz: Quiz) -> widgets.VBox:
    chapter = widgets.Dropdown(options=[("any chapter", None)] + [(c, c) for c in quiz.chapters()],
                               description="chapter")
    difficulty = widgets.Dropdown(options=[("any", None), ("1 easy", 1), ("2", 2), ("3 hard", 3)],
                                  description="difficulty")
    draw = widgets.Button(description="Draw", icon="random")
    score = widgets.HTML()
    question = widgets.HTML("<i>Draw a question.</i>")
    answer = widgets.Text(placeholder="your answer (a number for numeric questions)")
    check = widgets.Button(description="Check")
    reveal = widgets.Button(description="Reveal")
    had_it = widgets.Button(description="I had it", button_style="success")
    missed = widgets.Button(description="I missed it", button_style="warning")
    feedback = widgets.HTML()

    def refresh_score() -> None:
        score.value = f"<b>score: {quiz.score}</b>"

    def on_draw(_) -> None:
        try:
            drill = quiz.draw(chapter.value, difficulty.value)
        except ValueError as e:
            feedback.value = f"<span style='color:#C00'>{html.escape(str(e))}</span>"
            return
        question.value = render_html(drill)
        answer.value, feedback.value = "", ""

    def on_check(_) -> None:
        if quiz.current is None:
            return
        grade = quiz.answer(answer.value)
        if grade.correct is None:
            on_reveal(None)
            return
        color = "#1a7f37" if grade.correct else "#cf222e"
        feedback.value = f"<span style='color:{color}'>{html.escape(grade.message)}</span>" + _model_answer(quiz)
        refresh_score()

    def on_reveal(_) -> None:
        if quiz.current is not None:
            feedback.value = _model_answer(quiz)

    def on_self_grade(correct: bool) -> None:
        if quiz.current is not None:
            quiz.self_grade(correct)
            refresh_score()

    draw.on_click(on_draw)
    check.on_click(on_check)
    reveal.on_click(on_reveal)
    had_it.on_click(lambda _: on_self_grade(True))
    missed.on_click(lambda _: on_self_grade(False))
    refresh_score()
    return widgets.VBox([
        widgets.HBox([chapter, difficulty, draw, score]),
        question,
        widgets.HBox([answer, check, reveal, had_it, missed]),
        feedback,
    ])


def _model_answer(quiz: Quiz) -> str:
    drill = quiz.current
    return (f"<p><b>Model answer.</b> {html.escape(drill.answer)}<br>"
            f"<small>Measured in {html.escape(drill.link)}</small></p>")


def mock_widget(mock) -> widgets.VBox:
    """One question at a time: answer (numbers are checked) or self-grade, then the next; the
    clock shows the time left at every click, and the score at the end."""
    header = widgets.HTML()
    question = widgets.HTML()
    answer = widgets.Text(placeholder="a number, or your notes")
    submit = widgets.Button(description="Submit")
    had_it = widgets.Button(description="I had it", button_style="success")
    missed = widgets.Button(description="I missed it", button_style="warning")
    feedback = widgets.HTML()

    def refresh(message: str = "") -> None:
        left = mock.remaining_s
        clock = f"{int(left // 60)}:{int(left % 60):02d} left" if left > 0 else "<b>time is up</b>"
        drill = mock.current
        header.value = f"<b>Mock interview</b> · question {min(len(mock.results) + 1, len(mock.drills))} of {len(mock.drills)} · {clock}"
        if drill is None:
            question.value = f"<b>{html.escape(mock.finish())}</b>"
            answer.disabled = submit.disabled = had_it.disabled = missed.disabled = True
        else:
            question.value = render_html(drill)
            numeric = drill.value is not None
            submit.disabled, had_it.disabled, missed.disabled = not numeric, numeric, numeric
        feedback.value = message

    def record(text: str | None, correct: bool | None) -> None:
        drill = mock.current
        if drill is None:
            return
        verdict = mock.answer(text, correct)
        answer.value = ""
        refresh(f"{'✅' if verdict else '❌'} Model answer to the last one: {html.escape(drill.answer)}")

    submit.on_click(lambda _: record(answer.value, None))
    had_it.on_click(lambda _: record(None, True))
    missed.on_click(lambda _: record(None, False))
    refresh()
    return widgets.VBox([header, question, widgets.HBox([answer, submit, had_it, missed]), feedback])
