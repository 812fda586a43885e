"""The workshop's two helpers: a setup check every participant runs first, and the reading-time
estimate behind the course table's times (notebooks/README.md, docs/INSTRUCTOR.md).

Contract: `setup_check()` prints one line per thing a chapter needs (Python and torch, the
package and where it is imported from, the shipped model generating, the CPU cores and memory,
a GPU, the figures) with what to do when it is missing, and returns the lines as `CheckLine`s;
it changes nothing.  `reading_time(path)` estimates a notebook's time at a first-time reader's
pace from its committed cells:

    read      = markdown words / 120 per minute + code lines x 4 s   (a first reading, not a skim)
    predict   = 1 min per prediction cell (a cell assigning `my_guess...` / `my_...` = None)
    run       = the committed full-size run's wall time (cell timestamps), or 0 if absent
    exercises = 15 min per build exercise (`build.check`), 8 per other checked exercise
"""

from __future__ import annotations

import datetime
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

WORDS_PER_MINUTE = 120  # technical prose with formulas, read for the first time
SECONDS_PER_CODE_LINE = 4
MINUTES_PER_PREDICTION = 1
MINUTES_PER_BUILD = 15
MINUTES_PER_EXERCISE = 8


@dataclass(frozen=True)
class CheckLine:
    what: str
    ok: bool
    detail: str  # what was found, or what to do


def setup_check(generate: bool = True) -> list[CheckLine]:
    """Check this machine for the workshop and print one line per item (see the module docstring)."""
    import torch

    import minilm_engine

    lines = [
        CheckLine("python", sys.version_info >= (3, 10), f"{sys.version.split()[0]} (3.10 or newer needed)"),
        CheckLine("torch", True, torch.__version__),
        CheckLine("minilm_engine", True, f"imported from {Path(minilm_engine.__file__).parent}"),
    ]
    num_cores = os.cpu_count() or 1
    lines.append(CheckLine("CPU cores", True, f"{num_cores}" + (
        ": enough for the chef; read the real-shaped model's cells from the committed outputs"
        if num_cores <= 2 else "")))
    available = _available_memory_bytes()
    if available is not None:
        lines.append(CheckLine("free memory", available >= 4 * 2**30,
                               f"{available / 2**30:.1f} GiB (the real-shaped model of chapters 01 and 04 needs "
                               "about 4 GiB; with less, read those cells from the committed outputs)"))
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        major, minor = torch.cuda.get_device_capability(0)
        lines.append(CheckLine("GPU", True, f"{name} (compute capability {major}.{minor})" + (
            ": Triton kernels off (needs 8.0+), the torch reference attention runs" if major < 8 else "")))
    else:
        lines.append(CheckLine("GPU", True, "none: every chapter runs on the CPU (the GPU cells say what they skip)"))
    if generate:
        lines.append(_generate_check())
    static = os.environ.get("MINILM_STATIC_FIGURES", "0") == "1"
    lines.append(CheckLine("figures", True, "static PNG" if static else "live views (a static PNG where no frontend)"))
    for line in lines:
        print(f"{'ok ' if line.ok else 'FIX'}  {line.what:14s} {line.detail}")
    ready = all(line.ok for line in lines)
    print("ready for the workshop" if ready else "fix the FIX lines first (docs/INSTRUCTOR.md, 'Before the day')")
    return lines


def _generate_check() -> CheckLine:
    from minilm_engine import LLM, SamplingParams

    try:
        start = time.perf_counter()
        llm = LLM(None, device="cpu")
        out = llm.generate(["Order for table 7:\n"], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)
        seconds = time.perf_counter() - start
    except Exception as e:  # noqa: BLE001 - the check reports any failure as a line to fix
        return CheckLine("noodle-chef", False, f"could not generate: {type(e).__name__}: {e}")
    num_tokens = len(out[0].outputs[0].token_ids)
    return CheckLine("noodle-chef", num_tokens > 0, f"loaded and generated {num_tokens} tokens in {seconds:.1f} s")


def _available_memory_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


@dataclass(frozen=True)
class ReadingTime:
    read_min: float
    predict_min: float
    run_min: float
    exercise_min: float

    @property
    def main_path_min(self) -> float:
        """Reading, predicting and running: the chapter without its exercises."""
        return self.read_min + self.predict_min + self.run_min

    @property
    def total_min(self) -> float:
        return self.main_path_min + self.exercise_min


_PREDICTION = re.compile(r"^my_\w+\s*=\s*(None|\.\.\.)", re.M)


def reading_time(path: str | Path) -> ReadingTime:
    """Estimate a committed notebook's time (module docstring)."""
    import nbformat

    nb = nbformat.read(Path(path), as_version=4)
    words = code_lines = predictions = builds = exercises = 0
    starts, ends = [], []
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            words += len(re.sub(r"<[^>]+>|\(https?://[^)]*\)", " ", cell.source).split())
            continue
        if cell.cell_type != "code":
            continue
        source = cell.source
        code_lines += sum(1 for line in source.splitlines() if line.strip() and not line.strip().startswith("#"))
        predictions += bool(_PREDICTION.search(source)) and "check" not in source
        builds += source.count("build.check(")
        exercises += len(re.findall(r"\b\w+\.check(?:_pick)?\(", source)) - source.count("build.check(")
        timing = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" in timing and "iopub.status.idle" in timing:
            starts.append(_timestamp(timing["iopub.execute_input"]))
            ends.append(_timestamp(timing["iopub.status.idle"]))
    run_s = sum((e - s).total_seconds() for s, e in zip(starts, ends))
    return ReadingTime(
        read_min=words / WORDS_PER_MINUTE + code_lines * SECONDS_PER_CODE_LINE / 60,
        predict_min=predictions * MINUTES_PER_PREDICTION,
        run_min=run_s / 60,
        exercise_min=builds * MINUTES_PER_BUILD + exercises * MINUTES_PER_EXERCISE,
    )


def _timestamp(text: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))


def reading_time_table(folder: str | Path) -> str:
    """The course table's two time columns for every chapter notebook in `folder`, as Markdown
    rows (rounded up to 5 minutes): `python -m minilm_engine.course.teaching.workshop notebooks`."""
    import math

    def five(minutes: float) -> int:
        return 5 * max(1, math.ceil(minutes / 5))

    rows = ["| notebook | read, predict, run | with the exercises |", "|---|---|---|"]
    for path in sorted(Path(folder).glob("*.ipynb")):
        t = reading_time(path)
        rows.append(f"| {path.name} | {five(t.main_path_min)} min | {five(t.total_min)} min |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(reading_time_table(sys.argv[1] if len(sys.argv) > 1 else "notebooks"))
