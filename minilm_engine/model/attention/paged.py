"""Paged attention: a step's metadata, the KV write and the readable reference.

Contract: `PagedAttentionMetadata` says where a step's new keys/values go and what each sequence
may look at; `write_kv_reference` stores them and `paged_attention_reference` attends (planned
once per step by `plan_reference_attention`), over caches of (num_blocks, block_size, H_kv, D)
per layer: the definitions every other backend is tested against.  A step's sequences are one
flat row of tokens, prompt chunks and decodes side by side:

    flattened queries:  [ A0 A1 A2 A3 | B7 | C4 C5 ]      query_start_loc = [0, 4, 5, 7]
    block_tables:       A -> [3, 9]   B -> [5, 1]   C -> [2]
    context_lens:       A: 4          B: 8          C: 6   (cached + new tokens)

    slot of token j of a sequence = block_table[j // block_size] * block_size + j % block_size

The metadata keeps the host copies it was built from (`HostMetadata`); the host reads those,
never the device (a read-back makes the host wait for every kernel queued before it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minilm_engine.model.attention.reference import attention


@dataclass(eq=False)
class HostMetadata:
    """The step's lengths and tables on the host (numpy), as uploaded into the tensors of the
    same names.  query_start_loc: (S + 1,)   context_lens: (S,)   block_tables: (S, W), int64."""

    query_start_loc: np.ndarray
    context_lens: np.ndarray
    block_tables: np.ndarray

    @property
    def num_queries(self) -> np.ndarray:
        """(S,) new tokens of each sequence this step (1: a decode)."""
        return np.diff(self.query_start_loc)

    def __eq__(self, other: object) -> bool:  # arrays compare element by element
        if not isinstance(other, HostMetadata):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("query_start_loc", "context_lens", "block_tables"))


@dataclass
class PagedAttentionMetadata:
    """Where this step's tokens go and what each sequence may look at.

    slot_mapping: (N,) int64 cache slot for each of the N new tokens
    query_start_loc: (S + 1,) int64 offsets of each sequence's tokens in the flattened batch
    context_lens: (S,) int64 tokens of each sequence in the cache after this step
    block_tables: (S, max_blocks_per_seq) int64 block ids (rows padded with 0)
    max_query_len: the most new tokens of one sequence (None: computed on the device, a sync)
    host: the host copies (`HostMetadata`), or None (tensors alone: `on_host` reads back)
    """

    slot_mapping: torch.Tensor
    query_start_loc: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_query_len: int | None = None
    host: HostMetadata | None = None

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]

    def on_host(self) -> HostMetadata:
        """The host copies: kept ones, or read back now for metadata that came without them."""
        if self.host is not None:
            return self.host
        return HostMetadata(
            self.query_start_loc.cpu().numpy(), self.context_lens.cpu().numpy(), self.block_tables.cpu().numpy()
        )


def write_kv_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """k, v: (N, H_kv, D) -> stored at `slot_mapping` in caches of (num_blocks, block_size, H_kv, D)."""
    num_kv_heads, head_dim = k.shape[1], k.shape[2]
    k_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = k
    v_cache.view(-1, num_kv_heads, head_dim)[slot_mapping] = v


def paged_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: PagedAttentionMetadata,
    plan: ReferencePlan | None = None,
) -> torch.Tensor:
    """q: (N, H, D) flattened queries -> (N, H, D), each sequence over its own cached tokens.

    Sequences are attended in at most two batched calls, decodes (one query each) and prompt
    chunks (several), each padded to its longest query and context (`AttentionGroup`).  Which
    rows and slots those are is `plan` (`plan_reference_attention(meta, ...)`): the engine's
    backend builds it once per step, before the first layer, and every layer passes it in, so a
    layer only gathers, multiplies and writes back.  Without one (a one-off call) it is planned
    here.
    """
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    # One row of D numbers per (slot, K/V head): a group's keys come out of one gather already
    # laid out (S, H_kv, L, D), as the matmuls want them.
    k_rows, v_rows = k_cache.view(-1, head_dim), v_cache.view(-1, head_dim)
    if plan is None:
        plan = plan_reference_attention(meta, k_cache.shape[1], num_kv_heads)
    elif (plan.block_size, plan.num_kv_heads) != (k_cache.shape[1], num_kv_heads):
        raise ValueError(
            f"the plan was made for block_size={plan.block_size}, {plan.num_kv_heads} K/V heads; "
            f"this cache has block_size={k_cache.shape[1]}, {num_kv_heads} K/V heads"
        )
    out = None if plan.covers_all_rows else torch.empty_like(q)
    for group in plan.groups:
        num_seqs, num_queries = group.query_rows.shape
        if out is None:  # one query per sequence, rows in order: no gather needed
            queries = q.view(num_seqs, 1, *q.shape[1:])
        else:
            queries = q.index_select(0, group.query_rows.flatten()).view(num_seqs, num_queries, *q.shape[1:])
        key_shape = (*group.key_rows.shape, head_dim)  # (S, H_kv, L, D)
        # index_select rather than k_rows[key_rows]: the same gather, several times faster on a CPU.
        o = attention(
            queries.transpose(1, 2),  # (S, H, T, D)
            k_rows.index_select(0, group.key_rows.flatten()).view(key_shape),
            v_rows.index_select(0, group.key_rows.flatten()).view(key_shape),
            group.mask,  # (S, T, L)
        )
        o = o.transpose(1, 2).reshape(num_seqs * num_queries, *q.shape[1:])  # (S * T, H, D)
        if out is None:
            return o  # a pure decode step: the group is every row, in order
        out.index_copy_(0, group.out_rows, o.index_select(0, group.real_queries))
    return out


@dataclass(frozen=True)
class AttentionGroup:
    """Sequences attended in one batched call: S of them, queries padded to T, keys to L.

    query_rows: (S, T) row of each query in the flattened batch; padding repeats the sequence's
        last query (so its softmax row is a real one), and its result is dropped
    key_rows: (S, H_kv, L) row of each key in the cache viewed as (slots * H_kv, D); padding
        repeats the sequence's first key, a real one, so no slot another request left behind
        (junk, even NaN, which 0 * NaN would let through) is ever read
    mask: (S, T, L) bool, True where query t may see key l: causal, inside its own context
    real_queries: (num_real,) which of the S * T padded queries are real, in row order
    out_rows: (num_real,) the rows of the flattened output they fill
    """

    query_rows: torch.Tensor
    key_rows: torch.Tensor
    mask: torch.Tensor
    real_queries: torch.Tensor
    out_rows: torch.Tensor


@dataclass(frozen=True)
class ReferencePlan:
    """What the torch reference gathers in one step, for one cache geometry (built once per
    step, read by every layer).  `covers_all_rows`: one decode group holding rows 0..N-1 in
    order, so queries need no gather and the output no scatter."""

    meta: PagedAttentionMetadata
    block_size: int
    num_kv_heads: int
    groups: list[AttentionGroup]
    covers_all_rows: bool


def plan_reference_attention(meta: PagedAttentionMetadata, block_size: int, num_kv_heads: int) -> ReferencePlan:
    """Split a step's sequences into a decode group and a chunk group and build their indices.

    Built on the host, with numpy (a few microseconds an operation, where a small torch op
    costs several times that), from the step's host copies (`meta.on_host()`): nothing is read
    back from the device, and nothing is planned per layer.
    """
    host = meta.on_host()
    num_queries = host.num_queries  # (S,)
    decodes, chunks = np.flatnonzero(num_queries == 1), np.flatnonzero(num_queries > 1)
    device = meta.context_lens.device
    groups = [_group(host, seqs, block_size, num_kv_heads, device) for seqs in (decodes, chunks) if len(seqs)]
    return ReferencePlan(meta, block_size, num_kv_heads, groups, covers_all_rows=not len(chunks))


def _group(host: HostMetadata, seqs: np.ndarray, block_size: int, num_kv_heads: int,
           device: torch.device) -> AttentionGroup:
    starts, num_queries = host.query_start_loc[seqs], host.num_queries[seqs]  # (S,)
    context_lens = host.context_lens[seqs]  # (S,)
    T, L = int(num_queries.max()), int(context_lens.max())
    # Query t of a sequence sits at position context_len - num_queries + t (the last ones).
    t = np.minimum(np.arange(T)[None, :], num_queries[:, None] - 1)  # (S, T)
    query_rows = starts[:, None] + t
    query_pos = (context_lens - num_queries)[:, None] + t  # (S, T)
    key_pos = np.arange(L)  # (L,)
    mask = key_pos[None, None, :] <= query_pos[:, :, None]  # (S, T, L)
    # Key l of a sequence: its slot from the block table (see the module docstring).
    key_pos = np.where(key_pos[None, :] < context_lens[:, None], key_pos[None, :], 0)  # (S, L)
    block_ids = np.take_along_axis(host.block_tables[seqs], key_pos // block_size, axis=1)
    slots = block_ids * block_size + key_pos % block_size  # (S, L)
    key_rows = slots[:, None, :] * num_kv_heads + np.arange(num_kv_heads)[None, :, None]  # (S, H_kv, L)
    real_queries = np.flatnonzero(np.arange(T)[None, :] < num_queries[:, None])  # of the S * T

    def to_device(array: np.ndarray) -> torch.Tensor:
        # On a GPU through pinned memory, without waiting: a copy from ordinary (pageable)
        # memory makes the host wait for the GPU.  On a CPU, the numpy array itself.
        tensor = torch.from_numpy(np.ascontiguousarray(array))
        if device.type == "cuda":
            tensor = tensor.pin_memory()
        return tensor.to(device, non_blocking=True)

    return AttentionGroup(
        to_device(query_rows), to_device(key_rows), to_device(mask), to_device(real_queries),
        to_device(query_rows.reshape(-1)[real_queries]),
    )
