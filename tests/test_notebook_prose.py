"""No committed chapter states, in its markdown, a figure that this machine measured but that no
output of the notebook prints.  A sentence whose number depends on the run belongs in code
that prints it (the claims helper: course/teaching/claims.py), or the figure must go.

What counts as a figure: a number with a unit that a run measures or a spec sheet quotes:
ms, µs, tok/s (tokens/s, tokens per second), x / × / "times" (2.5x, x1.68, ×3, 3 to 5 times),
%, bandwidth (GB/s, TB/s, GiB/s) and compute (TFLOP/s, TFLOPS).

It is allowed when
  - an output of the same notebook prints the same value with the same unit, at the prose's
    precision (the prose "1.7 ms" matches a printed "1.69 ms"; a decimal figure such as "7.1"
    may match a printed "7.1" in a table whose header carries the unit); or
  - it is a quoted figure with its citation in the same paragraph, in this form:
        (quoted: [NVIDIA H100 datasheet](https://...), 2023)
    i.e. the word "quoted", then a Markdown link to an http(s) source, then a year.
    The citation covers the paragraph (a table is one paragraph) it sits in.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))

_NUMBER = r"(?<![\w.])(\d+(?:,\d{3})*(?:\.\d+)?)"
# unit class -> pattern that follows the number
_SUFFIX_UNITS = {
    "ms": r"\s?ms\b",
    "us": r"\s?(?:µs|us)\b",
    "tok/s": r"\s?(?:tok/s|tokens?/s\b|tokens? per second)",
    # 2.5x, 12.9×, 3 times; not a product: "32 × 4096", "6 × hidden_size", "4x4"
    "x": r"(?:x(?![\w-])|×(?!\d)|\s×(?!\s*[\w($\\`])|\s(?:times)\b)",
    "%": r"\s?%",
    "B/s": r"\s?[GT]i?B/s",
    "FLOP/s": r"\s?(?:[GT]FLOP/s|[GT]FLOPS\b)",
}
_PREFIX_X = re.compile(r"(?<![\w.])[x×](\d+(?:\.\d+)?)\b")  # x1.68, ×2
_FIGURE = re.compile(_NUMBER + "(" + "|".join(f"(?P<u_{i}>{p})" for i, p in enumerate(_SUFFIX_UNITS.values())) + ")")
_UNIT_NAMES = list(_SUFFIX_UNITS)
CITATION = re.compile(r"quoted[^\n]{0,120}?\[[^\]]+\]\(https?://[^)\s]+\)[^\n]{0,40}?\b(?:19|20)\d\d\b", re.I)


def figures(text: str) -> list[tuple[str, str]]:
    """Every (number as written, unit class) in `text`."""
    found = []
    for match in _FIGURE.finditer(text):
        unit = next(_UNIT_NAMES[i] for i in range(len(_UNIT_NAMES)) if match.group(f"u_{i}"))
        found.append((match.group(1), unit))
    found += [(m.group(1), "x") for m in _PREFIX_X.finditer(text)]
    return found


def _value(number: str) -> float:
    return float(number.replace(",", ""))


def _decimals(number: str) -> int:
    return len(number.partition(".")[2])


def _output_text(nb) -> str:
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append(out["text"])
            for mime in ("text/plain", "text/html", "text/markdown"):
                data = out.get("data", {}).get(mime)
                if data:
                    parts.append(data if isinstance(data, str) else "".join(data))
    return "\n".join(parts)


def printed(number: str, unit: str, outputs: str, printed_figures: list[tuple[str, str]]) -> bool:
    """Does an output print this value (at the prose's precision) with this unit?"""
    value, places = _value(number), _decimals(number)
    if any(u == unit and round(_value(n), places) == value for n, u in printed_figures):
        return True
    if places == 0:
        return False  # a bare integer appears in every output: it needs its unit
    bare = (round(_value(m), places) for m in re.findall(r"(?<![\w.])\d+\.\d+", outputs))
    return any(b == value for b in bare)


def unprinted_figures(nb) -> list[str]:
    """'cell N: FIGURE in "...paragraph..."' for each figure the prose states and no output prints."""
    outputs = _output_text(nb)
    printed_figures = figures(outputs)
    problems = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "markdown":
            continue
        for paragraph in re.split(r"\n\s*\n", cell.source):
            if CITATION.search(paragraph):
                continue
            for number, unit in figures(paragraph):
                if not printed(number, unit, outputs, printed_figures):
                    snippet = " ".join(paragraph.split())[:160]
                    problems.append(f"cell {index}: {number} {unit} in {snippet!r}")
    return problems


def _notebook(markdown: list[str], outputs: list[str]):
    cells = [nbformat.v4.new_markdown_cell(m) for m in markdown]
    for text in outputs:
        code = nbformat.v4.new_code_cell("print(...)")
        code.outputs = [nbformat.v4.new_output("stream", name="stdout", text=text)]
        cells.append(code)
    return nbformat.v4.new_notebook(cells=cells)


def test_the_check_catches_a_stale_figure_and_accepts_a_printed_or_quoted_one() -> None:
    nb = _notebook(
        ["The floor is about 3 ms and batching is 3 to 5 times cheaper.",
         "One step takes 1.7 ms; speculation gives x1.68; the draft is accepted 98.8% of the time.",
         "An H100 reads 3.35 TB/s (quoted: [NVIDIA H100 datasheet](https://www.nvidia.com/h100), 2023).",
         "Decode runs at 20 tok/s."],
        ["floor 1.69 ms, batch-32 step 4.20 ms: 2.5x\nspeedup 1.68x", "acceptance 98.8%\n| 12.9 |"],
    )
    problems = unprinted_figures(nb)
    assert [p.split(" in ")[0] for p in problems] == ["cell 0: 3 ms", "cell 0: 5 x", "cell 3: 20 tok/s"]


def test_figure_forms() -> None:
    assert figures("2.5x, x1.44, ×3, 12.9×, 6 to 10 times, 33 %, 785 TFLOP/s, 1,024 tok/s, 3.35 TB/s") == [
        ("2.5", "x"), ("12.9", "x"), ("10", "x"), ("33", "%"), ("785", "FLOP/s"), ("1,024", "tok/s"),
        ("3.35", "B/s"), ("1.44", "x"), ("3", "x")]
    assert figures("a 4x4 tile, B x T tokens, 0x1F, Qwen3-0.6B, int8, 32 × 4096 × 128, 6 × hidden_size") == []
    # a citation needs the word, a link and a year
    assert CITATION.search("(quoted: [spec](https://example.org/spec.pdf), 2024)")
    assert not CITATION.search("(quoted: the spec, 2024)") and not CITATION.search("[spec](https://x.org)")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_markdown_states_no_figure_the_run_does_not_print(path: Path) -> None:
    problems = unprinted_figures(nbformat.read(path, as_version=4))
    assert not problems, (f"{path.name}: markdown states figures no output prints (print them from the run "
                          "with teaching.claims, drop them, or cite a quoted source):\n  " + "\n  ".join(problems))
