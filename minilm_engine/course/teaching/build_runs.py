"""The engine runs behind the build checkers, and the comparisons that name what broke.

Contract: `run_engine(setup, engine_args, ...)` builds a fresh `LLM` (a piece that broke the last
one leaves nothing behind), drives it step by step, checks the block pool after every step
(`check_pool`), stops a run that does not finish (naming the starved request), and returns a
`Run`: every request's tokens and, per step, who ran with how many tokens and who was
preempted.  The reference run is the same call with no piece swapped in, kept once per setup.
`first_token_difference` and `first_schedule_difference` turn two runs into one sentence.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from transformers import AutoTokenizer

from minilm_engine.entrypoints.llm import LLM
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.model.loader import resolve_model_path
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.teaching.build import BuildFailure

# Prompts that share a long prefix (prefix-cache hits) and differ in length (chunks, padding).
PROMPTS = (
    "The Golden Bowl is open every day from eleven until late, and the miso ramen",
    "The Golden Bowl is open every day from eleven until late, and the spicy tonkotsu",
    "Order for table 7:",
    "The Golden Bowl is open every day from eleven until late, and the",
    "Hello",
)


@dataclass(frozen=True)
class BuildSetup:
    """What the checkers run: the models, the prompts, how long each request generates."""

    model: str = "noodle-chef"
    draft_model: str = "noodle-apprentice"  # speculative decoding's draft (same tokenizer)
    prompts: tuple[str, ...] = PROMPTS
    max_tokens: int = 8
    num_samples: int = 4000  # draws of the accept rule in its distribution test

    @classmethod
    def default(cls) -> BuildSetup:
        """The shipped models; under MINILM_SMOKE=1 (CI's notebook runs) fewer tokens and draws."""
        if os.environ.get("MINILM_SMOKE", "0") == "1":
            return cls(prompts=PROMPTS[:4], max_tokens=4, num_samples=2000)
        return cls()


@dataclass
class Run:
    token_ids: list[list[int]]  # per request, in prompt order
    schedule: list[list[tuple[str, int]]]  # per step: (request id, tokens computed)
    preempted: list[list[str]]  # per step
    num_steps: int
    llm: LLM = field(repr=False)


@functools.cache
def prompt_lengths(setup: BuildSetup) -> list[int]:
    """Tokens of each prompt, under the setup model's tokenizer (pool sizes follow from them)."""
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(setup.model))
    return [len(tokenizer(p)["input_ids"]) for p in setup.prompts]


StepObserver = Callable[[LLM, int], None]  # (llm, step index) -> raises BuildFailure


def greedy(setup: BuildSetup) -> SamplingParams:
    return SamplingParams(max_tokens=setup.max_tokens, temperature=0.0, ignore_eos=True)


def run_engine(
    setup: BuildSetup,
    engine_args: dict[str, Any],
    params: SamplingParams | None = None,
    waves: int = 1,
    observe: StepObserver | None = None,
    max_steps: int = 400,
    strategy: str = "continuous",
) -> Run:
    """`waves` times the setup's prompts, one wave after the other on the same engine (so the
    later waves hit the prefix cache left by the earlier ones)."""
    params = params if params is not None else greedy(setup)
    llm = BaselineLLM(setup.model, strategy=strategy, **engine_args)
    run = Run([], [], [], 0, llm)
    for _ in range(waves):
        requests = llm.make_requests(list(setup.prompts), params)
        steps = llm.run_steps(requests)
        try:
            while True:
                try:
                    next(steps)
                except StopIteration:
                    break
                except RuntimeError as e:
                    if "made no progress" not in str(e):
                        raise
                    raise BuildFailure(_starved(requests, run.num_steps) + f" ({e})") from None
                run.num_steps += 1
                if strategy == "continuous":
                    record = llm.engine.trace.records[-1]
                    run.schedule.append(
                        [(c.request_id, c.num_prefill_tokens + c.num_decode_tokens) for c in record.chunks]
                    )
                    run.preempted.append(list(record.preempted))
                    check_pool(llm)
                if observe is not None:
                    observe(llm, run.num_steps - 1)
                if run.num_steps > max_steps:
                    raise BuildFailure(_starved(requests, max_steps))
        finally:
            steps.close()  # aborts what is left, so its blocks go back
        run.token_ids += [list(r.output_token_ids) for r in requests]
    if strategy == "continuous":
        check_pool_empty(llm)
    return run


