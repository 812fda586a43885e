"""Tests for minilm_engine.distributed.kv_transfer: disaggregated prefill on tiny checkpoints.

The yardstick is one continuous engine (itself tested against `transformers` and against
running alone): a prefill engine that hands each prompt's KV to a decode engine must give the
same tokens, greedy and sampled with the same seeds, for prompts shorter than a block, exactly
a block or several, and longer; with different block sizes on the two sides; with the
consumer's prefix cache already holding part of a prompt; with the consumer full
(backpressure) or short of memory (preemption on the consumer).  Every test checks that the
two engines really split the work (the producer's steps are prefills only, the consumer's
decodes only, unless it had to recompute a preempted request) and that both pools are empty at
the end.
"""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from minilm_engine import LLM, SamplingParams
from minilm_engine.course.baselines import BaselineLLM
from minilm_engine.distributed.kv_transfer import DisaggRouter, pack_kv, unpack_kv
from minilm_engine.model.attention.kv_cache import PagedKVCache

MAX_MODEL_LEN = 64
BLOCK_SIZE = 4
# Shorter than a block, exactly one, several, a block and one more, many.
PROMPT_LENS = [1, 3, 4, 5, 8, 13, 20, 31]


def make_llm(path, **engine_args) -> LLM:
    engine_args.setdefault("block_size", BLOCK_SIZE)
    return LLM(path, max_model_len=MAX_MODEL_LEN, **engine_args)


def make_router(path, prefill: dict | None = None, decode: dict | None = None) -> DisaggRouter:
    return DisaggRouter(make_llm(path, **(prefill or {})), make_llm(path, **(decode or {})))


def token_prompts(lengths: list[int], vocab_size: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(1, vocab_size) for _ in range(n)]} for n in lengths]


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)


def kv_bytes_per_token(llm: LLM) -> int:
    c = llm.config  # K and V, every layer and KV head, fp32 on the CPU
    return 2 * c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4


def assert_split_and_empty(router: DisaggRouter, consumer_may_recompute: bool = False) -> None:
    producer, consumer = router.kv_producer.engine, router.kv_consumer.engine
    assert all(rec.num_decode_tokens == 0 for rec in producer.trace.records), "the producer decoded"
    if not consumer_may_recompute:
        assert all(rec.num_prefill_tokens == 0 for rec in consumer.trace.records), "the consumer prefilled"
    assert not router.pending and not router.requests
    for engine in (producer, consumer):
        engine.block_pool.check_invariants()
        assert engine.block_pool.num_used_blocks == 0, "a KV block leaked"
        assert not engine.has_unfinished_requests()


def token_ids(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_greedy_tokens_equal_one_engine_and_every_prompt_token_is_sent_once(checkpoints, name):
    path = checkpoints[name].path
    one, router = make_llm(path), make_router(path, decode={"enable_prefix_caching": False})
    prompts = token_prompts(PROMPT_LENS, one.config.vocab_size)
    params = [greedy(n) for n in (6, 1, 9, 2, 12, 5, 7, 3)]
    expected = one.generate(prompts, params, use_tqdm=False)
    got = router.generate(prompts, params)
    assert token_ids(got) == token_ids(expected)
    assert [o.outputs[0].finish_reason for o in got] == ["length"] * len(prompts)
    # max_tokens=1 ends on the producer; every other prompt crosses whole (no consumer cache).
    handed = [n for n, p in zip(PROMPT_LENS, params) if p.max_tokens > 1]
    stats = router.stats
    assert [t.num_prompt_tokens for t in stats.transfers] == sorted(handed, key=handed.index)
    assert stats.num_tokens == sum(handed) and stats.num_cached_tokens == 0
    assert stats.num_bytes == sum(handed) * kv_bytes_per_token(one)
    assert_split_and_empty(router)


def test_sampled_tokens_equal_one_engine_for_the_same_seeds(checkpoints):
    path = checkpoints["llama"].path
    one, router = make_llm(path), make_router(path)
    prompts = token_prompts(PROMPT_LENS, one.config.vocab_size, seed=1)
    seeded = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10, ignore_eos=True, seed=100 + i)
              for i in range(len(prompts))]
    expected = token_ids(one.generate(prompts, seeded, use_tqdm=False))
    assert token_ids(router.generate(prompts, seeded)) == expected
    # Without seeds, each request's seed comes from the engine seed and its id: the same too.
    unseeded = SamplingParams(temperature=1.0, max_tokens=10, ignore_eos=True)
    assert token_ids(router.generate(prompts, unseeded)) == token_ids(one.generate(prompts, unseeded, use_tqdm=False))
    # The samples really depend on the seed (else the comparison above proves little).
    reseeded = [SamplingParams(temperature=1.0, top_p=0.95, max_tokens=10, ignore_eos=True, seed=900 + i)
                for i in range(len(prompts))]
    assert token_ids(router.generate(prompts, reseeded)) != expected
    assert_split_and_empty(router)


