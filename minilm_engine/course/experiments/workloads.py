"""Seeded request mixes for serving experiments: real noodle-shop prompts, skewed output lengths.

Contract: `mixed_workload(num_requests, seed)` returns a `Workload`: one prompt per request (the
opening lines of `sample_prompts`) and one `SamplingParams` per request, greedy and with
`ignore_eos=True`, so each request produces exactly its `max_tokens` and the output lengths are
known before anything runs.  The same arguments give the same workload on every machine.

Output lengths follow a `LengthMix`: most requests short, a few long, the shape of real chat
traffic ("yes" or a one-line answer, now and then an essay) that makes static batching wait:

    max_tokens   4 ██████████████████████████ ... 24   (short: 1 - long_fraction of requests)
                96 ███ ... 160                          (long: long_fraction of requests)
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from minilm_engine.course.noodle_corpus import sample_prompts
from minilm_engine.core.sampling_params import SamplingParams


@dataclass(frozen=True)
class LengthMix:
    """How many tokens each request asks for: uniform in `short` or, with probability
    `long_fraction`, uniform in `long` (both ranges inclusive)."""

    short: tuple[int, int] = (4, 24)
    long: tuple[int, int] = (96, 160)
    long_fraction: float = 0.15

    def __post_init__(self) -> None:
        for name in ("short", "long"):
            low, high = getattr(self, name)
            if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high):
                raise ValueError(
                    f"{name} must be (low, high) ints with 1 <= low <= high, got {(low, high)}"
                )
        if not 0 <= self.long_fraction <= 1:
            raise ValueError(f"long_fraction must be in [0, 1], got {self.long_fraction}")

    def draw(self, rng: random.Random) -> int:
        low, high = self.long if rng.random() < self.long_fraction else self.short
        return rng.randint(low, high)


@dataclass
class Workload:
    """Prompts and one SamplingParams per request: `llm.generate(w.prompts, w.sampling_params)`."""

    prompts: list[str]
    sampling_params: list[SamplingParams]

    @property
    def output_lens(self) -> list[int]:
        """Tokens each request will produce (exact: greedy with ignore_eos)."""
        return [p.max_tokens for p in self.sampling_params]

    @property
    def num_requests(self) -> int:
        return len(self.prompts)

    @property
    def num_output_tokens(self) -> int:
        return sum(self.output_lens)

    def __getitem__(self, index: slice) -> "Workload":
        return Workload(self.prompts[index], self.sampling_params[index])


def draw_output_lens(num_requests: int, seed: int = 0, mix: LengthMix = LengthMix()) -> list[int]:
    """`num_requests` output lengths drawn from `mix` with `random.Random(seed)`."""
    if num_requests < 0:
        raise ValueError(f"num_requests must be >= 0, got {num_requests}")
    rng = random.Random(seed)
    return [mix.draw(rng) for _ in range(num_requests)]


def mixed_workload(num_requests: int, seed: int = 0, mix: LengthMix = LengthMix()) -> Workload:
    """Real prompts from the noodle corpus, with output lengths drawn from `mix`."""
    prompts = sample_prompts(num_requests, seed)
    lens = draw_output_lens(num_requests, seed, mix)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in lens]
    return Workload(prompts, params)
