"""Tests for minilm_engine.core.kv_cache_manager: unit tests, then an engine-like state machine
checked against a brute-force model of what every cache slot holds."""

import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minilm_engine.core.kv_cache_manager import BlockManager, cdiv
from minilm_engine.core.block_pool import BlockEventLog, BlockPool

BLOCK_SIZE = 4


def make_manager(num_blocks=8, enable_prefix_caching=True):
    return BlockManager(BlockPool(num_blocks, observer=BlockEventLog()), BLOCK_SIZE, enable_prefix_caching)


def run_prefill(manager, request_id, token_ids):
    """Admit a request the way the scheduler will: prefix hit, allocate, (forward), commit."""
    blocks, num_cached = manager.get_computed_blocks(token_ids)
    num_new = len(token_ids) - num_cached
    assert manager.allocate_slots(request_id, num_cached, num_new, blocks)
    manager.commit(request_id, token_ids, len(token_ids))
    return blocks, num_cached


# ---------------------------------------------------------------------- block tables, slots
def test_allocate_and_slot_mapping():
    manager = make_manager(num_blocks=4)
    assert manager.allocate_slots("a", 0, 10)
    assert manager.get_block_table("a") == [0, 1, 2]  # cdiv(10, 4) blocks
    assert manager.slot_mapping("a", 0, 10) == list(range(10))
    assert manager.allocate_slots("b", 0, 3)
    manager.free("a")
    assert manager.allocate_slots("c", 0, 6)  # reuses a's blocks, tail first: 2, 1
    assert manager.get_block_table("c") == [2, 1]
    assert manager.slot_mapping("c", 2, 7) == [10, 11, 4, 5, 6]
    with pytest.raises(ValueError, match="out of range"):
        manager.slot_mapping("c", 0, 9)


def test_decode_grows_the_table_one_block_at_a_time():
    manager = make_manager()
    tokens = [1, 2, 3]
    run_prefill(manager, "a", tokens)
    for step in range(6):
        tokens.append(100 + step)  # the sampled token, not yet computed
        assert manager.allocate_slots("a", len(tokens) - 1, 1)
        assert len(manager.get_block_table("a")) == cdiv(len(tokens), BLOCK_SIZE)
        manager.commit("a", tokens, len(tokens))
    assert len(manager.get_block_table("a")) == 3  # 9 tokens


def test_allocate_failure_changes_nothing():
    manager = make_manager(num_blocks=3)
    assert manager.allocate_slots("a", 0, 8)
    manager.block_pool.observer.drain()
    before = manager.block_pool.snapshot()
    assert not manager.can_allocate_slots("b", 0, 5)
    assert not manager.allocate_slots("b", 0, 5)
    assert not manager.allocate_slots("a", 8, 5)
    assert manager.block_pool.snapshot() == before
    assert "b" not in manager.block_tables and manager.get_block_table("a") == [0, 1]
    assert manager.block_pool.observer.drain() == []


def test_free_is_in_reverse_order_and_unknown_requests_raise():
    manager = make_manager(num_blocks=4)
    manager.allocate_slots("a", 0, 12)
    manager.block_pool.observer.drain()
    manager.free("a")
    freed = [e.block_id for e in manager.block_pool.observer.drain() if e.kind == "freed"]
    assert freed == [2, 1, 0]
    assert manager.block_pool.free_queue_ids() == [3, 2, 1, 0]
    with pytest.raises(KeyError, match="already freed"):
        manager.free("a")
    with pytest.raises(KeyError):
        manager.get_block_table("nobody")
    assert manager.num_free_blocks == 4 and manager.usage == 0.0


# ---------------------------------------------------------------------- prefix caching
def test_prefix_hit_shares_full_blocks():
    manager = make_manager()
    prompt = list(range(10))
    run_prefill(manager, "a", prompt)  # blocks 0, 1 full and cached; block 2 holds 2 tokens
    pool = manager.block_pool
    assert pool.num_cached_blocks == 2

    blocks, num_cached = manager.get_computed_blocks(prompt[:8] + [99, 98, 97])
    assert [b.block_id for b in blocks] == [0, 1] and num_cached == 8
    assert [b.ref_cnt for b in blocks] == [1, 1]  # a lookup takes no reference

    assert manager.allocate_slots("b", 8, 3, blocks)
    assert manager.get_block_table("b")[:2] == [0, 1]
    assert [b.ref_cnt for b in blocks] == [2, 2]
    assert manager.slot_mapping("b", 8, 11) == [12, 13, 14]  # only the new tokens get new slots


