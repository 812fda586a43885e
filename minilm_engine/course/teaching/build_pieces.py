"""The build pieces: each one's learner signature, hint, adapter and checker.

Contract: a piece's `adapt(fn)` wraps the learner's function into the core's signature and
checks every answer it gives (type, shape, range) with a `PieceError` that says what was
expected; its `run_check(fn, setup)` computes the reference run first, then runs the engine
with the piece swapped in and raises `BuildFailure` naming the first thing that differs.
Registered with `build.register_piece` on import, in build-path order (`build.py`).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable
from typing import Any

import torch

from minilm_engine import pluggable
from minilm_engine.model.quantization import schemes
from minilm_engine.core.request import Request
from minilm_engine.course.teaching.build import BuildFailure, Piece, PieceError, register_piece
from minilm_engine.course.teaching.build_runs import (
    BuildSetup,
    prompt_lengths,
    reference_run,
    require_same_tokens,
    run_engine,
)
from minilm_engine.course.teaching.build_stats import check_accept_rule_distribution
from minilm_engine.course.teaching.build_units import (
    check_admits_alone,
    check_append_and_attend_alone,
    check_int4_alone,
    check_int8_alone,
    check_num_tokens_alone,
    check_share_block_alone,
    check_slot_mapping_alone,
)

Fn = Callable[..., Any]


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _calls(name: str) -> str:
    n = pluggable.num_calls(name)
    if n == 0:
        raise BuildFailure(f"the engine never called your function as {name}: nothing was checked")
    return f"your function ran {n} times inside the engine"


def _with(name: str, fn: Fn, body: Callable[[], Any]) -> Any:
    with pluggable.override(name, get_adapter(name)(fn)):
        return body()


_ADAPTERS: dict[str, Callable[[Fn], Fn]] = {}


def get_adapter(registry_name: str) -> Callable[[Fn], Fn]:
    return _ADAPTERS[registry_name]


def _piece(**kwargs: Any) -> Piece:
    _ADAPTERS[kwargs["registry_name"]] = kwargs["adapt"]
    return register_piece(Piece(**kwargs))


# -- 02: append to and attend over a contiguous KV cache ------------------------------------------


def _adapt_append_and_attend(fn: Fn) -> Fn:
    def call(k_cache, v_cache, start, q, k, v, mask):
        out = fn(k_cache, v_cache, start, q, k, v, mask)
        if not isinstance(out, torch.Tensor):
            raise PieceError(f"return the attention output as a tensor, got {type(out).__name__}")
        if tuple(out.shape) != tuple(q.shape):
            raise PieceError(f"the output must have q's shape (B, T, H, D) = {tuple(q.shape)}, got {tuple(out.shape)}")
        return out.to(q.dtype)

    return call


def _check_append_and_attend(fn: Fn, setup: BuildSetup) -> list[str]:
    # Static batching: rows of different lengths, left-padded, all in one contiguous cache.
    alone = check_append_and_attend_alone(get_adapter("kv_cache.append_and_attend")(fn))
    args = {"max_num_seqs": len(setup.prompts)}
    want = reference_run(setup, args, strategy="static_batch")
    got = _with("kv_cache.append_and_attend", fn, lambda: run_engine(setup, args, strategy="static_batch"))
    return [alone, require_same_tokens(got, want, setup), _calls("kv_cache.append_and_attend")]


_piece(
    name="append_and_attend",
    registry_name="kv_cache.append_and_attend",
    chapter="02",
    signature=(
        "def append_and_attend(k_cache, v_cache, start, q, k, v, mask) -> out\n"
        "  k_cache, v_cache: (B, H_kv, max_len, D), slots [0, start) hold earlier steps\n"
        "  q: (B, T, H, D); k, v: (B, T, H_kv, D) this step's tokens; mask: (B, T, start + T) bool\n"
        "  write k, v into the cache, attend every query over the cache; return (B, T, H, D)\n"
        "  (H query heads share H_kv key/value heads: query head h reads K/V head h // (H // H_kv))"
    ),
    hint=(
        "the cache is the only memory the next step has: what this step does not store there, the "
        "next step cannot see. Attention is the usual scaled softmax, masked where mask is False."
    ),
    adapt=_adapt_append_and_attend,
    run_check=_check_append_and_attend,
    solutions="02_kv_cache_solutions.ipynb",
)


# -- 03: slot mapping and sharing a cached block ---------------------------------------------------

PAGED_ARGS = {"block_size": 4, "num_kv_blocks": 64, "max_num_seqs": 5, "max_num_batched_tokens": 256}


def checked_slot_mapping(fn: Fn) -> Fn:
    """The learner's one-sequence function, its answers checked (a list of as many ints as positions)."""

    def one(block_table, block_size, start, end):
        out = fn(list(block_table), block_size, start, end)
        if not isinstance(out, (list, tuple)):
            raise PieceError(f"return a list of slot numbers (ints), got {type(out).__name__}")
        if len(out) != end - start:
            raise PieceError(
                f"positions [{start}, {end}) are {end - start} tokens, but your function returned "
                f"{len(out)} slots (block_table={list(block_table)}, block_size={block_size})"
            )
        bad = next((x for x in out if not _is_int(x)), None)
        if bad is not None:
            raise PieceError(f"slots must be ints, got {bad!r} ({type(bad).__name__})")
        return list(out)

    return one


