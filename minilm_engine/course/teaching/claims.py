"""Measured claims: what the text asserts, what this run measured (with its spread), and the
verdict, printed by the cell so that prose can never drift from the numbers.

Contract:

    m = Measurement.from_samples([1.42, 1.51, 1.38, 1.47, 1.45], unit="x", label="32 vs 1")
    claim = Claim("a batch of 32 costs less than twice one request's step", high=2.0)
    print(claim.judge(m))   # Verdict: holds here / does not hold here / not resolved by this run

A claim is a range `[low, high]` (either end may be open: a direction, "faster" is `low=1.0`).
A measurement is a central value with an interval: the 95% bootstrap interval of the median
over repeats (`from_samples`), the interval of a paired ratio (`ratio`), a Wilson interval for a
proportion (`proportion`), or an exact value (`exact`, for counts that do not vary run to run).

The verdict rule (`Claim.judge`):
  - the whole interval inside the asserted range      -> "holds here"
  - the whole interval outside it                      -> "does not hold here"
  - the interval straddles an end of the range         -> "not resolved by this run"
A median on the right side is never enough: on a shared, noisy machine the interval decides.
"""

from __future__ import annotations

import datetime
import json
import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from minilm_engine.course.machine import describe_machine

HOLDS = "holds here"
FAILS = "does not hold here"
UNRESOLVED = "not resolved by this run"

_BOOTSTRAP_SEED = 0  # fixed: the same samples always give the same interval


@dataclass(frozen=True)
class Measurement:
    """A measured value with its interval.  Invariant: low <= value <= high."""

    value: float
    low: float
    high: float
    unit: str = ""
    label: str = ""
    method: str = "exact"  # how the interval was made, printed with it
    num_samples: int = 1

    def __post_init__(self) -> None:
        if not (self.low <= self.value <= self.high):
            raise ValueError(f"interval [{self.low}, {self.high}] does not contain the value {self.value}")

    @classmethod
    def exact(cls, value: float, unit: str = "", label: str = "") -> Measurement:
        """A value that does not vary from run to run (a count, a byte size, a formula)."""
        return cls(float(value), float(value), float(value), unit, label, "exact", 1)

    @classmethod
    def from_samples(cls, samples: Sequence[float], unit: str = "", label: str = "",
                     confidence: float = 0.95, num_resamples: int = 2000) -> Measurement:
        """The median of repeats and the percentile-bootstrap interval of the median.  With
        fewer than 3 samples no interval can be estimated: it is then [min, max]."""
        values = [float(s) for s in samples]
        if not values:
            raise ValueError("from_samples needs at least one sample")
        median = statistics.median(values)
        if len(values) < 3:
            return cls(median, min(values), max(values), unit, label, "range", len(values))
        low, high = _bootstrap_median(values, confidence, num_resamples)
        return cls(median, min(low, median), max(high, median), unit, label,
                   f"{confidence:.0%} bootstrap of the median", len(values))

    @classmethod
    def ratio(cls, numerators: Sequence[float], denominators: Sequence[float], unit: str = "x",
              label: str = "", confidence: float = 0.95) -> Measurement:
        """numerator / denominator from paired (alternating) repeats: each pair's ratio, then
        the bootstrap interval of their median.  Pairing cancels drift that hits both sides."""
        if len(numerators) != len(denominators):
            raise ValueError(f"paired repeats need equal counts, got {len(numerators)} and {len(denominators)}")
        if any(d == 0 for d in denominators):
            raise ValueError("a denominator repeat is zero")
        ratios = [n / d for n, d in zip(numerators, denominators, strict=True)]
        m = cls.from_samples(ratios, unit, label, confidence)
        return cls(m.value, m.low, m.high, unit, label, f"paired ratios, {m.method}", m.num_samples)

    @classmethod
    def bootstrap(cls, items: Sequence, statistic, unit: str = "", label: str = "",
                  confidence: float = 0.95, num_resamples: int = 1000) -> Measurement:
        """statistic(items) with the percentile-bootstrap interval over resamples of `items`
        (documents, requests, windows): the spread a different sample of them would give."""
        items = list(items)
        if len(items) < 2:
            raise ValueError("bootstrap needs at least two items")
        value = float(statistic(items))
        rng = random.Random(_BOOTSTRAP_SEED)
        stats = sorted(float(statistic(rng.choices(items, k=len(items)))) for _ in range(num_resamples))
        tail = (1 - confidence) / 2
        low, high = stats[int(tail * (num_resamples - 1))], stats[math.ceil((1 - tail) * (num_resamples - 1))]
        return cls(value, min(low, value), max(high, value), unit, label,
                   f"{confidence:.0%} bootstrap over {len(items)} items", len(items))

    @classmethod
    def proportion(cls, successes: int, trials: int, label: str = "", confidence: float = 0.95) -> Measurement:
        """A rate (acceptance, accuracy) in percent, with its Wilson score interval."""
        if trials <= 0 or not 0 <= successes <= trials:
            raise ValueError(f"need 0 <= successes <= trials and trials > 0, got {successes}/{trials}")
        z = statistics.NormalDist().inv_cdf(0.5 + confidence / 2)
        p = successes / trials
        centre = (p + z * z / (2 * trials)) / (1 + z * z / trials)
        half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / (1 + z * z / trials)
        low, high = min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))
        return cls(100 * p, 100 * low, 100 * high, "%", label, f"{confidence:.0%} Wilson interval", trials)

    def __str__(self) -> str:
        name = f"{self.label}: " if self.label else ""
        if self.method == "exact":
            return f"{name}{_fmt(self.value, self.unit)}"
        return (f"{name}{_fmt(self.value, self.unit)} [{_fmt(self.low, self.unit)} - {_fmt(self.high, self.unit)}] "
                f"({self.method}, n={self.num_samples})")


