"""Interview drills: questions with model answers that reveal on demand.

Contract: every chapter keeps its questions in `drills/NN_topic.json` (a list of
{"question", "answer"} objects); `load_drills(chapter)` reads one chapter's ("02") or all of
them, and `show_drills` renders each answer folded under its question.  Chapter 09 draws on
the whole bank.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

DRILLS_DIR = Path(__file__).parent / "drills"


@dataclass(frozen=True)
class Drill:
    chapter: str
    question: str
    answer: str


def load_drills(chapter: str | None = None) -> list[Drill]:
    drills = []
    for file in sorted(DRILLS_DIR.glob("*.json")):
        number = file.stem.split("_")[0]
        if chapter is not None and number != chapter:
            continue
        for item in json.loads(file.read_text()):
            drills.append(Drill(number, item["question"], item["answer"]))
    return drills


def show_drills(chapter: str | None = None):
    import html

    from IPython.display import HTML

    parts = []
    for i, d in enumerate(load_drills(chapter), 1):
        parts.append(
            f"<p><b>Q{i}. {html.escape(d.question)}</b></p>"
            f"<details><summary>Model answer</summary><p>{html.escape(d.answer)}</p></details>"
        )
    return HTML("\n".join(parts))