def _check_slot_mapping(fn: Fn, setup: BuildSetup) -> list[str]:
    alone = check_slot_mapping_alone(checked_slot_mapping(fn))
    want = reference_run(setup, PAGED_ARGS, waves=2)
    got = _with("kv_cache.slot_mapping", fn, lambda: run_engine(setup, PAGED_ARGS, waves=2))
    return [alone, require_same_tokens(got, want, setup), "the block pool empty after", _calls("kv_cache.slot_mapping")]


_piece(
    name="slot_mapping",
    registry_name="kv_cache.slot_mapping",  # the engine's step calls it once per request
    chapter="03",
    signature=(
        "def slot_mapping(block_table, block_size, start, end) -> list[int]\n"
        "  the cache slot of each token position in [start, end) of a sequence whose blocks are\n"
        "  block_table (block ids in token order); block b holds slots b*block_size .. b*block_size+block_size-1"
    ),
    hint=(
        "a position first picks its block out of the table (which one-in-a-row of blocks is it?), "
        "then its seat inside that block; the cache never sees positions, only slots."
    ),
    adapt=checked_slot_mapping,
    run_check=_check_slot_mapping,
    solutions="03_paged_memory_solutions.ipynb",
)


def _adapt_share_block(fn: Fn) -> Fn:
    def call(block, free_queue):
        out = fn(block, free_queue)
        if out is not None:
            raise PieceError(f"share_block changes the block and the queue in place and returns None, got {out!r}")

    return call


def _check_share_block(fn: Fn, setup: BuildSetup) -> list[str]:
    # Two waves: the second wave's prompts hit the prefix blocks the first left cached-free,
    # and share them with each other while running.
    alone = check_share_block_alone(get_adapter("kv_cache.share_block")(fn))
    want = reference_run(setup, PAGED_ARGS, waves=2)
    got = _with("kv_cache.share_block", fn, lambda: run_engine(setup, PAGED_ARGS, waves=2))
    return [
        alone,
        "ref counts equal the number of block tables holding each block, after every step",
        require_same_tokens(got, want, setup),
        "the block pool empty after",
        _calls("kv_cache.share_block"),
    ]


_piece(
    name="share_block",
    registry_name="kv_cache.share_block",
    chapter="03",
    signature=(
        "def share_block(block, free_queue) -> None\n"
        "  a prefix-cache hit: one more request now holds `block` (a KVCacheBlock with block_id,\n"
        "  ref_cnt, block_hash). free_queue: OrderedDict block_id -> block of the blocks nobody holds\n"
        "  (the next allocation takes from its head, evicting what the block cached)"
    ),
    hint=(
        "the pool must know, for every block, how many requests would be hurt if it were reused; and "
        "a block somebody holds must not be where the allocator looks for free ones."
    ),
    adapt=_adapt_share_block,
    run_check=_check_share_block,
    solutions="03_paged_memory_solutions.ipynb",
)


# -- 01: preemption: who gives up their blocks -----------------------------------------------------

