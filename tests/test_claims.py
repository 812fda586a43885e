"""The measured-claim helper: intervals that contain what they should, and a verdict rule that
gives "holds" only when the whole interval is inside the asserted range, "does not hold" only
when it is wholly outside, and "not resolved" when it straddles the threshold.  Each case below
is one that a plausible wrong rule (compare the median only, or require overlap only) fails."""

from __future__ import annotations

import random
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from minilm_engine.course.teaching.claims import FAILS, HOLDS, UNRESOLVED, Claim, Measurement, judge


def test_the_median_on_the_right_side_is_not_enough() -> None:
    # Median 1.1 (above 1.0), but the repeats swing from 0.8 to 1.4: a median rule says "holds".
    m = Measurement.from_samples([0.8, 1.3, 1.1, 0.9, 1.4, 1.2, 1.0], unit="x")
    assert m.value == pytest.approx(1.1)
    verdict = judge("speculation is faster", m, low=1.0)
    assert verdict.status == UNRESOLVED and verdict.holds is None
    assert "1.00x" in verdict.reason  # names the threshold the interval contains


def test_holds_and_fails_need_the_whole_interval() -> None:
    tight_above = Measurement.from_samples([1.52, 1.55, 1.49, 1.51, 1.53], unit="x")
    tight_below = Measurement.from_samples([0.61, 0.64, 0.62, 0.60, 0.63], unit="x")
    claim = Claim("quantized decode is faster", low=1.0)
    assert claim.judge(tight_above).status == HOLDS and claim.judge(tight_above).holds is True
    assert claim.judge(tight_below).status == FAILS and claim.judge(tight_below).holds is False
    # An overlap rule ("some of the interval is inside") would call this one holds.
    partly = Measurement(1.9, 1.7, 2.2, "x")
    assert Claim("batch 32 costs under 2x", high=2.0).judge(partly).status == UNRESOLVED
    # A two-sided range: wholly above it is a failure, with the bottom of the interval named.
    v = Claim("three to five times cheaper", low=3.0, high=5.0).judge(Measurement(12.9, 12.1, 13.6, "x"))
    assert v.status == FAILS and "12.10x" in v.reason and "above 5.00x" in v.reason


def test_the_verdict_prints_claim_measurement_and_reason() -> None:
    text = str(judge("the draft is accepted about 96% of the time", Measurement.proportion(4940, 5000),
                     low=94, high=97, source="seed article"))
    assert "seed article" in text and "98.8%" in text and "does not hold here" in text
    assert "Wilson" in text and "n=5000" in text


def test_bootstrap_interval_covers_the_true_median_about_95_percent_of_the_time() -> None:
    # A wrong interval (e.g. the standard error of one sample, or min-max of 3 of them) covers
    # far less or far more; this one should be near its nominal level.
    rng = random.Random(1)
    num_covered, num_trials = 0, 300
    for _ in range(num_trials):
        samples = [rng.lognormvariate(0, 0.3) for _ in range(15)]
        m = Measurement.from_samples(samples, num_resamples=400)
        num_covered += m.low <= 1.0 <= m.high  # the lognormal's median is exp(0) = 1
    assert 0.85 <= num_covered / num_trials <= 0.995


def test_paired_ratio_cancels_drift_that_hits_both_sides() -> None:
    # The machine slows down 3x over the run; the true ratio stays 2.0.  Unpaired medians blur
    # it, paired ratios do not.
    drift = [1.0, 1.5, 2.0, 2.5, 3.0, 2.0, 1.2]
    slow = [2.0 * d for d in drift]
    m = Measurement.ratio(slow, drift)
    assert m.value == pytest.approx(2.0) and m.low == pytest.approx(2.0) and m.high == pytest.approx(2.0)
    assert judge("twice as slow", m, low=1.9, high=2.1).status == HOLDS
    with pytest.raises(ValueError, match="equal counts"):
        Measurement.ratio([1.0, 2.0], [1.0])


def test_wilson_interval_for_a_proportion() -> None:
    m = Measurement.proportion(19, 24)  # 79.2% of receipts
    assert m.unit == "%" and m.value == pytest.approx(79.17, abs=0.01)
    assert 55 < m.low < 65 and 90 < m.high < 95  # wide: 24 documents cannot separate 79% from 87%
    assert judge("AWQ makes receipts worse than 87.5%", m, high=87.5).status == UNRESOLVED
    assert Measurement.proportion(0, 10).low == 0.0 and Measurement.proportion(10, 10).high == 100.0
    with pytest.raises(ValueError):
        Measurement.proportion(11, 10)


