"""Chapter 09's quiz: draw drills by chapter and difficulty, answer, reveal, keep score.

Contract: `Quiz(drills, seed)` holds the bank and a score.  `draw(chapter, difficulty)` picks a
random drill not asked yet (among those that match); `answer(text)` grades a numeric drill
against its computed value within its tolerance and returns a `Grade`; a drill without a number
is graded by the learner after the reveal, with `self_grade(correct)`.  `mock_interview(n,
minutes)` draws a timed set of n drills, `MockInterview.finish()` reports the score and the time.
`widget()` (and `MockInterview.show()`) is the ipywidgets front (ipywidgets 7 and 8: Colab and JupyterLab); where no widget
frontend runs (CI, a script, GitHub) `show()` prints the questions with their answers instead.
"""

from __future__ import annotations

import html
import random
import time
from dataclasses import dataclass, field

from minilm_engine.course.teaching.drills import Drill, load_drills


@dataclass(frozen=True)
class Grade:
    correct: bool | None  # None: no number to check, the learner grades after the reveal
    expected: str
    message: str


@dataclass
class Score:
    num_asked: int = 0
    num_correct: int = 0

    def __str__(self) -> str:
        return f"{self.num_correct} / {self.num_asked} correct"


class Quiz:
    def __init__(self, drills: list[Drill] | None = None, seed: int | None = None):
        self.drills = load_drills() if drills is None else drills
        self.rng = random.Random(seed)
        self.score = Score()
        self.current: Drill | None = None
        self._asked: set[int] = set()
        self._graded = False

    def chapters(self) -> list[str]:
        return sorted({d.chapter for d in self.drills})

    def matching(self, chapter: str | None = None, difficulty: int | None = None) -> list[Drill]:
        return [d for d in self.drills
                if (chapter is None or d.chapter == chapter) and (difficulty is None or d.difficulty == difficulty)]

    def draw(self, chapter: str | None = None, difficulty: int | None = None) -> Drill:
        """A random drill of that chapter and difficulty (None: any), not asked before while
        others remain."""
        pool = self.matching(chapter, difficulty)
        if not pool:
            raise ValueError(f"no drill for chapter={chapter!r}, difficulty={difficulty!r}; "
                             f"chapters: {self.chapters()}, difficulties 1-3")
        fresh = [d for d in pool if id(d) not in self._asked] or pool
        self.current = self.rng.choice(fresh)
        self._asked.add(id(self.current))
        self._graded = False
        return self.current

    def answer(self, text: str | float) -> Grade:
        """Grade an answer to the current drill (numeric drills only are checked)."""
        drill = self._require_current()
        verdict = drill.check(text)
        if verdict is None:
            return Grade(None, drill.answer, "Compare with the model answer, then grade yourself.")
        self._count(verdict)
        expected = f"{drill.value:,.4g} {drill.unit}".strip()
        within = f"within {drill.tolerance:.0%}" if drill.tolerance else "exactly"
        return Grade(verdict, expected, ("Correct" if verdict else "Not quite") + f": expected {expected} ({within}).")

    def self_grade(self, correct: bool) -> None:
        self._require_current()
        self._count(correct)

    def mock_interview(self, num_questions: int = 5, minutes: float = 15, seed: int | None = None) -> MockInterview:
        rng = random.Random(seed) if seed is not None else self.rng
        picked = rng.sample(self.drills, min(num_questions, len(self.drills)))
        return MockInterview(picked, minutes * 60)

    def show(self, chapter: str | None = None, difficulty: int | None = None, num_questions: int = 3):
        """The widget in a live notebook; printed questions and answers elsewhere."""
        from minilm_engine.course.viz import default_mode

        if default_mode() == "widget":
            from IPython.display import display

            display(self.widget())
            return
        for drill in [self.draw(chapter, difficulty) for _ in range(num_questions)]:
            print(render_text(drill))

    def widget(self):
        from minilm_engine.course.teaching.quiz_widget import quiz_widget

        return quiz_widget(self)

    def _require_current(self) -> Drill:
        if self.current is None:
            raise RuntimeError("draw() a question first")
        return self.current

    def _count(self, correct: bool) -> None:
        if self._graded:
            return  # one grade per drawn question
        self._graded = True
        self.score.num_asked += 1
        self.score.num_correct += bool(correct)


@dataclass
class MockInterview:
    """A timed set: answer (or self-grade) each question in turn, then `finish()`."""

    drills: list[Drill]
    time_limit_s: float
    started: float = field(default_factory=time.monotonic)
    results: list[bool | None] = field(default_factory=list)

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started

    @property
    def remaining_s(self) -> float:
        return max(0.0, self.time_limit_s - self.elapsed_s)

    @property
    def current(self) -> Drill | None:
        return self.drills[len(self.results)] if len(self.results) < len(self.drills) else None

    def answer(self, text: str | float | None = None, correct: bool | None = None) -> bool | None:
        """Numeric drills are checked from `text`; others take the learner's `correct`."""
        drill = self.current
        if drill is None:
            raise RuntimeError("the interview is over: finish()")
        verdict = drill.check(text) if drill.value is not None else correct
        self.results.append(verdict)
        return verdict

    def finish(self) -> str:
        num_correct = sum(1 for r in self.results if r)
        over = " (over time)" if self.elapsed_s > self.time_limit_s else ""
        return (f"{num_correct} / {len(self.drills)} correct in {self.elapsed_s / 60:.1f} of "
                f"{self.time_limit_s / 60:.0f} minutes{over}")

    def show(self) -> None:
        """The timed widget in a live notebook; the printed sheet elsewhere."""
        from minilm_engine.course.viz import default_mode

        if default_mode() == "widget":
            from IPython.display import display

            from minilm_engine.course.teaching.quiz_widget import mock_widget

            display(mock_widget(self))
        else:
            self.print_sheet()

    def print_sheet(self) -> None:
        """The questions as text, for paper or a headless run; the answers wait for
        `print_answers()`, so that printing the sheet does not give them away."""
        print(f"Mock interview: {len(self.drills)} questions, {self.time_limit_s / 60:.0f} minutes\n")
        for i, drill in enumerate(self.drills, 1):
            print(f"Q{i}. [{drill.chapter}, {drill.kind}] {drill.question}")
        print("\nWork them out on paper; then mock.print_answers() for the model answers.")

    def print_answers(self) -> None:
        for i, drill in enumerate(self.drills, 1):
            print(f"A{i}. {drill.answer}")


def render_text(drill: Drill) -> str:
    number = f"  (expected: {drill.value:,.4g} {drill.unit})" if drill.value is not None else ""
    return (f"[chapter {drill.chapter} · {drill.kind} · difficulty {drill.difficulty}]\n"
            f"Q: {drill.question}\nA: {drill.answer}{number}\n   measured in {drill.link}\n")


def render_html(drill: Drill) -> str:
    return (f"<p><small>chapter {drill.chapter} · {drill.kind} · difficulty {drill.difficulty}</small><br>"
            f"<b>{html.escape(drill.question)}</b></p>")