def preempt_args(setup: BuildSetup) -> dict[str, Any]:
    """Blocks of one token, and a pool that holds the longest request but not them all: every
    decode needs a new block, so the first request served in a full step must make room."""
    lengths = prompt_lengths(setup)
    longest = max(lengths) + setup.max_tokens
    everything = sum(lengths) + len(lengths) * setup.max_tokens
    return {
        "block_size": 1,
        "num_kv_blocks": longest + 1 + (everything - longest) // 3,
        "max_num_seqs": len(lengths),
        "max_num_batched_tokens": 1024,
        "enable_prefix_caching": False,
    }


def _adapt_preemption_victim(fn: Fn) -> Fn:
    def call(candidates: list[Request]) -> Request:
        victim = fn(list(candidates))
        if _is_int(victim):
            raise PieceError(f"return the request itself (one of the candidates), not an index ({victim})")
        if not any(victim is c for c in candidates):
            ids = [c.request_id for c in candidates]
            raise PieceError(f"returned {victim!r:.60}, which is not one of the candidates (requests {ids})")
        return victim

    return call


def _fcfs_observer(llm, step: int) -> None:
    """The oldest requests always make progress: nobody is preempted while a newer one runs."""
    record = llm.engine.trace.records[-1]
    running = [r.request_id for r in llm.engine.scheduler.running]
    for victim in record.preempted:
        newer = [rid for rid in running if int(rid) > int(victim)]
        if newer:
            raise BuildFailure(
                f"step {step}: request {victim!r} was preempted while newer request(s) {newer} kept "
                f"their blocks; the older request waits again and can starve behind later arrivals"
            )


def _check_preemption_victim_alone(fn: Fn, llm) -> str:
    """Whether the engine run made the oldest request ask for room depends on the prompts; these
    calls make it ask, with 1 to 5 candidates (the one that needs room alone, and with up to four
    newer running requests after it), against the reference rule."""
    call = get_adapter("scheduler.preemption_victim")(fn)
    reference = pluggable.default("scheduler.preemption_victim")
    requests = llm.make_requests(["a", "b", "c", "d", "e"])
    for n in range(1, len(requests) + 1):
        candidates = requests[:n]
        victim, want = call(list(candidates)), reference(list(candidates))
        if victim is want:
            continue
        ids = [r.request_id for r in candidates]
        raise BuildFailure(
            f"alone, requests {ids} run, in arrival order, and the pool is full when the oldest, {ids[0]!r}, needs "
            f"a block: your rule preempts {victim.request_id!r}, so {victim.request_id!r} waits again while newer "
            f"requests keep their blocks, and under steady load an old request can be pushed back for ever "
            f"(the reference preempts {want.request_id!r})"
        )
    return "alone: 1 to 5 candidates (the requester alone, with up to four newer ones after it): the same victim"


def _check_preemption_victim(fn: Fn, setup: BuildSetup) -> list[str]:
    args = preempt_args(setup)
    want = reference_run(setup, args)
    alone = _check_preemption_victim_alone(fn, want.llm)
    got = _with(
        "scheduler.preemption_victim",
        fn,
        lambda: run_engine(setup, args, observe=_fcfs_observer, max_steps=4 * want.num_steps + 20),
    )
    num_preempted = sum(len(p) for p in got.preempted)
    return [
        alone,
        f"{num_preempted} preemptions, none of an older request while a newer one ran",
        require_same_tokens(got, want, setup),
        "the block pool empty after",
        _calls("scheduler.preemption_victim"),
    ]


_piece(
    name="preemption_victim",
    registry_name="scheduler.preemption_victim",
    chapter="01",
    signature=(
        "def preemption_victim(candidates) -> one of candidates\n"
        "  the pool is out of blocks while the scheduler serves candidates[0]; candidates are it and\n"
        "  the running requests after it, in arrival order (each with a request_id). Return the one\n"
        "  that gives its blocks back (it is recomputed later from its tokens)"
    ),
    hint=(
        "think about who has waited longest, and whose recompute costs least; a rule that lets a "
        "later arrival push an earlier one out can keep the earlier one out forever."
    ),
    adapt=_adapt_preemption_victim,
    run_check=_check_preemption_victim,
    solutions="01_batching_solutions.ipynb",
)


