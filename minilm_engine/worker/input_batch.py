"""One step's chunks flattened into one forward pass: input ids, positions, attention metadata.

Contract: `flatten_chunks(chunks, block_size, device, block_table=None)` turns a list of `Chunk`s
(one sequence's share of a step: its request id, the token ids computed this step and the
position of the first) into the flat inputs of one forward pass, with no padding.  The block
tables come from `block_table`, the engine's `BlockTable` that its model runner keeps up to date
from the scheduler's output (each chunk's row is found by its request id); without one, from
each chunk's own `block_table` list (the draft proposer, over its own block manager).  It reads
nothing but its arguments, so neither this module nor the model ever reaches into a block
manager.

    chunks:       A: [a0 a1 a2 a3] from 0     B: [b7] from 7     C: [c0 c1] from 0
    input_ids:    [ a0 a1 a2 a3 | b7 | c0 c1 ]
    positions:    [  0  1  2  3 |  7 |  0  1 ]
    query_start_loc: [0, 4, 5, 7]    context_lens: [4, 8, 2]

Everything past the token ids is computed for the whole step at once, in numpy (positions,
slots, lengths: a few array operations, not a Python loop per token).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minilm_engine.model.attention.paged import PagedAttentionMetadata
from minilm_engine.worker.block_table import BlockTable


@dataclass(slots=True)  # one per request per step: slots make it as cheap as a tuple to build
class Chunk:
    """One sequence's tokens in a step.  Invariant: its block table (its row of the step's
    `BlockTable`, or `block_table`) covers positions [start, start + len(token_ids)) (the
    scheduler allocated those slots)."""

    request_id: str
    token_ids: list[int]
    start: int  # position of token_ids[0]
    block_table: list[int] | None = None  # None: the row of `request_id` in the step's BlockTable

    @property
    def end(self) -> int:
        """One past the last position: the sequence's context length after this step."""
        return self.start + len(self.token_ids)


def flatten_chunks(
    chunks: Sequence[Chunk], block_size: int, device: torch.device, block_table: BlockTable | None = None
) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
    """-> (input_ids (N,), positions (N,), metadata) of one flat forward pass over `chunks`."""
    if block_table is None:
        block_table = BlockTable.of([c.block_table for c in chunks], block_size)
        rows = np.arange(len(chunks))
    else:
        rows = np.array([block_table.row_of[c.request_id] for c in chunks], dtype=np.int64)  # (S,)
    input_ids: list[int] = []
    for chunk in chunks:
        input_ids += chunk.token_ids
    starts = np.array([c.start for c in chunks], dtype=np.int64)  # (S,)
    num_new = np.array([len(c.token_ids) for c in chunks], dtype=np.int64)  # (S,)
    query_start_loc = np.concatenate([[0], np.cumsum(num_new)])  # (S + 1,)
    # Token i of the step belongs to sequence seq_of[i] and sits at its position start + offset.
    seq_of = np.repeat(np.arange(len(chunks)), num_new)  # (N,)
    positions = starts[seq_of] + np.arange(len(input_ids)) - query_start_loc[seq_of]  # (N,)
    slots = block_table.slot_mapping(rows[seq_of], positions)  # (N,)

    def as_tensor(values: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.int64)).to(device)

    meta = PagedAttentionMetadata(
        slot_mapping=as_tensor(slots),
        query_start_loc=as_tensor(query_start_loc),
        context_lens=as_tensor(starts + num_new),
        block_tables=as_tensor(block_table.gather(rows)),  # (S, longest table of the step)
        max_query_len=int(num_new.max()),
    )
    return torch.tensor(input_ids, dtype=torch.long, device=device), as_tensor(positions), meta
