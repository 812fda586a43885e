"""Chapters 07 and 08 state results in prose; their committed outputs must still print them.

Each test reads a line the chapter prints (the format is the chapter's own) and checks the
direction the prose states.  A rerun that changes a direction fails here, so the words cannot
drift from the numbers (CHAPTER.md: "a test holds each stated result against the committed outputs").
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NUMBER = r"(-?\d+(?:\.\d+)?(?:e[+-]\d+)?)"


def _outputs(name: str) -> str:
    nb = nbformat.read(next((ROOT / "notebooks").glob(f"{name}_*.ipynb")), as_version=4)
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if "text" in out:
                parts.append(out["text"])
            elif "text/plain" in out.get("data", {}):
                parts.append(out["data"]["text/plain"])
    return "\n".join(parts)


def _interval(text: str, label: str) -> tuple[float, float, float]:
    """(value, low, high) of a printed Measurement `label: V [L - H] (...)`, units stripped."""
    match = re.search(re.escape(label) + rf": {NUMBER}\s*\S*? \[{NUMBER}\s*\S*? - {NUMBER}", text)
    assert match, f"no printed measurement {label!r}"
    return tuple(float(g) for g in match.groups())


def test_07_overload_grows_with_the_run_and_a_capped_client_hides_it() -> None:
    text = _outputs("07")
    block = text.split("Claim: past capacity, TTFT grows with how long the overload lasts", 1)[1]
    assert block.splitlines()[3].strip().startswith("verdict:  holds here")
    first, whole = map(float, re.search(rf"first \S+ s: {NUMBER} ms .*?; of all \S+ s: {NUMBER} ms", text).groups())
    assert whole >= first  # prose: the longer run has the worse tail
    send = _interval(text, "TTFT p50 from the send")
    due = _interval(text, "TTFT p50 from the due time")
    assert due[1] > send[2], "prose: from the due time the wait is longer than from the send"


def test_07_littles_law_holds_on_most_rows() -> None:
    text = _outputs("07")
    table = text.split("L / (lambda x W)  \n", 1)[1]
    ratios = [float(line.split()[-1]) for line in table.splitlines() if re.fullmatch(r"\d+\s+\d+\s+\d+\.\d+\s*", line)]
    assert len(ratios) >= 4
    close = [r for r in ratios if 0.8 <= r <= 1.2]
    assert len(close) > len(ratios) / 2  # prose: the two sides agree on most rows


def test_07_others_traffic_slows_your_tokens_resolved() -> None:
    text = _outputs("07")
    alone = _interval(text, "your ITL p50 at 0 req/s of background")
    busy = re.search(rf"your ITL p50 at (?!0 req)\S+ req/s of background: {NUMBER} ms \[{NUMBER} ms - {NUMBER}", text)
    assert busy and float(busy.group(2)) > alone[2], "prose: the two intervals do not overlap"


def test_07_streaming_brings_the_first_text_forward_and_not_the_last() -> None:
    text = _outputs("07")
    assert _interval(text, "first text, whole / streamed")[1] > 1
    assert _interval(text, "last token, streamed / whole")[1] >= 0.97  # prose: no sooner


def test_07_speculation_pays_at_both_loads() -> None:
    text = _outputs("07")
    for level in ("one user", "16 users"):
        assert _interval(text, f"TPOT off / on, {level}")[1] > 1


def test_08_the_tpot_limit_binds_and_the_modelled_70b_ladder_crosses_ten() -> None:
    text = _outputs("08")
    assert "the limit binds: broken from" in text
    batch1, batch8 = map(float, re.search(rf"modelled: {NUMBER} \$/Mtok at batch 1 -> {NUMBER} at batch 8", text).groups())
    assert batch1 >= 10 > batch8  # prose: tens of dollars at batch 1, under ten at batch 8


def test_08_the_half_price_batch_tier_earns_less_per_hour_on_this_cpu() -> None:
    ratio = float(re.search(rf"at 50% off it earns {NUMBER}x as much per hour", _outputs("08")).group(1))
    assert ratio < 1  # prose: on this machine the discount does not pay for itself
