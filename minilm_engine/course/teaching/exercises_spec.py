"""Chapter 05's exercises: the acceptance rule of speculative decoding, and tokens per round.

    acceptance_rule_exercise   write one position's accept-or-resample step; the checker runs it
                               thousands of times on small random distributions and tests, with
                               a chi-square test, that what comes out is distributed as the
                               target's p (and that it accepts as often as it should)
    tokens_per_round_exercise  predict the mean tokens per verification round from alpha and K,
                               checked on stored cases (course/teaching/fixtures/tokens_per_round.json)
"""

from __future__ import annotations

import inspect
import random

import torch

from minilm_engine.worker.spec_decode import rejection_sampler
from minilm_engine.course.teaching.exercises import CallWatch, CheckResult, Exercise, _unwrap, nudge, package_functions

NUM_TRIALS = 4000
P_VALUE_FLOOR = 1e-3  # a correct rule fails this about once in a thousand seeds; seeds are fixed


def reference_accept_or_resample(p: torch.Tensor, q: torch.Tensor, draft_token: int, generator: torch.Generator) -> int:
    """One position of the engine's rule (`worker/spec_decode/rejection_sampler.py`): keep the draft
    with probability min(1, p/q), else draw from the normalized max(p - q, 0)."""
    u = torch.rand((), generator=generator).item()
    if u < rejection_sampler.accept_probability(p[draft_token].item(), q[draft_token].item()):
        return draft_token
    recovered = rejection_sampler.recovered_distribution(p, q)
    return int(torch.multinomial(recovered, 1, generator=generator))


class AcceptanceRuleExercise:
    """Checks `fn(p, q, draft_token, generator) -> token` statistically (see the module doc)."""

    name = "accept_or_resample"

    # The package's own rule and the pieces it is made of: passed or called, they get a nudge.
    package = (
        "minilm_engine.course.teaching.exercises_spec:reference_accept_or_resample",
        "minilm_engine.worker.spec_decode.rejection_sampler:recovered_distribution",
        "minilm_engine.worker.spec_decode.rejection_sampler:accept_probability",
    )

    def check(self, fn, num_cases: int = 3, seed: int = 0) -> CheckResult:
        if not callable(fn):
            return CheckResult(False, 0, f"{self.name}: pass your function itself, got {fn!r}")
        own = package_functions(self.package)
        if _unwrap(fn) in own:
            return CheckResult(False, 0, nudge(self.name, own[_unwrap(fn)], self.hint()))
        with CallWatch(own) as watch:
            result = self._check(fn, num_cases, seed)
        if watch.called:
            return CheckResult(False, result.num_cases, nudge(self.name, watch.called[0], self.hint())
                               + " (your function calls it.)")
        return result

    def _check(self, fn, num_cases: int, seed: int) -> CheckResult:
        from scipy.stats import chisquare

        rng = random.Random(seed)
        for case in range(num_cases):
            vocab = rng.randint(3, 6)
            gen = torch.Generator().manual_seed(rng.randrange(2**31))
            p = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)  # (V,) target
            q = torch.softmax(torch.randn(vocab, generator=gen) * 1.5, dim=-1)  # (V,) draft
            counts = [0] * vocab
            num_kept = 0
            for _ in range(NUM_TRIALS):
                draft_token = int(torch.multinomial(q, 1, generator=gen))
                try:
                    token = fn(p.clone(), q.clone(), draft_token, gen)
                except NotImplementedError:
                    return CheckResult(False, case, f"{self.name}: not implemented yet")
                except Exception as e:  # the learner's bug, reported rather than raised
                    return CheckResult(False, case, f"{self.name} raised {type(e).__name__}: {e}")
                if isinstance(token, torch.Tensor) and token.numel() == 1:
                    token = token.item()
                if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                    return CheckResult(False, case, f"{self.name} must return a token id in [0, {vocab}), got {token!r}")
                counts[token] += 1
                num_kept += token == draft_token
            expected = (p.double() * NUM_TRIALS).tolist()
            p_value = chisquare(counts, [e * NUM_TRIALS / sum(expected) for e in expected]).pvalue
            if p_value < P_VALUE_FLOOR:
                shown = ", ".join(f"{c / NUM_TRIALS:.3f} vs {x:.3f}" for c, x in zip(counts, p.tolist()))
                return CheckResult(
                    False, case,
                    f"{self.name}: over {NUM_TRIALS} rounds the tokens are not distributed as the target's p "
                    f"(chi-square p-value {p_value:.1e}); frequency vs p per token: {shown}. "
                    "Check the acceptance probability and what you sample from after a rejection.",
                )
            # Resampling from p after every rejection is distributed right too, but wastes
            # drafts: the rule keeps one with probability sum_x min(p(x), q(x)), and no less.
            min_kept = float(torch.minimum(p, q).sum())
            if num_kept / NUM_TRIALS < min_kept - 0.05:
                return CheckResult(
                    False, case,
                    f"{self.name}: the output is distributed right, but you keep the draft only "
                    f"{num_kept / NUM_TRIALS:.0%} of the time; the rule keeps it at least "
                    f"{min_kept:.0%} (sum of min(p, q)): you are throwing good drafts away",
                )
        return CheckResult(True, num_cases, f"{self.name}: the output follows the target's distribution "
                                            f"in all {num_cases} random cases ({NUM_TRIALS} rounds each)")

    def hint(self) -> str:
        return ("Draw u uniform in [0, 1). Keep the draft when u < p[d] / q[d]. Otherwise the "
                "target wants more of some tokens than the draft gave: sample from "
                "max(p - q, 0), normalized.")

    def solution(self):
        from IPython.display import HTML
        import html

        source = html.escape(inspect.getsource(reference_accept_or_resample))
        return HTML(f"<details><summary>Show the solution</summary><pre>{source}</pre></details>")


acceptance_rule_exercise = AcceptanceRuleExercise()


def make_tokens_per_round_case(rng: random.Random) -> dict:
    """alpha from 0 to 1, both ends included (alpha = 1 is the edge the hint names)."""
    return {"alpha": round(rng.choice([0.0, 0.3, 0.5, 0.8, 0.95, 1.0, rng.random()]), 3),
            "num_speculative_tokens": rng.randint(1, 8)}


tokens_per_round_exercise = Exercise(
    "tokens_per_round",
    "tokens_per_round",  # cases answered by spec_decode.metrics.expected_tokens_per_round
    compare=lambda got, want: isinstance(got, (int, float)) and not isinstance(got, bool) and abs(got - want) < 1e-6,
    hint="A round always yields the target's own token, plus draft i when drafts 1..i were all "
         "accepted (probability alpha^i). Mind alpha = 1.",
    shows=("minilm_engine.core.spec_decode_stats:expected_tokens_per_round",),
    solutions="05_speculative_decoding_solutions.ipynb",
)
