"""The seed article's toy, in our words: diners who eat at different speeds, round table vs belt.

The seed models a request as a diner with an eating speed (uniform in 0.4-1.2) who finishes a
bowl when `progress`, growing by `speed * 0.1` per round, reaches 1.  Its two policies:

    round table (static)    the whole table eats at the pace of its SLOWEST diner, and a new
                            table sits down only when everybody is done
    conveyor belt           everyone eats at their own pace; an empty seat is refilled at once
                            (continuous)

and the table never runs out of diners (a closed loop: `play_seed_toy`).  Chapter 01's toy
(`toy_simulator`) counts steps instead: every request makes one token per step and differs only
in how many tokens it needs.  The two are the same model in disguise: a diner of speed `s` needs
`rounds_to_finish(s)` = ceil(1 / (0.1 s)) rounds (9 to 25), and "the table eats at the slowest
pace" lasts exactly as long as "the table waits for its longest request".  So on one queue of
diners (`compare_toys`) both toys predict the same number of rounds and the same gain; they part
on latency: the seed slows a quick diner to the slowest one's pace, while a real static batch
(and chapter 01's toy) lets a short request finish at its own length and only keeps its seat
busy.  `engine_on_diners` serves the same lengths with the real engine, both ways.

Where both toys mislead (what the engine shows): every step costs the same in a toy, whoever
is seated, while a real step grows with the batch and pays a prefill for each newcomer; the
toy's queue never runs dry and has no memory limit; and the seed's lengths vary only 2.8x,
where real answers run from one word to an essay (a longer tail makes static batching worse).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.experiments.batching import timed_generate
from minilm_engine.course.experiments.toy_simulator import simulate
from minilm_engine.course.experiments.workloads import Workload

SPEED_RANGE = (0.4, 1.2)  # the seed's eating speeds
BITE = 0.1  # share of a bowl eaten per round at speed 1


def rounds_to_finish(speed: float, bite: float = BITE) -> int:
    """Rounds a diner eating `speed * bite` of a bowl per round needs to finish it, counted the
    way the seed's loop counts them (adding the bite until progress >= 1, in floating point)."""
    if not (isinstance(speed, (int, float)) and speed > 0 and bite > 0):
        raise ValueError(f"speed and bite must be positive, got {speed!r}, {bite!r}")
    progress, rounds = 0.0, 0
    while progress < 1.0:
        progress += speed * bite
        rounds += 1
    return rounds


def draw_speeds(num_diners: int, seed: int = 0, speed_range=SPEED_RANGE) -> list[float]:
    rng = random.Random(seed)
    return [rng.uniform(*speed_range) for _ in range(num_diners)]


def play_seed_toy(num_seats: int, num_rounds: int, continuous: bool, seed: int = 0) -> int:
    """The seed's simulation as it runs: a table that is always full, `num_rounds` rounds;
    returns how many diners finished.  (The seed draws from an unseeded generator, so its
    printed gain changes from run to run; here `seed` fixes it.)"""
    rng = random.Random(seed)

    def new_diner() -> list[float]:  # [speed, progress]
        return [rng.uniform(*SPEED_RANGE), 0.0]

    table = [new_diner() for _ in range(num_seats)]
    num_done = 0
    for _ in range(num_rounds):
        if continuous:
            for diner in list(table):  # newcomers start eating next round
                diner[1] += diner[0] * BITE
                if diner[1] >= 1.0:
                    num_done += 1
                    table.remove(diner)
                    table.append(new_diner())
        else:
            slowest = min(speed for speed, _ in table)
            for diner in table:
                diner[1] += slowest * BITE
            if all(progress >= 1.0 for _, progress in table):
                num_done += len(table)
                table = [new_diner() for _ in range(num_seats)]
    return num_done


@dataclass
class ToyComparison:
    """What the two toys predict for one queue of diners."""

    speeds: list[float]
    lengths: list[int]  # rounds (= tokens) each diner needs
    num_seats: int
    static_rounds: int  # both toys agree on these two
    continuous_rounds: int
    seed_static_latency: list[int]  # rounds until each diner leaves, seed's round table
    step_static_latency: list[int]  # ... chapter 01's static batching (own length)
    continuous_latency: list[int]

    @property
    def predicted_speedup(self) -> float:
        return self.static_rounds / self.continuous_rounds

    def quickest_diners(self, fraction: float = 0.25) -> list[int]:
        """Indices of the quickest `fraction` of diners (shortest requests)."""
        order = sorted(range(len(self.lengths)), key=lambda i: self.lengths[i])
        return order[: max(1, math.ceil(fraction * len(order)))]


