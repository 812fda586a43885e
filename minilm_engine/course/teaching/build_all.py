"""The course's final check: one engine running on every piece the learner has written.

Contract: `run_whole_engine(setup, pieces)` computes the package's reference runs first, then
swaps all of `pieces` in at once and runs (1) the continuous engine with INT8 weights,
a small pool (preemption), a small token budget (chunked prefill) and the prefix cache, greedy,
against the reference engine token for token, again with chunked prefill off, and again with
INT4 weights; where the learner wrote the scheduler's step and any of the decisions inside it
(admits, preemption_victim, num_tokens_this_step), once more with the package's step, so that
the engine calls those decisions too; (2) the same engine speculating with sampled
requests (the accept rule inside, the pool empty after); (3) the static batch on the contiguous
cache; (4) the accept rule's distribution test.  It returns what was checked, and the pieces
that handed their work back to the package's own function.
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from minilm_engine import pluggable
from minilm_engine.core.sampling_params import SamplingParams
from minilm_engine.course.teaching.build import pieces, swap_in
from minilm_engine.course.teaching.build_runs import (
    BuildSetup,
    reference_run,
    require_same_tokens,
    run_engine,
)
from minilm_engine.course.teaching.build_stats import check_accept_rule_distribution
from minilm_engine.course.teaching.build_pieces import admit_args, get_adapter

WHOLE_ARGS = {
    "block_size": 4,
    "num_kv_blocks": 16,  # tight: preemption happens
    "max_num_seqs": 5,
    "max_num_batched_tokens": 8,  # small: prompts are chunked alongside decodes
    "enable_chunked_prefill": True,
    "enable_prefix_caching": True,
}


def run_whole_engine(setup: BuildSetup, fns: dict[str, Any]) -> tuple[list[str], list[str]]:
    known = pieces()
    args = dict(WHOLE_ARGS, quantization="int8")
    int4_args = {"quantization": "int4", "quantization_config": {"group_size": 32}, "block_size": 4, "num_kv_blocks": 64}
    spec_args = {**args, "num_kv_blocks": 64, "speculative_config": {"model": setup.draft_model, "num_speculative_tokens": 3}}
    want = reference_run(setup, args, waves=2)
    want_int4 = reference_run(setup, int4_args)
    no_chunk_args = admit_args(setup)[0]  # chunked prefill off: a prompt that does not fit waits
    want_no_chunk = reference_run(setup, no_chunk_args)
    want_static = reference_run(setup, {"max_num_seqs": len(setup.prompts)}, strategy="static_batch")
    details: list[str] = []
    with ExitStack() as stack:
        for name, fn in fns.items():
            stack.enter_context(swap_in(name, fn))
        got = run_engine(setup, args, waves=2, max_steps=4 * want.num_steps + 20)
        details.append("continuous engine (" + ", ".join(f"{k}={v}" for k, v in args.items()) + "): "
                       + require_same_tokens(got, want, setup) + f", {sum(map(len, got.preempted))} preemptions")
        got_no_chunk = run_engine(setup, no_chunk_args, max_steps=4 * want_no_chunk.num_steps + 20)
        details.append("chunked prefill off, 3 seats: " + require_same_tokens(got_no_chunk, want_no_chunk, setup))
        got_int4 = run_engine(setup, int4_args)
        details.append("INT4 weights: " + require_same_tokens(got_int4, want_int4, setup))
        sampled = SamplingParams(max_tokens=setup.max_tokens, temperature=1.0, ignore_eos=True)
        run_engine(setup, spec_args, params=sampled)
        details.append("speculative decoding, sampled: ran, the pool empty after")
        got_static = run_engine(setup, {"max_num_seqs": len(setup.prompts)}, strategy="static_batch")
        details.append("static batch, contiguous cache: " + require_same_tokens(got_static, want_static, setup))
        delegated = [n for n in fns if pluggable.num_delegations(known[n].registry_name)]
    inner = [n for n in ("admits", "preemption_victim", "num_tokens_this_step") if n in fns]
    if "schedule_step" in fns and inner:
        # The learner's step may inline its decisions: run the package's step around them too.
        with ExitStack() as stack:
            for name in inner:
                stack.enter_context(swap_in(name, fns[name]))
            got_inner = run_engine(setup, args, waves=2, max_steps=4 * want.num_steps + 20)
            delegated += [n for n in inner if pluggable.num_delegations(known[n].registry_name)]
        details.append(f"the package's scheduler step calling your {', '.join(inner)}: "
                       + require_same_tokens(got_inner, want, setup))
    if "decode_kernel" in fns:
        from minilm_engine.course.teaching.build_kernels import _check_decode_kernel

        details += _check_decode_kernel(fns["decode_kernel"], setup)
    if "accept_drafts" in fns:
        rule = get_adapter("spec_decode.accept_drafts")(fns["accept_drafts"])
        details.append(check_accept_rule_distribution(rule, setup.num_samples))
    return details, delegated