def test_prefix_hit_never_covers_the_whole_prompt():
    manager = make_manager()
    run_prefill(manager, "a", list(range(12)))
    assert manager.get_computed_blocks(list(range(8)))[1] == 4  # capped at (8 - 1) // 4 blocks
    assert manager.get_computed_blocks(list(range(9)))[1] == 8
    assert manager.get_computed_blocks([])[1] == 0


def test_hash_chain_distinguishes_equal_blocks_at_different_positions():
    manager = make_manager()
    run_prefill(manager, "a", [1, 1, 1, 1, 2, 2, 2, 2, 0])
    # Block [2, 2, 2, 2] is cached, but only after [1, 1, 1, 1]: no hit at position 0.
    assert manager.get_computed_blocks([2, 2, 2, 2, 0]) == ([], 0)
    assert manager.get_computed_blocks([1, 1, 1, 1, 3, 3, 3, 3, 0])[1] == 4


def test_cached_free_blocks_are_reused_and_count_as_available():
    manager = make_manager(num_blocks=3)
    prompt = list(range(9))
    run_prefill(manager, "a", prompt)
    manager.free("a")
    assert manager.num_free_blocks == 3  # two of them still cached
    blocks, num_cached = manager.get_computed_blocks(prompt)
    assert num_cached == 8
    # 1 new block needed; the hits leave exactly 1 free block for it.
    assert manager.can_allocate_slots("b", 8, 1, blocks)
    assert not manager.can_allocate_slots("b", 8, 5, blocks)
    assert not manager.allocate_slots("b", 8, 5, blocks)
    assert manager.allocate_slots("b", 8, 1, blocks)
    assert manager.num_free_blocks == 0


def test_eviction_takes_the_tail_blocks_of_a_freed_request_first():
    manager = make_manager(num_blocks=4)
    prompt = list(range(13))
    run_prefill(manager, "a", prompt)  # 4 blocks, 3 cached
    manager.free("a")
    assert manager.allocate_slots("b", 0, 4)  # evicts one block: a's block 3, then ... 2
    assert manager.get_block_table("b") == [3]
    assert manager.get_computed_blocks(prompt)[1] == 12  # block 3 held only 1 token
    assert manager.allocate_slots("c", 0, 4)
    assert manager.get_block_table("c") == [2]  # the last cached block goes first
    assert manager.get_computed_blocks(prompt)[1] == 8  # the head of the prefix survives


def test_duplicate_computation_keeps_the_first_block_and_the_chain():
    manager = make_manager(num_blocks=8)
    shared, tail_a, tail_b = [5, 5, 5, 5], [6, 6, 6, 6], [7, 7, 7, 7]
    # Both admitted before either commits: both compute `shared`.
    assert manager.allocate_slots("a", 0, 9)
    assert manager.allocate_slots("b", 0, 9)
    manager.commit("a", shared + tail_a + [0], 9)
    manager.commit("b", shared + tail_b + [0], 9)
    a_table, b_table = manager.get_block_table("a"), manager.get_block_table("b")
    assert manager.block_tables["b"][0].block_hash is None  # a's copy won
    # b's second block is still cached under the chain that starts with `shared`.
    blocks, _ = manager.get_computed_blocks(shared + tail_b + [0])
    assert [b.block_id for b in blocks] == [a_table[0], b_table[1]]


def test_commit_is_idempotent_and_checked():
    manager = make_manager()
    tokens = list(range(6))
    assert manager.allocate_slots("a", 0, 6)
    manager.commit("a", tokens, 4)
    manager.commit("a", tokens, 4)
    manager.commit("a", tokens, 2)
    assert manager.block_pool.num_cached_blocks == 1
    with pytest.raises(ValueError, match="token ids given"):
        manager.commit("a", tokens, 7)
    with pytest.raises(ValueError, match="slots for 8"):
        manager.commit("a", list(range(12)), 9)