@pytest.mark.parametrize("producer_block, consumer_block", [(4, 8), (8, 4), (16, 1)])
def test_the_two_pools_may_have_different_block_sizes(checkpoints, producer_block, consumer_block):
    path = checkpoints["qwen2"].path
    one = make_llm(path)
    router = make_router(path, {"block_size": producer_block}, {"block_size": consumer_block})
    prompts = token_prompts(PROMPT_LENS, one.config.vocab_size, seed=2)
    params = greedy(8)
    assert token_ids(router.generate(prompts, params)) == token_ids(one.generate(prompts, params, use_tqdm=False))
    assert_split_and_empty(router)


def test_a_consumer_prefix_hit_is_shared_not_sent(checkpoints):
    path = checkpoints["llama"].path
    one, router = make_llm(path), make_router(path)
    (base,) = token_prompts([12], one.config.vocab_size, seed=3)
    ids = base["prompt_token_ids"]
    prompts = [
        base,  # 12 tokens, three full blocks: nothing cached yet
        {"prompt_token_ids": ids[:8] + [7, 8, 9]},  # shares two blocks with it
        base,  # the same prompt again: every block is in the consumer's cache
    ]
    params = greedy(6)
    expected = token_ids(one.generate(prompts, params, use_tqdm=False))
    got = []
    for prompt in prompts:  # one after another, so each finds the one before in the cache
        got += token_ids(router.generate([prompt], params))
    assert got == expected
    sent = [(t.num_prompt_tokens, t.num_cached_tokens) for t in router.stats.transfers]
    assert sent == [(12, 0), (11, 8), (12, 12)]
    assert router.stats.transfers[2].num_bytes == 0
    assert router.stats.num_bytes == (12 + 3) * kv_bytes_per_token(one)
    assert_split_and_empty(router)


def test_a_full_consumer_holds_prefills_back_and_a_short_one_preempts(checkpoints):
    path = checkpoints["mistral"].path
    one = make_llm(path)
    prompts = token_prompts([5, 17, 9, 30, 2, 12], one.config.vocab_size, seed=4)
    params = greedy(14)
    expected = token_ids(one.generate(prompts, params, use_tqdm=False))

    # One batch slot on the consumer, two prompts a producer step: hand-overs wait, and the
    # producer runs no prefill while one does.
    router = make_router(path, {"max_num_seqs": 2}, {"max_num_seqs": 1})
    requests = [router.add_request(str(i), p, params) for i, p in enumerate(prompts)]
    producer = router.kv_producer.engine
    num_paused = 0
    while router.has_unfinished_requests():
        num_steps, was_pending = producer.num_steps, bool(router.pending)
        router.step()
        if was_pending:
            assert producer.num_steps == num_steps
            num_paused += 1
    assert num_paused > 10
    assert [r.output_token_ids for r in requests] == expected
    assert_split_and_empty(router)

    # A consumer pool too small for all at once: it preempts and recomputes on its own side.
    router = make_router(path, decode={"num_kv_blocks": 14})
    assert token_ids(router.generate(prompts, params)) == expected
    assert router.kv_consumer.engine.scheduler.num_preemptions > 0
    assert_split_and_empty(router, consumer_may_recompute=True)


def test_abort_frees_blocks_wherever_the_request_is(checkpoints):
    path = checkpoints["llama"].path
    router = make_router(path, decode={"max_num_seqs": 1})
    prompts = token_prompts([9, 6, 13, 4], router.kv_producer.config.vocab_size, seed=5)
    requests = [router.add_request(f"r{i}", p, greedy(20)) for i, p in enumerate(prompts)]
    router.step()  # all four prefilled at once; r0 goes to the consumer, r1..r3 wait
    assert [r.request_id for r in router.pending] == ["r1", "r2", "r3"]
    router.abort_request("r2")  # pending: its producer blocks are freed
    router.abort_request("r0")  # decoding on the consumer
    router.step()
    router.abort_request("r1")  # moved to the consumer when r0 left
    router.abort_request("unknown")  # ignored
    while router.has_unfinished_requests():
        router.step()
    assert [r.finish_reason for r in requests] == ["abort", "abort", "abort", "length"]
    assert_split_and_empty(router)


