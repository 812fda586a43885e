"""The seed-claims records agree with the committed chapters that wrote them.

`notebooks/claims/NN.json` holds chapter NN's verdicts on the seed articles' claims
(`teaching.claims.record`), and chapter 09 tables them.  A record is only worth its place if a
reader can find it where it was measured, so for every record:

  - chapter NN's committed outputs print that verdict: its "Claim:" line with the same text,
    then the same asserted range, the same measured value and the same verdict and reason
    (a record that its chapter no longer prints is stale: rerun the chapter with
    scripts/execute_notebooks.py, which renews the record);
  - chapter 09's committed table holds exactly the recorded claims (rerun 09 after its sources).
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import nbformat
import pytest
from test_notebook_prose import _output_text

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
RECORDS = sorted((NOTEBOOKS / "claims").glob("*.json"))


def _outputs_text(path: Path) -> str:
    """Every text a committed notebook's cells printed or displayed (as the prose check reads
    them), HTML unescaped: chapter 09's table is a DataFrame's HTML ("30 -&gt; under 10")."""
    return html.unescape(_output_text(nbformat.read(path, as_version=4)))


def _records(path: Path) -> list[dict]:
    return list(json.loads(path.read_text()).values())


def _chapter(record_path: Path) -> Path:
    matches = sorted(NOTEBOOKS.glob(f"{record_path.stem}_*.ipynb"))
    assert len(matches) == 1, f"{record_path.name}: expected one chapter notebooks/{record_path.stem}_*.ipynb"
    return matches[0]


def printed_verdicts(text: str) -> dict[str, list[str]]:
    """claim text -> the three lines printed under each `Claim:` line (asserted, measured, verdict);
    a claim printed twice keeps its last printing, as the record keeps the last `record` call."""
    lines = text.splitlines()
    found = {}
    for i, line in enumerate(lines):
        if line.startswith("Claim: ") and " | asserted: " in line:  # `Verdict.line()`: one line, no reason
            claim, asserted, measured, verdict = line.removeprefix("Claim: ").split(" | ", 3)
            found[claim] = [asserted, measured, verdict]
        elif line.startswith("Claim: ") and i + 3 < len(lines):
            claim = line.removeprefix("Claim: ")
            found[claim] = [lines[i + k].strip() for k in (1, 2, 3)]
    return found


def _matches(record: dict, printed: dict[str, list[str]]) -> bool:
    claim = record["claim"] + (f" ({record['source']})" if record["source"] else "")
    if claim not in printed:
        return False
    asserted, measured, verdict = printed[claim]
    if verdict.startswith("verdict: ") and not verdict.startswith("verdict:  "):  # the one-line form
        verdict_matches = verdict == f"verdict: {record['verdict']}"
    else:
        verdict_matches = verdict == f"verdict:  {record['verdict']} - {record['reason']}"
    value = record["measured"]  # printed as "measured: [label: ]VALUE [LOW - HIGH] (method)", or alone when exact
    return (asserted == f"asserted: {record['asserted']}"
            and (f" {value} [" in measured or measured.endswith(f" {value}"))
            and verdict_matches)


@pytest.mark.parametrize("record_path", RECORDS, ids=[p.name for p in RECORDS])
def test_every_record_is_printed_by_its_chapter(record_path: Path) -> None:
    chapter = _chapter(record_path)
    printed = printed_verdicts(_outputs_text(chapter))
    stale = [r["claim"] for r in _records(record_path) if not _matches(r, printed)]
    assert not stale, (f"{record_path.relative_to(ROOT)} holds verdicts that {chapter.name}'s committed outputs do not "
                       "print as recorded (rerun the chapter with scripts/execute_notebooks.py):\n  " + "\n  ".join(stale))


def test_chapter_09_tables_exactly_the_records() -> None:
    recorded = {(r["chapter"], r["claim"]) for p in RECORDS for r in _records(p)}
    table = _outputs_text(next(NOTEBOOKS.glob("09_*.ipynb")))
    missing = sorted(f"[{ch}] {claim}" for ch, claim in recorded if claim not in table)
    assert not missing, "chapter 09's committed table lacks these records (rerun it last):\n  " + "\n  ".join(missing)
    # Its list of the claims that did not hold names the records' own verdicts, no other.
    markers = (": does not hold here - ", ": not resolved by this run - ")  # "[NN] claim: verdict - reason"
    listed = {line.split("] ", 1)[1].split(marker, 1)[0] for line in table.splitlines() for marker in markers
              if line.startswith("[") and marker in line}
    not_holding = {r["claim"] for p in RECORDS for r in _records(p) if r["verdict"] != "holds here"}
    assert listed == not_holding, ("chapter 09 lists other claims as not holding than the records do:\n"
                                   f"  only in 09: {sorted(listed - not_holding)}\n  only in the records: "
                                   f"{sorted(not_holding - listed)}")


def test_printed_verdicts_reads_the_verdict_block() -> None:
    from minilm_engine.course.teaching.claims import Measurement, judge, record

    verdict = judge("a thing is fast", Measurement.from_samples([1.2, 1.3, 1.25, 1.4, 1.1], unit="x"), low=1.0,
                    source="seed article")
    entry = record(verdict, "00", write=False, machine="test machine")
    printed = printed_verdicts("noise\n" + str(verdict) + "\nmore noise")
    assert _matches(entry, printed)
    other = record(judge("a thing is fast", Measurement.exact(0.5, "x"), low=1.0, source="seed article"), "00",
                   write=False, machine="test machine")
    assert not _matches(other, printed)  # same claim, another measurement: a stale record fails
    assert _matches(entry, printed_verdicts("noise\n" + verdict.line() + "\nmore noise"))  # the one-line form
    assert not _matches(other, printed_verdicts(verdict.line()))


def test_record_writes_into_this_repository_s_claims_folder() -> None:
    # A chapter's full run keeps its verdicts where this test and chapter 09 read them (the
    # course sits three folders down: minilm_engine/course/teaching/claims.py).
    from minilm_engine.course.teaching.claims import CLAIMS_DIR

    assert CLAIMS_DIR == NOTEBOOKS / "claims"
