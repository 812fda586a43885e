"""Chapter 08's fleet-sizing exercise: the stored questions, a right answer, and each usual wrong
answer with its own message."""

from __future__ import annotations

import json
import math

from minilm_engine.course.teaching import judgment_fleet as jf
from minilm_engine.course.teaching.exercises import FIXTURES_DIR

STORED = json.loads((FIXTURES_DIR / "fleet_cases.json").read_text())


def size_fleet(sweep, target_tokens_per_s, slo, price_per_hour, utilization):
    """A right answer, written from the exercise's definitions."""
    ok = [p for p in sweep if p["p99_tpot_ms"] <= slo["p99_tpot_ms"] and p["p99_ttft_ms"] <= slo["p99_ttft_ms"]]
    if not ok:
        return None
    best = max(ok, key=lambda p: p["tokens_per_s"])
    n = math.ceil(target_tokens_per_s / best["tokens_per_s"])
    return best["max_num_seqs"], n, n * price_per_hour / (target_tokens_per_s * utilization * 3600) * 1e6


def answered(i):
    return size_fleet(**STORED[i]["inputs"])


def test_the_stored_answers_follow_from_their_sweeps():
    assert any(c["expected"] is None for c in STORED) and len({tuple(c["expected"]["max_num_seqs"])
                                                                for c in STORED if c["expected"]}) >= 3
    for i, raw in enumerate(STORED):
        got, want = answered(i), raw["expected"]
        if want is None:
            assert got is None
        else:
            assert got[0] in want["max_num_seqs"] and got[1] == want["num_replicas"]
            assert math.isclose(got[2], want["cost_per_mtok"])
        assert set(jf.FLEET.case(i).__dataclass_fields__) == {"index", "sweep", "target_tokens_per_s", "slo",
                                                              "price_per_hour", "utilization"}


def test_a_right_answer_passes():
    assert jf.FLEET.check(size_fleet).passed
    for i in range(len(STORED)):
        a = answered(i)
        assert (jf.FLEET.check_answer(i, None) if a is None else jf.FLEET.check_answer(i, *a)).passed

    def todo(**kwargs):
        raise NotImplementedError

    assert "not implemented" in jf.FLEET.check(todo).message


def wrong(i, *answer):
    result = jf.FLEET.check_answer(i, *answer)
    assert not result.passed
    return result.message


def test_each_usual_mistake_gets_its_own_message():
    # a case where the fastest row breaks the SLO, and one row within it needs more replicas than the best
    i = next(k for k, c in enumerate(STORED) if c["expected"] and any(
        p["p99_tpot_ms"] > c["inputs"]["slo"]["p99_tpot_ms"] for p in c["inputs"]["sweep"])
        and c["inputs"]["utilization"] != 1.0)
    inputs = STORED[i]["inputs"]
    b, n, cost = answered(i)
    slo = inputs["slo"]
    breaking = next(p for p in inputs["sweep"] if p["p99_tpot_ms"] > slo["p99_tpot_ms"] or p["p99_ttft_ms"] > slo["p99_ttft_ms"])
    slower_ok = next(p for p in inputs["sweep"] if p["max_num_seqs"] != b and p["p99_tpot_ms"] <= slo["p99_tpot_ms"]
                     and p["p99_ttft_ms"] <= slo["p99_ttft_ms"]
                     and math.ceil(inputs["target_tokens_per_s"] / p["tokens_per_s"]) > n)
    best_tps = next(p["tokens_per_s"] for p in inputs["sweep"] if p["max_num_seqs"] == b)
    u, price, target = inputs["utilization"], inputs["price_per_hour"], inputs["target_tokens_per_s"]
    messages = {
        "breaks the SLO": wrong(i, breaking["max_num_seqs"], n, cost),
        "quickest per user, more replicas": wrong(i, slower_ok["max_num_seqs"], n, cost),
        "rounded down": wrong(i, b, math.floor(target / best_tps), cost),
        "too many": wrong(i, b, n + 1, cost),
        "idle hours unpaid": wrong(i, b, n, cost * u),
        "one replica at full speed": wrong(i, b, n, price / (best_tps * u * 3600) * 1e6),
        "hours and seconds": wrong(i, b, n, cost / 3600),
        "no answer where there is one": wrong(i, None),
    }
    assert "breaks the SLO" in messages["breaks the SLO"]
    assert "quickest per user is not the cheapest" in messages["quickest per user, more replicas"]
    assert "rounded up, never down" in messages["rounded down"]
    assert "more than" in messages["too many"]
    assert "divide by the utilization" in messages["idle hours unpaid"]
    assert "rounding-up is paid" in messages["one replica at full speed"]
    assert "3600" in messages["hours and seconds"]
    assert "at least one" in messages["no answer where there is one"]
    assert len(set(messages.values())) == len(messages)
    none_case = next(k for k, c in enumerate(STORED) if c["expected"] is None)
    assert "Answer None" in wrong(none_case, 1, 5, 1.0)


def test_malformed_answers_get_feedback_not_a_traceback():
    i = next(k for k, c in enumerate(STORED) if c["expected"])
    b, n, cost = answered(i)
    assert "was not measured" in wrong(i, 3, n, cost)
    assert "whole number" in wrong(i, b, float(n), cost)
    assert "must be a number" in wrong(i, b, n, "cheap")
    assert "ZeroDivisionError" in jf.FLEET.check(lambda **k: 1 / 0).message


def test_an_unanswered_placeholder_is_told_so():
    assert "not answered yet" in jf.FLEET.check_answer(0, ..., ..., ...).message
