"""Helpers the chapter notebooks share: setup, showing package source, exercises, drills.

Notebooks never re-implement the engine; they call these to show its real code, check a
learner's function against the package's own, and quiz.
"""

from minilm_engine.course.teaching.drills import Drill, load_drills, show_drills
from minilm_engine.course.teaching.exercises import CheckResult, Exercise
from minilm_engine.course.teaching.notebook import NotebookSetup, setup, show_source

__all__ = [
    "CheckResult",
    "Drill",
    "Exercise",
    "NotebookSetup",
    "load_drills",
    "setup",
    "show_drills",
    "show_source",
]