# -- 01: admission: who starts from the waiting queue this step --------------------------------------

def admit_args(setup: BuildSetup) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two engines where each part of the decision binds.  Roomy: 3 seats for 5 requests and a
    token budget that holds the longest request but not two long prompts (no chunking: a prompt
    that does not fit waits).  Tight: the same with a pool just above the longest request, so
    admissions wait for blocks and running requests are preempted."""
    lengths = prompt_lengths(setup)
    longest = max(lengths) + setup.max_tokens
    budget = longest + 7
    roomy = {"block_size": 2, "num_kv_blocks": (sum(lengths) + len(lengths) * setup.max_tokens) // 2 + 8,
             "max_num_seqs": 3, "max_model_len": budget, "max_num_batched_tokens": budget,
             "enable_chunked_prefill": False}
    return roomy, {**roomy, "num_kv_blocks": -(-longest // 2) + 1}


def _adapt_admits(fn: Fn) -> Fn:
    def call(state):
        answer = fn(state)
        is_bool = isinstance(answer, bool) or type(answer).__name__ == "bool_" or (
            isinstance(answer, torch.Tensor) and answer.dtype == torch.bool and answer.numel() == 1)
        if not is_bool:  # (None, a count, a request: the scheduler needs a yes or a no)
            raise PieceError(f"return True (the head starts) or False (it waits), got {answer!r:.60} "
                             f"({type(answer).__name__})")
        return bool(answer)

    return call


def _seats_observer(llm, step: int) -> None:
    running = llm.engine.scheduler.running
    limit = llm.engine.config.max_num_seqs
    if len(running) > limit:
        raise BuildFailure(
            f"after step {step}, {len(running)} requests {[r.request_id for r in running]} are running but "
            f"max_num_seqs is {limit}: your rule admitted a request with every seat taken"
        )


def _run_admission(fn: Fn, setup: BuildSetup, args: dict[str, Any], want) -> Any:
    try:
        return _with("scheduler.admits", fn,
                     lambda: run_engine(setup, args, observe=_seats_observer, max_steps=4 * want.num_steps + 20))
    except RuntimeError as e:  # the scheduler refuses to carry out an impossible admission
        text = str(e)
        if "cannot hold it" in text:
            raise BuildFailure(
                f"your rule admitted a request whose KV blocks the pool does not have ({text.split(': ', 1)[1]}): "
                f"num_new_blocks > num_free_blocks. A request that starts must have room for its tokens now"
            ) from None
        if "no tokens to compute" in text:
            raise BuildFailure(
                f"your rule admitted a request for which this step's token budget has no room "
                f"({text.split(': ', 1)[1]}): num_new_tokens is 0. The budget is shared by the whole step"
            ) from None
        raise
    except BuildFailure as e:
        if "stopped making progress" in str(e):
            raise BuildFailure(f"your rule keeps the queue's head waiting although it has a seat, budget and "
                               f"blocks: {e}") from None
        raise


def _probe_no_admission_after_preemption(fn: Fn) -> None:
    """The runs may not reach this state; a step that preempted and still has seat, budget and blocks."""
    from minilm_engine.core.schedule_step import AdmissionState

    state = AdmissionState(num_running=1, max_num_seqs=3, num_new_tokens=6, num_new_blocks=3,
                           num_free_blocks=4, num_preempted=1)
    if get_adapter("scheduler.admits")(fn)(state):
        raise BuildFailure(
            f"in a step that has just preempted a request (the pool ran short), your rule admits a newcomer "
            f"({state}): the blocks it takes are the ones the preempted request needs to come back, so next "
            f"step someone is preempted again (thrashing). Admit nobody in a step that preempted"
        )


def _check_admits(fn: Fn, setup: BuildSetup) -> list[str]:
    from minilm_engine.course.teaching.build_runs import first_schedule_difference

    roomy, tight = admit_args(setup)
    details = [check_admits_alone(get_adapter("scheduler.admits")(fn))]
    for label, args in ((f"{roomy['max_num_seqs']} seats, a {roomy['max_num_batched_tokens']}-token budget", roomy),
                        (f"a pool of {tight['num_kv_blocks']} blocks", tight)):
        want = reference_run(setup, args)
        got = _run_admission(fn, setup, args, want)
        diff = first_schedule_difference(got, want)
        if diff is not None:
            raise BuildFailure(
                f"with {label}, the schedule differs from the reference scheduler's: {diff} (a request that "
                f"has a seat, budget and blocks, in a step that preempted nobody, starts now)"
            )
        details.append(f"{label}: {got.num_steps} steps, the same admissions as the reference scheduler, "
                       f"{sum(map(len, got.preempted))} preemptions; " + require_same_tokens(got, want, setup))
    _probe_no_admission_after_preemption(fn)
    return [*details, "the block pool empty after every run", _calls("scheduler.admits")]


_piece(
    name="admits",
    registry_name="scheduler.admits",
    chapter="01",
    signature=(
        "def admits(state) -> bool\n"
        "  the scheduler has served the running requests and reaches the head of the waiting queue;\n"
        "  state has num_running, max_num_seqs, num_new_tokens (its tokens the step's budget has room\n"
        "  for, 0 if none), num_new_blocks (KV blocks they need), num_free_blocks, num_preempted (requests\n"
        "  preempted earlier in this step). True: it starts now; False: it and everyone behind it wait"
    ),
    hint=(
        "a newcomer needs somewhere to sit, a share of this step's work, and memory for what it computes; "
        "and think about what the pool running short in this very step says about letting anyone new in."
    ),
    adapt=_adapt_admits,
    run_check=_check_admits,
    solutions="01_batching_solutions.ipynb",
)


# -- 04: the token budget of one step --------------------------------------------------------------

CHUNK_ARGS = {
    "block_size": 4,
    "num_kv_blocks": 64,
    "max_num_seqs": 5,
    "max_num_batched_tokens": 8,
    "enable_chunked_prefill": True,
    "enable_prefix_caching": False,
}


def _adapt_num_tokens(fn: Fn) -> Fn:
    def call(num_remaining, num_scheduled, max_num_batched, enable_chunked):
        n = fn(num_remaining, num_scheduled, max_num_batched, enable_chunked)
        if not _is_int(n):
            raise PieceError(f"return a number of tokens (an int), got {n!r} ({type(n).__name__})")
        if not 0 <= n <= num_remaining:
            raise PieceError(
                f"returned {n} for a request with {num_remaining} tokens left to compute "
                f"(the answer is between 0 and {num_remaining})"
            )
        return int(n)

    return call


def _budget_observer(llm, step: int) -> None:
    record = llm.engine.trace.records[-1]
    budget = llm.engine.config.max_num_batched_tokens
    total = sum(c.num_prefill_tokens + c.num_decode_tokens for c in record.chunks)
    if total > budget:
        parts = ", ".join(
            f"{c.request_id!r}: {c.num_prefill_tokens} prefill + {c.num_decode_tokens} decode" for c in record.chunks
        )
        raise BuildFailure(
            f"step {step} computed {total} tokens ({parts}) but max_num_batched_tokens is {budget}: "
            f"the budget is one for the whole step"
        )


def _check_num_tokens(fn: Fn, setup: BuildSetup) -> list[str]:
    from minilm_engine.course.teaching.build_runs import first_schedule_difference

    details = [check_num_tokens_alone(get_adapter("scheduler.num_tokens_this_step")(fn))]
    # In the engine, both branches of the flag: chunking on with an 8-token budget (prompts are
    # cut), and off with a budget just above the longest request (a prompt that does not fit waits).
    no_chunks = admit_args(setup)[0]
    for args in (CHUNK_ARGS, no_chunks):
        label = (f"enable_chunked_prefill={args['enable_chunked_prefill']}, "
                 f"max_num_batched_tokens={args['max_num_batched_tokens']}")
        want = reference_run(setup, args)
        got = _with(
            "scheduler.num_tokens_this_step",
            fn,
            lambda args=args, want=want: run_engine(setup, args, observe=_budget_observer, max_steps=4 * want.num_steps + 20),
        )
        diff = first_schedule_difference(got, want)
        if diff is not None:
            raise BuildFailure(f"with {label}, the schedule differs from the reference scheduler's: {diff}")
        details.append(f"{label}: {got.num_steps} steps within the budget, the same chunks as the reference "
                       f"scheduler; " + require_same_tokens(got, want, setup))
    return [*details, _calls("scheduler.num_tokens_this_step")]


_piece(
    name="num_tokens_this_step",
    registry_name="scheduler.num_tokens_this_step",
    chapter="04",
    signature=(
        "def num_tokens_this_step(num_remaining_tokens, num_scheduled_tokens,\n"
        "                         max_num_batched_tokens, enable_chunked_prefill) -> int\n"
        "  a request has num_remaining_tokens not yet in the cache (a whole prompt, or 1 to decode);\n"
        "  the requests before it in this step already take num_scheduled_tokens. How many of its\n"
        "  tokens run now?"
    ),
    hint=(
        "one budget covers everything the step computes, whoever computes it; a prompt that does not "
        "fit either waits or, with chunking on, takes what is left and comes back next step."
    ),
    adapt=_adapt_num_tokens,
    run_check=_check_num_tokens,
    solutions="04_prefill_vs_decode_solutions.ipynb",
)


# -- 05: speculative sampling's accept / resample rule ---------------------------------------------


def _adapt_accept_drafts(fn: Fn) -> Fn:
    def call(draft_token_ids, p, q, generator):
        out = fn(list(draft_token_ids), p, q, generator)
        k, V = len(draft_token_ids), p.shape[-1]
        if not isinstance(out, (list, tuple)) or not all(_is_int(t) for t in out):
            raise PieceError(f"return the tokens to append as a list of ints, got {out!r:.80}")
        if not 1 <= len(out) <= k + 1:
            raise PieceError(f"with {k} drafts, 1 to {k + 1} tokens are appended; your function returned {len(out)}")
        if list(out[:-1]) != list(draft_token_ids[: len(out) - 1]):
            raise PieceError(
                f"the tokens before the last must be the accepted drafts {list(draft_token_ids)[: len(out) - 1]}, "
                f"got {list(out)}"
            )
        if not all(0 <= t < V for t in out):
            raise PieceError(f"token ids are in [0, {V}), got {list(out)}")
        return [int(t) for t in out]

    return call


def _check_accept_drafts(fn: Fn, setup: BuildSetup) -> list[str]:
    details = [check_accept_rule_distribution(get_adapter("spec_decode.accept_drafts")(fn), setup.num_samples)]
    args = {
        "block_size": 4,
        "num_kv_blocks": 64,
        "max_num_seqs": 5,
        "speculative_config": {"model": setup.draft_model, "num_speculative_tokens": 3},
    }
    from minilm_engine.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=setup.max_tokens, temperature=1.0, ignore_eos=True)
    got = _with("spec_decode.accept_drafts", fn, lambda: run_engine(setup, args, params=params))
    details += [
        f"the engine speculated with your rule: {sum(len(t) for t in got.token_ids)} sampled tokens, "
        f"the pool empty after",
        _calls("spec_decode.accept_drafts"),
    ]
    return details


_piece(
    name="accept_drafts",
    registry_name="spec_decode.accept_drafts",
    chapter="05",
    signature=(
        "def accept_drafts(draft_token_ids, p, q, generator) -> list[int]\n"
        "  the draft proposed k tokens; p: (k + 1, V) the target's probabilities at each verification\n"
        "  row, q: (k, V) the draft's at its k tokens. Return the tokens to append: the accepted\n"
        "  drafts, then one token of the target's (a replacement, or a bonus when all k pass).\n"
        "  Draw randomness only from `generator` (torch.rand(..., generator=generator))"
    ),
    hint=(
        "the output must be distributed exactly as the target's: keep a draft token as often as the "
        "target agrees with it, and when you reject, draw from the part of the target's distribution "
        "the draft under-covered."
    ),
    adapt=_adapt_accept_drafts,
    run_check=_check_accept_drafts,
    solutions="05_speculative_decoding_solutions.ipynb",
)


# -- 06: weight quantizers -----------------------------------------------------------------------


def _rows(t: torch.Tensor, name: str, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise PieceError(f"{name} must be a tensor, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        hint = " (one per output channel: per tensor is a single number)" if name == "scales" and t.numel() == 1 else ""
        raise PieceError(f"{name} must have shape {shape}, got {tuple(t.shape)}{hint}")
    if t.dtype not in dtypes:
        raise PieceError(f"{name} must be {' or '.join(map(str, dtypes))}, got {t.dtype}")
    return t


def _per_tensor(scales: torch.Tensor) -> bool:
    flat = scales.float().flatten()
    return flat.numel() > 1 and bool(torch.all(flat == flat[0]))


def _off_by_more_than_half_a_step(w, deq, bound, scales, want_scales, what: str, range_of: Callable) -> None:
    """Every weight must come back within half of the reference's step for its row or group (the
    error bound of the package's recipe); any quantizer that meets it passes.  Names why not."""
    excess = (w - deq).abs() - bound  # (N, K)
    if not torch.any(excess > 0):
        return
    n, k = (int(i) for i in torch.unravel_index(excess.argmax(), excess.shape))
    g = k // (w.shape[1] // scales.shape[1])
    came_back = f"w[{n}, {k}] = {w[n, k].item():.5g} comes back as {deq[n, k].item():.5g}"
    ref_step = f"{want_scales[n, g].item():.5g}"
    if _per_tensor(scales) and not _per_tensor(want_scales):
        raise BuildFailure(
            f"every {what} has the same scale {scales.flatten()[0].item():.4g}: that is per-tensor quantization; "
            f"one outlier then coarsens every other {what}: {came_back}, off by more than half of the step "
            f"{ref_step} its own {what} needs"
        )
    step, want = scales[n, g].item(), want_scales[n, g].item()
    label = f"row {n}" if scales.shape[1] == 1 else f"row {n}, group {g}"
    lo, hi, levels = range_of(n, g)
    if step > want * (1 + 1e-3):
        raise BuildFailure(
            f"{label}: your scale is {step:.5g}, expected at most {want:.5g} "
            f"(its range [{lo:.4g}, {hi:.4g}] over {levels}): a coarser step than the {what} needs, and "
            f"{came_back}, off by more than half of {ref_step}"
        )
    if step < want * (1 - 1e-3):
        raise BuildFailure(
            f"{label}: your scale is {step:.5g}, expected {want:.5g} (its range "
            f"[{lo:.4g}, {hi:.4g}] over {levels}): with a finer step the extreme weights need codes beyond "
            f"the last one and are clamped: {came_back}"
        )
    raise BuildFailure(f"{came_back}: off by more than half a step ({step:.5g}); round to the nearest code, and "
                       f"place the codes so the {what}'s whole range is covered")