def test_allocate_argument_checks():
    manager = make_manager()
    run_prefill(manager, "a", list(range(9)))
    blocks, num_cached = manager.get_computed_blocks(list(range(9)))
    with pytest.raises(ValueError, match="must be the 8 tokens"):
        manager.allocate_slots("b", 0, 9, blocks)
    with pytest.raises(ValueError, match="first allocate_slots"):
        manager.allocate_slots("a", 9, 1, blocks)
    with pytest.raises(ValueError, match="behind"):
        manager.allocate_slots("a", 3, 1)  # would overwrite a committed block
    with pytest.raises(ValueError, match="at most 12"):
        manager.allocate_slots("a", 13, 1)
    with pytest.raises(ValueError, match=">= 0"):
        manager.allocate_slots("a", 9, -1)
    with pytest.raises(ValueError, match="block_size"):
        BlockManager(BlockPool(2), 0)


def test_stale_computed_blocks_are_rejected():
    manager = make_manager(num_blocks=3)
    prompt = list(range(9))
    run_prefill(manager, "a", prompt)
    manager.free("a")
    blocks, num_cached = manager.get_computed_blocks(prompt)
    assert manager.allocate_slots("other", 0, 12)  # evicts everything
    manager.free("other")
    with pytest.raises(ValueError, match="no longer cached"):
        manager.allocate_slots("b", num_cached, 1, blocks)


def test_preempted_request_resumes_from_its_own_cached_blocks():
    manager = make_manager()
    tokens = list(range(10)) + [50, 51]  # prompt + 2 outputs
    run_prefill(manager, "a", tokens)
    manager.free("a")  # preempted
    blocks, num_cached = manager.get_computed_blocks(tokens)
    assert num_cached == 8
    assert manager.allocate_slots("a", num_cached, len(tokens) - num_cached, blocks)


def test_reset_prefix_cache_while_requests_run():
    manager = make_manager()
    tokens = list(range(9))
    assert manager.allocate_slots("a", 0, 9)
    manager.commit("a", tokens, 4)
    assert manager.block_pool.reset_prefix_cache() == 1
    manager.commit("a", tokens, 9)  # a's first block stays uncached; the chain goes on
    assert manager.get_computed_blocks(tokens) == ([], 0)
    assert manager.block_tables["a"][1].block_hash is not None
    manager.free("a")
    assert manager.num_free_blocks == 8


def test_prefix_caching_disabled():
    manager = make_manager(enable_prefix_caching=False)
    run_prefill(manager, "a", list(range(9)))
    assert manager.get_computed_blocks(list(range(9))) == ([], 0)
    assert manager.block_pool.num_cached_blocks == 0


# ---------------------------------------------------------------------- state machine
NUM_BLOCKS = 6
# Prompts = one of a few shared "system prompts" + a random tail over a tiny alphabet, so that
# prefix hits, duplicate blocks and repeated blocks at different positions are all common.
SYSTEM_PROMPTS = [[], [1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 7, 7, 7, 7, 8], [0, 0, 0, 0, 0, 0, 0, 0]]


