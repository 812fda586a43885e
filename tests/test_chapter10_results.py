"""Chapter 10's stated results, held against its committed outputs (a full run): the prose states
these verdicts and observations in words, so a rerun that changed them must change the prose."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from test_notebook_claims import printed_verdicts
from test_notebook_prose import _output_text

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "10_the_view_from_outside.ipynb"

# claim text (as printed) -> the verdict the prose states
STATED = {
    "latency jitters: your gaps spread out when others' traffic shares the server, below its capacity": "holds here",
    "halving a long prompt more than halves its first-token wait (prefill grows faster than linearly)":
        "not resolved by this run",
    "putting the stable text first makes the first token come sooner": "holds here",
    "rate limits are counted in tokens: the same number of requests, more of them refused when they are bigger":
        "holds here",
    "jitter spreads retries that come back together: fewer refused attempts than honouring Retry-After alone":
        "holds here",
    "a batch tier is cheaper: relaxed latency lets the same machine make more tokens an hour": "holds here",
    "with a backlog, interactive requests wait less under priority than under FCFS": "holds here",
    "a long prefill in a shared step stalls the streams: separate pools remove the stall": "holds here",
    "chunking makes the long prompt itself wait longer for its first token": "holds here",
}


def _nb():
    return nbformat.read(NOTEBOOK, as_version=4)


def test_the_verdicts_the_prose_states_are_the_committed_ones() -> None:
    printed = printed_verdicts(_output_text(_nb()))
    by_text = {claim.split(" (seed article")[0]: lines for claim, lines in printed.items()}
    for claim, verdict in STATED.items():
        assert claim in by_text, f"chapter 10 no longer prints {claim!r}"
        assert by_text[claim][2].startswith(f"verdict:  {verdict}"), (claim, by_text[claim][2])


def test_the_observations_the_prose_states() -> None:
    text = _output_text(_nb())
    # the cap on one request is not set by concurrency: 300 tokens ran among 8 streams; 400 refused
    assert "the server accepted 300 tokens among 8 streams (HTTP 200) and refused 400 (HTTP 400)" in text
    # both attentions measured side by side: halving more than halves the wait with each, a little more
    # with the reference (which writes T x T), and the reference is slower at the longest prompt
    line = next(x for x in text.splitlines() if x.startswith("measured side by side, halving"))
    default, reference = (float(m) for m in re.findall(r"\) (\d+\.\d+)x \[", line))
    assert 2.0 < default < reference
    slower = next(x for x in text.splitlines() if "reference / default" in x)
    assert float(re.search(r"reference / default \d+\.\d+x \[(\d+\.\d+)x", slower).group(1)) > 1.0
    # in time, each fit's T^2 term catches up with its T term before the FLOP crossover T*, the reference's first
    crossovers = {name: float(value.replace(",", "")) for name, value in
                  re.findall(r"fit, (default|reference): .* at T = ([\d,]+) tokens", text)}
    t_star = float(re.search(r"noodle-chef: T\* = ([\d,]+) tokens", text).group(1).replace(",", ""))
    assert crossovers["reference"] < crossovers["default"] < t_star
    # retry storm: Retry-After alone sends the most 429s and finishes soonest; the H100's memory as reported
    assert "measured: most 429s Retry-After, no jitter, soonest Retry-After, no jitter" in text
    assert "85.52e9 bytes" in text


def test_the_chapter_has_figures_and_no_solution_before_its_exercise() -> None:
    nb = _nb()
    pngs = sum("image/png" in out.get("data", {}) for c in nb.cells if c.cell_type == "code" for out in c.outputs)
    assert pngs >= 3
    sources = [c.source for c in nb.cells]
    exercise = next(i for i, s in enumerate(sources) if "def take_from_bucket" in s)
    bucket = next(i for i, s in enumerate(sources) if "show_source(rate_limit.TokenBucket)" in s)
    assert bucket > exercise, "the TokenBucket's source is shown before the exercise that asks for it"
    assert not any(".solution(" in s or "solved_" in s for s in sources)