def _adapt_int8(fn: Fn) -> Fn:
    def call(w, scale_dtype):
        out = fn(w.clone())
        if not isinstance(out, tuple) or len(out) != 2:
            raise PieceError("return (codes, scales)")
        N, K = w.shape
        codes = _rows(out[0], "codes", (N, K), (torch.int8,))
        scales = _rows(out[1], "scales", (N,), (torch.float32, torch.float16, torch.bfloat16))
        if int(codes.min()) < -127:
            raise PieceError(f"INT8 codes here are symmetric, -127..127 (-128 has no positive twin), got {int(codes.min())}")
        want = schemes.int8_scales(w, torch.float32)
        absmax = w.abs().amax(1)
        _off_by_more_than_half_a_step(
            w.float(), codes.float() * scales.float()[:, None], want[:, None] / 2 * (1 + 1e-3) + 1e-7,
            scales.float()[:, None], want[:, None], "row", lambda n, g: (-absmax[n].item(), absmax[n].item(), "the 127 positive codes: largest |w| / 127"))
        return codes, scales.to(scale_dtype)

    return call


def _adapt_int4(fn: Fn) -> Fn:
    def call(w, group_size, clip_ratio, scale_dtype):
        if not (isinstance(clip_ratio, float) and clip_ratio == 1.0):
            raise PieceError("the int4 build check runs without AWQ calibration (clip_ratio 1)")
        wp = schemes.pad_columns(w.float(), group_size)  # (N, K_padded): the pad repeats the last column
        out = fn(wp.clone(), group_size)
        if not isinstance(out, tuple) or len(out) != 3:
            raise PieceError("return (codes, scales, offsets)")
        N, Kp = wp.shape
        G = Kp // group_size
        codes = _rows(out[0], "codes", (N, Kp), (torch.uint8,))
        scales = _rows(out[1], "scales", (N, G), (torch.float32,))
        offsets = _rows(out[2], "offsets", (N, G), (torch.float32,))
        if int(codes.max()) > schemes.INT4_LEVELS:
            raise PieceError(f"4-bit codes are 0..15, got {int(codes.max())}")
        # Any (codes, scales, offsets) within half of the group's own step passes: the package's
        # min/max recipe, a zero point rounded to a code, a symmetric code where it is as fine.
        want_scales, _ = schemes.int4_params(w, group_size, 1.0, torch.float32)
        groups = wp.view(N, G, group_size)
        lo, hi = groups.amin(-1), groups.amax(-1)
        deq = (codes.float().view(N, G, group_size) * scales[..., None] + offsets[..., None]).view(N, Kp)
        bound = (want_scales[..., None] / 2 * (1 + 1e-3) + 1e-6).expand(N, G, group_size).reshape(N, Kp)
        _off_by_more_than_half_a_step(wp, deq, bound, scales, want_scales, "group",
                                      lambda n, g: (lo[n, g].item(), hi[n, g].item(), "the 15 steps of codes 0..15: (max - min) / 15"))
        return codes, scales.to(scale_dtype), offsets.to(scale_dtype)

    return call