_REFERENCE: dict[tuple, Run] = {}


def reference_run(setup: BuildSetup, engine_args: dict[str, Any], waves: int = 1, strategy: str = "continuous") -> Run:
    """The package's own engine on the same workload (computed once per setup and arguments)."""
    key = (setup, tuple(sorted((k, repr(v)) for k, v in engine_args.items())), waves, strategy)
    if key not in _REFERENCE:
        _REFERENCE[key] = run_engine(setup, engine_args, waves=waves, strategy=strategy)
    return _REFERENCE[key]


def _starved(requests, max_steps: int) -> str:
    waiting = [r for r in requests if len(r.output_token_ids) < r.max_new_tokens] or list(requests)
    worst = min(waiting, key=lambda r: len(r.output_token_ids))
    return (
        f"the engine stopped making progress after {max_steps} steps: request {worst.request_id!r} starved "
        f"({len(worst.output_token_ids)} of its {worst.max_new_tokens} tokens; "
        f"{worst.num_computed_tokens} of its {worst.num_tokens} tokens in the cache)"
    )


# -- the block pool ------------------------------------------------------------------------------


def check_pool(llm: LLM) -> None:
    """After a step: the pool's own invariants, and each block's ref count equal to the number
    of block tables holding it (the block manager's invariant)."""
    engine = llm.engine
    pool, manager = engine.block_pool, engine.block_manager
    try:
        pool.check_invariants()
    except AssertionError as e:
        raise BuildFailure(f"after step {engine.num_steps - 1} the block pool is inconsistent: {e}") from None
    holders: dict[int, list[str]] = {}
    for rid, table in manager.block_tables.items():
        for block in table:
            holders.setdefault(block.block_id, []).append(rid)
    for block in pool.blocks:
        owners = holders.get(block.block_id, [])
        if block.ref_cnt != len(owners):
            raise BuildFailure(
                f"after step {engine.num_steps - 1}, block {block.block_id} is in the block tables of "
                f"{len(owners)} request(s) {owners} but its ref_cnt is {block.ref_cnt}: "
                f"every table that holds a block must count in its ref_cnt"
            )


def check_pool_empty(llm: LLM) -> None:
    pool = llm.engine.block_pool
    leaked = [(b.block_id, b.ref_cnt) for b in pool.blocks if b.ref_cnt > 0]
    if leaked:
        names = ", ".join(f"block {i} (ref_cnt {n})" for i, n in leaked[:5])
        raise BuildFailure(f"every request finished, but {len(leaked)} block(s) are still held: {names}")


# -- comparisons ---------------------------------------------------------------------------------


def first_token_difference(got: Run, want: Run, setup: BuildSetup) -> str | None:
    tokenizer = want.llm.tokenizer
    for i, (g, w) in enumerate(zip(got.token_ids, want.token_ids)):
        for step, (a, b) in enumerate(zip(g, w)):
            if a != b:
                return (
                    f"request {i} ({setup.prompts[i % len(setup.prompts)]!r:.40}...): its token {step} is "
                    f"{a} {tokenizer.decode([a])!r}, the reference engine gives {b} {tokenizer.decode([b])!r}"
                )
        if len(g) != len(w):
            return f"request {i} got {len(g)} tokens, the reference engine gives {len(w)}"
    return None


def first_schedule_difference(got: Run, want: Run) -> str | None:
    for step, (g, w) in enumerate(zip(got.schedule, want.schedule)):
        if g != w:
            return f"step {step} ran {_chunks(g)}; the reference scheduler runs {_chunks(w)}"
    if len(got.schedule) != len(want.schedule):
        return f"the run took {len(got.schedule)} steps, the reference {len(want.schedule)}"
    return None


def _chunks(chunks: list[tuple[str, int]]) -> str:
    return "{" + ", ".join(f"request {rid!r}: {n} tokens" for rid, n in chunks) + "}"


def require_same_tokens(got: Run, want: Run, setup: BuildSetup) -> str:
    diff = first_token_difference(got, want, setup)
    if diff is not None:
        raise BuildFailure(f"greedy tokens differ from the reference engine: {diff}")
    n = sum(len(t) for t in want.token_ids)
    return f"{len(want.token_ids)} requests, {n} greedy tokens identical to the reference engine"