def test_bad_pairs_and_bad_hand_overs_are_refused(checkpoints):
    llama, qwen3 = checkpoints["llama"].path, checkpoints["qwen3"].path
    with pytest.raises(ValueError, match="different models"):
        DisaggRouter(make_llm(llama), make_llm(qwen3))
    with pytest.raises(ValueError, match="strategy='continuous'"):
        DisaggRouter(make_llm(llama), BaselineLLM(llama, strategy="kv_cache", max_model_len=MAX_MODEL_LEN))
    with pytest.raises(ValueError, match="max_model_len"):
        DisaggRouter(make_llm(llama), LLM(llama, max_model_len=32, block_size=BLOCK_SIZE))
    with pytest.raises(ValueError, match="speculative"):
        DisaggRouter(make_llm(llama), make_llm(llama, speculative_config={"method": "ngram", "num_speculative_tokens": 2}))

    router = make_router(llama)
    router.add_request("a", {"prompt_token_ids": [5, 6, 7]}, greedy(4))
    with pytest.raises(ValueError, match="already in the router"):
        router.add_request("a", {"prompt_token_ids": [5]}, greedy(4))
    consumer = router.kv_consumer.engine
    request = router.kv_producer.engine.requests["a"]
    with pytest.raises(ValueError, match="not running"):
        router.kv_producer.engine.detach_request("a")  # still waiting: nothing computed
    with pytest.raises(ValueError, match="a hand-over carries"):
        router.connector.transfer(request)
    with pytest.raises(ValueError, match="every token but its last"):
        consumer.add_computed_request(request)
    router.step_prefill()  # prefilled and detached: now it may cross
    with pytest.raises(KeyError, match="holds no blocks"):
        consumer.add_computed_request(request)  # no block table on the consumer yet
    assert consumer.block_pool.num_used_blocks == 0
    while router.has_unfinished_requests():
        router.step()
    assert_split_and_empty(router)


def test_pack_and_unpack_move_exactly_the_named_slots(checkpoints):
    config = BaselineLLM(checkpoints["qwen3"].path, strategy="kv_cache").config
    src = PagedKVCache(config, num_blocks=6, block_size=4, dtype=torch.float32, device="cpu")
    dst = PagedKVCache(config, num_blocks=3, block_size=8, dtype=torch.float32, device="cpu")
    for tensor in src.k + src.v:
        tensor.normal_()
    src_slots, dst_slots = [13, 14, 15, 0, 1, 22], [3, 4, 5, 17, 18, 9]
    wire = pack_kv(src, src_slots)
    assert wire.shape == (config.num_hidden_layers, 2, 6, config.num_key_value_heads, config.head_dim)
    unpack_kv(dst, dst_slots, wire)
    for layer in range(config.num_hidden_layers):
        for a, b in ((src.k[layer], dst.k[layer]), (src.v[layer], dst.v[layer])):
            a, b = a.flatten(0, 1), b.flatten(0, 1)
            torch.testing.assert_close(b[dst_slots], a[src_slots], rtol=0, atol=0)
            untouched = [s for s in range(b.shape[0]) if s not in dst_slots]
            assert (b[untouched] == 0).all()


@pytest.fixture(scope="module")
def pair(checkpoints):
    path = checkpoints["llama3_rope"].path
    return make_llm(path), make_router(path, {"block_size": 4}, {"block_size": 8, "max_num_seqs": 3})


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=6),
    max_tokens=st.integers(1, 12),
    seed=st.integers(0, 3),  # few seeds: prompts repeat, so the consumer's cache gets hits
)
def test_any_workload_gives_one_engines_tokens(pair, lengths, max_tokens, seed):
    one, router = pair
    prompts = token_prompts(lengths, one.config.vocab_size, seed)
    params = SamplingParams(temperature=0.8, max_tokens=max_tokens, ignore_eos=True, seed=seed)
    assert token_ids(router.generate(prompts, params)) == token_ids(one.generate(prompts, params, use_tqdm=False))
    for engine in (router.kv_producer.engine, router.kv_consumer.engine):
        engine.block_pool.check_invariants()
        assert engine.block_pool.num_used_blocks == 0


def test_the_engine_hooks_check_what_they_are_given(checkpoints):
    router = make_router(checkpoints["llama"].path, decode={"max_num_seqs": 1})
    prompts = token_prompts([9, 10], router.kv_producer.config.vocab_size, seed=6)
    for i, p in enumerate(prompts):
        router.add_request(f"r{i}", p, greedy(5))
    router.step()  # r0 on the consumer, whose one batch slot it takes; r1 pending
    (waiting,) = router.pending
    consumer, manager = router.kv_consumer.engine, router.kv_consumer.engine.block_manager
    assert not consumer.can_add_computed_request()
    assert router.connector.transfer(waiting) is None  # no room: nothing changed
    assert "r1" not in manager.block_tables
    assert manager.allocate_slots("r1", 0, 10)
    with pytest.raises(ValueError, match="no batch slot"):
        consumer.add_computed_request(waiting)
    with pytest.raises(ValueError, match="already in the engine"):
        consumer.add_computed_request(consumer.requests["r0"])
    manager.free("r1")
    with pytest.raises(ValueError, match="is not running"):
        consumer.scheduler.detach(waiting)
    while router.has_unfinished_requests():
        router.step()
    # With a batch slot free, a table too small for the computed tokens is refused.
    router.add_request("r2", prompts[0], greedy(5))
    router.step_prefill()
    (waiting,) = router.pending
    assert manager.allocate_slots("r2", 0, BLOCK_SIZE)  # one block for nine computed tokens
    with pytest.raises(ValueError, match="cannot hold"):
        consumer.add_computed_request(waiting)
    manager.free("r2")
    while router.has_unfinished_requests():
        router.step()
    assert_split_and_empty(router)