def _quantized_check(registry_name: str, scheme: str) -> Callable[[Fn, BuildSetup], list[str]]:
    def run_check(fn: Fn, setup: BuildSetup) -> list[str]:
        alone = (check_int8_alone if scheme == "int8" else check_int4_alone)(get_adapter(registry_name)(fn))
        args: dict[str, Any] = {"quantization": scheme, "block_size": 4, "num_kv_blocks": 64}
        if scheme == "int4":
            args["quantization_config"] = {"group_size": 32}
        want = reference_run(setup, args)
        got = _with(registry_name, fn, lambda: run_engine(setup, args))
        try:
            tokens = require_same_tokens(got, want, setup)
        except BuildFailure as e:
            # Every projection was within the bound (the adapter checked each): a quantizer that
            # rounds some weights the other way may flip a greedy choice of a tiny model.
            tokens = (f"the engine ran on your codes; {str(e).replace('greedy tokens differ', 'its greedy tokens differ')}"
                      f" (your quantizer is within the bound but rounds differently from the package's recipe)")
        return [
            alone,
            "in the engine, every projection's codes within half a step of its weight",
            tokens,
            _calls(registry_name),
        ]

    return run_check


_piece(
    name="int8_weight",
    registry_name="quantization.int8_weight",
    chapter="06",
    signature=(
        "def int8_weight(w) -> (codes, scales)\n"
        "  w: (N, K) float32, an nn.Linear weight (out, in). codes: (N, K) int8 in [-127, 127],\n"
        "  scales: (N,) float32, so that w ~ codes * scales[:, None]"
    ),
    hint=(
        "symmetric: the code 0 is the weight 0; choose each output channel's step so that its "
        "largest weight just fits, and round."
    ),
    adapt=_adapt_int8,
    run_check=_quantized_check("quantization.int8_weight", "int8"),
    solutions="06_quantization_solutions.ipynb",
)

_piece(
    name="int4_weight",
    registry_name="quantization.int4_weight",
    chapter="06",
    signature=(
        "def int4_weight(w, group_size) -> (codes, scales, offsets)\n"
        "  w: (N, K) float32, K a multiple of group_size. codes: (N, K) uint8 in 0..15;\n"
        "  scales, offsets: (N, K // group_size) float32, so that w[n, k] ~ codes[n, k] * scales[n, g]\n"
        "  + offsets[n, g] with g = k // group_size"
    ),
    hint=(
        "16 levels are few: spend them on the range each small group of inputs really covers, "
        "from its lowest value to its highest."
    ),
    adapt=_adapt_int4,
    run_check=_quantized_check("quantization.int4_weight", "int4"),
    solutions="06_quantization_solutions.ipynb",
)