@dataclass(frozen=True)
class Verdict:
    claim: Claim
    measurement: Measurement
    status: str  # HOLDS, FAILS or UNRESOLVED
    reason: str

    @property
    def holds(self) -> bool | None:
        """True, False, or None when this run cannot tell."""
        return {HOLDS: True, FAILS: False}.get(self.status)

    def __str__(self) -> str:
        source = f" ({self.claim.source})" if self.claim.source else ""
        return (f"Claim: {self.claim.text}{source}\n"
                f"  asserted: {self.claim.range_text(self.measurement.unit)}\n"
                f"  measured: {self.measurement}\n"
                f"  verdict:  {self.status} - {self.reason}")


@dataclass(frozen=True)
class Claim:
    """What the text asserts: the value lies in [low, high] (None = open end)."""

    text: str
    low: float | None = None
    high: float | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if self.low is None and self.high is None:
            raise ValueError("a claim needs low, high or both")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"low {self.low} > high {self.high}")

    def range_text(self, unit: str = "") -> str:
        if self.low is None:
            return f"below {_fmt(self.high, unit)}"
        if self.high is None:
            return f"above {_fmt(self.low, unit)}"
        return f"between {_fmt(self.low, unit)} and {_fmt(self.high, unit)}"

    def judge(self, m: Measurement) -> Verdict:
        below = self.low is not None and m.high < self.low  # whole interval under the range
        above = self.high is not None and m.low > self.high
        inside = (self.low is None or m.low >= self.low) and (self.high is None or m.high <= self.high)
        u = m.unit
        if inside:
            return Verdict(self, m, HOLDS, f"the whole interval [{_fmt(m.low, u)}, {_fmt(m.high, u)}] "
                                            f"is {self.range_text(u)}")
        if below:
            return Verdict(self, m, FAILS, f"even the top of the interval, {_fmt(m.high, u)}, is below {_fmt(self.low, u)}")
        if above:
            return Verdict(self, m, FAILS, f"even the bottom of the interval, {_fmt(m.low, u)}, is above {_fmt(self.high, u)}")
        edge = self.low if self.low is not None and m.low < self.low <= m.high else self.high
        return Verdict(self, m, UNRESOLVED, f"the interval [{_fmt(m.low, u)}, {_fmt(m.high, u)}] contains "
                                            f"the threshold {_fmt(edge, u)}: more samples (repeats, documents) or a quieter machine")