class BlockManagerMachine(RuleBasedStateMachine):
    """An engine in miniature: admit requests (with prefix hits), schedule chunks, run them,
    commit, decode, free. The model `kv` maps every slot to what its key/value depends on:
    the token prefix up to and including that position. Every request must read, for every
    computed position p, exactly `tuple(token_ids[: p + 1])`.
    """

    def __init__(self):
        super().__init__()
        self.manager = BlockManager(BlockPool(NUM_BLOCKS, observer=BlockEventLog()), BLOCK_SIZE)
        self.pool = self.manager.block_pool
        self.kv: dict[int, tuple[int, ...]] = {}
        self.requests: dict[str, dict] = {}  # id -> token_ids, num_computed, num_scheduled
        self.num_admitted = 0
        self.history: list[tuple[int, ...]] = []  # token ids committed by some request

    # -- helpers
    def state(self):
        tables = {rid: self.manager.get_block_table(rid) for rid in self.manager.block_tables}
        return self.pool.snapshot(), self.pool.free_queue_ids(), tables

    def expected_num_hit_blocks(self, token_ids):
        """Brute force: which prefixes do the cached blocks hold, according to `kv`?"""
        cached_prefixes = {
            self.kv.get(block.block_id * BLOCK_SIZE + BLOCK_SIZE - 1)
            for block in self.pool.blocks
            if block.block_hash is not None
        }
        num_blocks = 0
        while (
            num_blocks < (len(token_ids) - 1) // BLOCK_SIZE
            and tuple(token_ids[: (num_blocks + 1) * BLOCK_SIZE]) in cached_prefixes
        ):
            num_blocks += 1
        return num_blocks

    def try_allocate(self, request_id, num_computed, num_new, computed_blocks=()):
        self.pool.observer.drain()
        before = self.state()
        can = self.manager.can_allocate_slots(request_id, num_computed, num_new, computed_blocks)
        ok = self.manager.allocate_slots(request_id, num_computed, num_new, computed_blocks)
        assert can == ok
        if not ok:
            event("allocate_slots refused")
            assert self.state() == before and self.pool.observer.drain() == []
        elif any(e.kind == "evicted" for e in self.pool.observer.drain()):
            event("eviction")
        return ok

    def pick(self, index, predicate):
        candidates = sorted(rid for rid, r in self.requests.items() if predicate(r))
        return candidates[index % len(candidates)]

    # -- rules
    @rule(
        system_prompt=st.sampled_from(SYSTEM_PROMPTS),
        tail=st.lists(st.integers(0, 2), min_size=1, max_size=10),
        chunk=st.integers(1, 12),
    )
    def admit(self, system_prompt, tail, chunk):
        self.admit_tokens(system_prompt + tail, chunk)

    @precondition(lambda self: self.history)
    @rule(index=st.integers(0, 100), chunk=st.integers(1, 12))
    def admit_again(self, index, chunk):
        """The same tokens as an earlier request: long hits, and hits on the whole prompt."""
        self.admit_tokens(list(self.history[index % len(self.history)]), chunk)

    def admit_tokens(self, token_ids, chunk):
        before = self.pool.snapshot()
        blocks, num_cached = self.manager.get_computed_blocks(token_ids)
        assert self.pool.snapshot() == before  # a lookup takes no reference
        assert len(blocks) == self.expected_num_hit_blocks(token_ids)
        assert num_cached == len(blocks) * BLOCK_SIZE
        if blocks:
            is_longest = len(blocks) == (len(token_ids) - 1) // BLOCK_SIZE
            event("longest possible hit" if is_longest else "prefix hit")
        for i, block in enumerate(blocks):  # each hit block holds exactly these tokens
            for offset in range(BLOCK_SIZE):
                position = i * BLOCK_SIZE + offset
                slot = block.block_id * BLOCK_SIZE + offset
                assert self.kv[slot] == tuple(token_ids[: position + 1])

        request_id = f"r{self.num_admitted}"
        self.num_admitted += 1
        num_new = min(chunk, len(token_ids) - num_cached)
        if self.try_allocate(request_id, num_cached, num_new, blocks):
            table = self.manager.get_block_table(request_id)
            assert table[: len(blocks)] == [b.block_id for b in blocks]
            self.requests[request_id] = {
                "token_ids": token_ids,
                "num_computed": num_cached,
                "num_scheduled": num_new,
            }

    @precondition(lambda self: any(r["num_scheduled"] == 0 for r in self.requests.values()))
    @rule(index=st.integers(0, 100), chunk=st.integers(1, 6))
    def schedule(self, index, chunk):
        request_id = self.pick(index, lambda r: r["num_scheduled"] == 0)
        request = self.requests[request_id]
        num_new = min(chunk, len(request["token_ids"]) - request["num_computed"])
        if self.try_allocate(request_id, request["num_computed"], num_new):
            request["num_scheduled"] = num_new

    @precondition(lambda self: any(r["num_scheduled"] > 0 for r in self.requests.values()))
    @rule(index=st.integers(0, 100), sampled_token=st.integers(0, 2))
    def execute(self, index, sampled_token):
        """The forward pass: write the new KV, then check the request reads the right KV."""
        request_id = self.pick(index, lambda r: r["num_scheduled"] > 0)
        request = self.requests[request_id]
        token_ids, start = request["token_ids"], request["num_computed"]
        end = start + request["num_scheduled"]
        new_slots = self.manager.slot_mapping(request_id, start, end)
        for position, slot in zip(range(start, end), new_slots):
            block = self.pool.blocks[slot // BLOCK_SIZE]
            # Writing into a shared or cached block would corrupt someone else's KV.
            assert block.ref_cnt == 1 and block.block_hash is None
            self.kv[slot] = tuple(token_ids[: position + 1])
        for position, slot in enumerate(self.manager.slot_mapping(request_id, 0, end)):
            assert self.kv[slot] == tuple(token_ids[: position + 1])

        self.manager.commit(request_id, token_ids, end)
        self.history.append(tuple(token_ids[:end]))
        request["num_computed"], request["num_scheduled"] = end, 0
        if end == len(token_ids):
            token_ids.append(sampled_token)  # decoding: one more token to compute

    @precondition(lambda self: self.requests)
    @rule(index=st.integers(0, 100))
    def free(self, index):
        """Finish or preempt a request; its blocks reaching ref_cnt 0 are freed tail first."""
        request_id = self.pick(index, lambda r: True)
        table = self.manager.block_tables[request_id]
        expected = [block.block_id for block in reversed(table) if block.ref_cnt == 1]
        self.pool.observer.drain()
        self.manager.free(request_id)
        assert [e.block_id for e in self.pool.observer.drain() if e.kind == "freed"] == expected
        del self.requests[request_id]
        with pytest.raises(KeyError):
            self.manager.free(request_id)

    # -- invariants
    @invariant()
    def consistent(self):
        self.pool.check_invariants()
        holders = [0] * NUM_BLOCKS
        for request_id, table in self.manager.block_tables.items():
            request = self.requests[request_id]
            num_tokens = request["num_computed"] + request["num_scheduled"]
            assert len(table) == cdiv(num_tokens, BLOCK_SIZE)  # enough blocks, none extra
            for block in table:
                holders[block.block_id] += 1
            assert self.manager.get_block_table(request_id) == [block.block_id for block in table]
        assert [block.ref_cnt for block in self.pool.blocks] == holders
        assert self.manager.block_tables.keys() == self.requests.keys()

    @invariant()
    def computed_kv_is_intact(self):
        # Eviction or reuse must never touch a block a request still reads.
        for request_id, request in self.requests.items():
            slots = self.manager.slot_mapping(request_id, 0, request["num_computed"])
            for position, slot in enumerate(slots):
                assert self.kv[slot] == tuple(request["token_ids"][: position + 1])

    def teardown(self):
        for request_id in list(self.requests):
            self.manager.free(request_id)
        assert self.manager.block_tables == {}
        assert self.manager.num_free_blocks == NUM_BLOCKS and self.manager.usage == 0.0
        self.pool.check_invariants()


BlockManagerMachine.TestCase.settings = settings(
    max_examples=120, stateful_step_count=50, deadline=None
)
TestBlockManagerMachine = BlockManagerMachine.TestCase


# ---------------------------------------------------------------------- speculative decoding
def test_trim_frees_the_tail_blocks_once_and_never_committed_ones():
    """Rejected drafts: the table shrinks to the blocks of the tokens kept."""
    manager = make_manager(num_blocks=8)
    tokens = list(range(1, 8))  # 7 tokens: blocks of 4 -> 2 blocks
    assert manager.allocate_slots("a", 0, 7)
    manager.commit("a", tokens, 7)  # block 0 full and committed
    assert manager.allocate_slots("a", 7, 6)  # one decode + 5 drafts: 13 tokens, 4 blocks
    assert len(manager.get_block_table("a")) == 4 and manager.num_free_blocks == 4
    manager.trim("a", 9)  # 2 drafts accepted: 9 tokens kept, 3 blocks
    assert len(manager.get_block_table("a")) == 3 and manager.num_free_blocks == 5
    manager.trim("a", 9)  # again: nothing more to free
    assert manager.num_free_blocks == 5
    manager.block_pool.check_invariants()
    with pytest.raises(ValueError, match="cannot trim to 3 tokens, 4 are committed"):
        manager.trim("a", 3)
    manager.free("a")
    assert manager.num_free_blocks == 8


def test_a_caller_kept_hash_list_hashes_each_block_once(monkeypatch):
    """A request waiting many steps looks its prefix up every step: with its hash list kept,
    each block is hashed once, and the answer is the one a fresh lookup gives."""
    from minilm_engine.core import kv_cache_manager as bm

    manager = make_manager(num_blocks=8)
    prompt = list(range(13))
    run_prefill(manager, "a", prompt)
    calls = []
    real = bm.hash_block_tokens
    monkeypatch.setattr(bm, "hash_block_tokens", lambda parent, tokens: calls.append(1) or real(parent, tokens))
    kept: list[int] = []
    first = manager.get_computed_blocks(prompt + [99], kept)
    assert len(calls) == 3 and len(kept) == 3
    for _ in range(5):
        assert manager.get_computed_blocks(prompt + [99], kept) == first
    assert len(calls) == 3  # nothing hashed again
    longer = prompt + [99, 98, 97, 96]  # the request grew by a block: one more hash
    assert manager.get_computed_blocks(longer, kept) == manager.get_computed_blocks(longer)
    assert len(kept) == 4
