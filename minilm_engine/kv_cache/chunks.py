"""One step's chunks flattened into one forward pass: input ids, positions, attention metadata.

Contract: `flatten_chunks(chunks, block_size, device)` turns a list of `Chunk`s (one sequence's
share of a step: its request id, the token ids computed this step, the position of the first,
and the block table that holds its slots) into the flat inputs of one forward pass, with no
padding.  It reads nothing but its arguments: the caller (the engine's model runner, or the
draft proposer over its own block manager) hands each chunk's block table in, so neither this
module nor the model ever reaches into a block manager.

    chunks:       A: [a0 a1 a2 a3] from 0     B: [b7] from 7     C: [c0 c1] from 0
    input_ids:    [ a0 a1 a2 a3 | b7 | c0 c1 ]
    positions:    [  0  1  2  3 |  7 |  0  1 ]
    query_start_loc: [0, 4, 5, 7]    context_lens: [4, 8, 2]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from ..attention.paged import PagedAttentionMetadata
from .block_table import slot_mapping


@dataclass(slots=True)  # one per request per step: slots make it as cheap as a tuple to build
class Chunk:
    """One sequence's tokens in a step.  Invariant: `block_table` covers positions
    [start, start + len(token_ids)) (the scheduler allocated those slots)."""

    request_id: str
    token_ids: list[int]
    start: int  # position of token_ids[0]
    block_table: list[int]

    @property
    def end(self) -> int:
        """One past the last position: the sequence's context length after this step."""
        return self.start + len(self.token_ids)


def flatten_chunks(
    chunks: Sequence[Chunk], block_size: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
    """-> (input_ids (N,), positions (N,), metadata) of one flat forward pass over `chunks`."""
    input_ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    query_start_loc = [0]
    context_lens: list[int] = []
    for chunk in chunks:
        input_ids += chunk.token_ids
        positions += range(chunk.start, chunk.end)
        slots += slot_mapping(chunk.block_table, block_size, chunk.start, chunk.end)
        query_start_loc.append(len(input_ids))
        context_lens.append(chunk.end)
    width = max(len(c.block_table) for c in chunks)

    def as_tensor(values) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.long, device=device)

    meta = PagedAttentionMetadata(
        slot_mapping=as_tensor(slots),
        query_start_loc=as_tensor(query_start_loc),
        context_lens=as_tensor(context_lens),
        # Through numpy: a list of lists converts to an array ~4x faster than to a tensor,
        # and at 256 sequences of long contexts this table is most of what a step copies.
        block_tables=torch.from_numpy(
            np.array([c.block_table + [0] * (width - len(c.block_table)) for c in chunks], dtype=np.int64)
        ).to(device),
        max_query_len=max(len(c.token_ids) for c in chunks),
    )
    return as_tensor(input_ids), as_tensor(positions), meta