def test_bad_claims_and_measurements_are_refused() -> None:
    with pytest.raises(ValueError, match="low, high or both"):
        Claim("says nothing")
    with pytest.raises(ValueError, match="low 2 > high 1"):
        Claim("backwards", low=2, high=1)
    with pytest.raises(ValueError, match="does not contain"):
        Measurement(5.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="at least one"):
        Measurement.from_samples([])
    assert Measurement.from_samples([3.0, 1.0]).method == "range"  # two repeats: no bootstrap


@given(st.lists(st.floats(0.01, 100), min_size=1, max_size=12), st.floats(0.01, 100), st.floats(0.01, 100))
def test_verdict_is_consistent_with_the_interval(samples: list[float], a: float, b: float) -> None:
    low, high = min(a, b), max(a, b)
    m = Measurement.from_samples(samples, num_resamples=50)
    assert m.low <= statistics.median(samples) <= m.high
    status = Claim("in range", low, high).judge(m).status
    if status == HOLDS:
        assert low <= m.low and m.high <= high
    elif status == FAILS:
        assert m.high < low or m.low > high
    else:
        assert m.low < low <= m.high or m.low <= high < m.high


def test_bootstrap_over_items_separates_a_real_change_from_noise() -> None:
    # Paired per-document losses: a change of 1% in every document is real; a change that is
    # +5% on half the documents and -5% on the other half is noise around zero.
    rng = random.Random(2)
    base = [rng.uniform(1.0, 2.0) for _ in range(40)]
    real = list(zip(base, [b * 1.01 for b in base]))
    noisy = list(zip(base, [b * (1.05 if i % 2 else 0.95) for i, b in enumerate(base)]))

    def change(pairs):
        return 100 * (sum(q for _, q in pairs) / sum(b for b, _ in pairs) - 1)

    assert judge("quantization raises the loss", Measurement.bootstrap(real, change, "%"), low=0).status == HOLDS
    assert judge("quantization raises the loss", Measurement.bootstrap(noisy, change, "%"), low=0).status == UNRESOLVED
    with pytest.raises(ValueError, match="two items"):
        Measurement.bootstrap([1.0], sum)


def test_recorded_verdicts_make_one_table_and_a_rerun_replaces_its_row(tmp_path) -> None:
    from minilm_engine.course.teaching.claims import record, seed_claims_table

    v1 = judge("batching 32 costs little more than 1", Measurement(2.7, 2.2, 3.0, "x"), high=1.5, source="seed")
    record(v1, "01", folder=tmp_path)
    record(judge("speculation helps one user", Measurement(1.4, 1.2, 1.6, "x"), low=1.0), "05", folder=tmp_path)
    v1_again = judge("batching 32 costs little more than 1", Measurement(1.2, 1.1, 1.3, "x"), high=1.5)
    record(v1_again, "01", folder=tmp_path)
    rows = seed_claims_table(tmp_path)
    assert [(r["chapter"], r["verdict"]) for r in rows] == [("01", HOLDS), ("05", HOLDS)]
    assert rows[0]["measured"] == "1.20x" and rows[0]["interval"] == "[1.10x, 1.30x]"
    smoke = record(v1, "07", write=False, folder=tmp_path)
    assert smoke["verdict"] == FAILS and not (tmp_path / "07.json").exists()


def test_each_record_names_its_machine_and_the_table_says_when_machines_mix(tmp_path) -> None:
    import json

    from minilm_engine.course.machine import describe_machine
    from minilm_engine.course.teaching.claims import machines_of, record, seed_claims_table

    holds = judge("speculation helps one user", Measurement(1.4, 1.2, 1.6, "x"), low=1.0)
    entry = record(holds, "05", folder=tmp_path)
    assert entry["machine"] == describe_machine() and len(entry["date"]) == len("2026-12-02")
    record(judge("batching is cheap", Measurement(1.2, 1.1, 1.3, "x"), high=1.5), "01", folder=tmp_path,
           machine="Some Xeon, AVX-512, 2 cores")
    # a record from before records named their machine
    (tmp_path / "04.json").write_text(json.dumps({"old": {"chapter": "04", "claim": "old", "verdict": HOLDS}}))
    rows = seed_claims_table(tmp_path)
    assert machines_of(rows) == {"Some Xeon, AVX-512, 2 cores": ["01"], "not recorded": ["04"],
                                 describe_machine(): ["05"]}
    assert list(machines_of([r for r in rows if r["chapter"] == "05"])) == [describe_machine()]