def compare_toys(num_diners: int = 24, num_seats: int = 6, seed: int = 0) -> ToyComparison:
    """Both toys on one seeded queue of diners (served in order, no new arrivals)."""
    speeds = draw_speeds(num_diners, seed)
    lengths = [rounds_to_finish(s) for s in speeds]
    static = simulate(lengths, num_seats, "static")
    continuous = simulate(lengths, num_seats, "continuous")
    return ToyComparison(
        speeds=speeds,
        lengths=lengths,
        num_seats=num_seats,
        static_rounds=static.num_steps,
        continuous_rounds=continuous.num_steps,
        # The seed's round table: everyone eats at the slowest pace, so leaves with the table.
        seed_static_latency=list(static.release_steps),
        step_static_latency=list(static.finish_steps),
        continuous_latency=list(continuous.finish_steps),
    )


@dataclass
class EngineOnDiners:
    """The real engine serving the diners' lengths as output tokens, static and continuous."""

    wall_s: dict[str, float]  # policy -> seconds
    latency_s: dict[str, list[float]]  # policy -> end-to-end latency per request
    num_steps: dict[str, int]  # engine steps (static: from the lengths, like the toy)

    @property
    def measured_speedup(self) -> float:
        return self.wall_s["static"] / self.wall_s["continuous"]

    @property
    def seconds_per_step(self) -> dict[str, float]:
        """Wall time per step: a toy assumes this is the same for both policies."""
        return {p: self.wall_s[p] / self.num_steps[p] for p in self.wall_s}


def engine_on_diners(
    comparison: ToyComparison, model=None, device=None, num_repeats: int = 1, seed: int = 0
) -> EngineOnDiners:
    """Serve one request per diner, `max_tokens` = its rounds, with `strategy="static_batch"`
    and `"continuous"` on `num_seats` seats; keep each policy's fastest run."""
    from minilm_engine.course.noodle_corpus import sample_prompts
    from minilm_engine.course.baselines import BaselineLLM

    workload = Workload(
        sample_prompts(len(comparison.lengths), seed),
        [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in comparison.lengths],
    )
    wall, latency, steps = {}, {}, {}
    for policy, strategy in (("static", "static_batch"), ("continuous", "continuous")):
        llm = BaselineLLM(model, device=device, strategy=strategy, max_num_seqs=comparison.num_seats,
                  enable_prefix_caching=False)
        llm.generate(workload.prompts[:1], workload.sampling_params[:1], use_tqdm=False)  # warm-up
        best = min((timed_generate(llm, workload) for _ in range(num_repeats)),
                   key=lambda t: t.wall_s)
        wall[policy] = best.wall_s
        latency[policy] = [o.metrics.e2e_latency for o in best.outputs]
        # A static batch takes as many steps as the toy says (no trace to count them).
        steps[policy] = len(best.records) if best.records is not None else comparison.static_rounds
    return EngineOnDiners(wall, latency, steps)


def comparison_rows(toys: ToyComparison, engine: EngineOnDiners | None = None) -> list[dict]:
    """What each model predicts, side by side: gain, and how long the quickest quarter waits
    under static batching relative to continuous."""
    quick = toys.quickest_diners()

    def ratio(static: list[float], continuous: list[float]) -> float:
        return statistics.mean(static[i] for i in quick) / statistics.mean(
            continuous[i] for i in quick)

    rows = [
        {"model": "seed's toy (speeds, round table eats at the slowest pace)",
         "continuous gain": toys.predicted_speedup,
         "quickest quarter: static / continuous latency":
             ratio(toys.seed_static_latency, toys.continuous_latency)},
        {"model": "chapter 01's toy (lengths, one token per step)",
         "continuous gain": toys.predicted_speedup,
         "quickest quarter: static / continuous latency":
             ratio(toys.step_static_latency, toys.continuous_latency)},
    ]
    if engine is not None:
        rows.append({"model": "the engine (measured wall time)",
                     "continuous gain": engine.measured_speedup,
                     "quickest quarter: static / continuous latency":
                         ratio(engine.latency_s["static"], engine.latency_s["continuous"])})
    return rows