def judge(text: str, m: Measurement, low: float | None = None, high: float | None = None, source: str = "") -> Verdict:
    """Shorthand for a cell: `print(judge("speculation is faster", m, low=1.0))`."""
    return Claim(text, low, high, source).judge(m)


def _bootstrap_median(values: list[float], confidence: float, num_resamples: int) -> tuple[float, float]:
    rng = random.Random(_BOOTSTRAP_SEED)
    n = len(values)
    medians = sorted(statistics.median(rng.choices(values, k=n)) for _ in range(num_resamples))
    tail = (1 - confidence) / 2
    return medians[int(tail * (num_resamples - 1))], medians[math.ceil((1 - tail) * (num_resamples - 1))]


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "%":
        return f"{x:.1f}%" if abs(x) >= 1 else f"{x:.2g}%"  # 0.047%, not 0.0%
    if unit == "":
        return f"{x:.3g}" if abs(x) >= 1e-3 or x == 0 else f"{x:.2e}"
    if unit == "x":
        return f"{x:.2f}x"
    return f"{x:.3g} {unit}"


# -- the seed claims, judged in one place ---------------------------------------------------------

CLAIMS_DIR = Path(__file__).resolve().parents[3] / "notebooks" / "claims"  # teaching -> course -> minilm_engine -> the repository


def record(verdict: Verdict, chapter: str, write: bool = True, folder: Path | None = None,
           machine: str | None = None) -> dict:
    """Keep a chapter's verdict on a seed claim in `notebooks/claims/<chapter>.json` (one entry
    per claim text, so a rerun replaces it), for the course's table of seed claims.  Each entry
    names the machine it was measured on (`machine.describe_machine()` unless given) and the UTC
    date: a verdict on timings holds for that machine, and a table that mixes machines says so.
    A smoke run passes `write=False`: its small sizes must not overwrite the full run's numbers."""
    m = verdict.measurement
    entry = {"chapter": chapter, "claim": verdict.claim.text, "source": verdict.claim.source,
             "asserted": verdict.claim.range_text(m.unit), "measured": _fmt(m.value, m.unit),
             "interval": f"[{_fmt(m.low, m.unit)}, {_fmt(m.high, m.unit)}]", "method": m.method,
             "verdict": verdict.status, "reason": verdict.reason,
             "machine": describe_machine() if machine is None else machine,
             "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}
    folder = CLAIMS_DIR if folder is None else folder
    if write and folder.parent.is_dir():  # an installed package has no notebooks/ beside it: keep nothing
        folder.mkdir(exist_ok=True)
        path = folder / f"{chapter}.json"
        entries = json.loads(path.read_text()) if path.exists() else {}
        entries[verdict.claim.text] = entry
        path.write_text(json.dumps(entries, indent=1, ensure_ascii=False) + "\n")
    return entry


def seed_claims_table(folder: Path | None = None) -> list[dict]:
    """Every recorded verdict, chapter by chapter (the rows of the course's seed-claims table).
    A record written before records named their machine has machine "not recorded"."""
    folder = CLAIMS_DIR if folder is None else folder
    rows = []
    for path in sorted(folder.glob("*.json")):
        rows += [{"machine": "not recorded", "date": "", **entry} for entry in json.loads(path.read_text()).values()]
    return rows


def machines_of(rows: Sequence[dict]) -> dict[str, list[str]]:
    """machine -> the chapters whose verdicts were measured on it, in order: one key when the
    whole table comes from one machine, several when its timings must not be compared."""
    machines: dict[str, list[str]] = {}
    for row in rows:
        chapters = machines.setdefault(row.get("machine", "not recorded"), [])
        if row["chapter"] not in chapters:
            chapters.append(row["chapter"])
    return machines
