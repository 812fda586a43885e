"""One step's chunks flattened into one forward pass: input ids, positions, attention metadata.

Contract: `flatten_chunks(chunks, block_size, device, block_table=None, buffer=None)` turns
`Chunk`s (a request's tokens this step and the position of the first) into the flat inputs of
one forward pass, no padding.  Block tables come from `block_table` (the runner's `BlockTable`,
rows found by request id) or, without one, from each chunk's own list (the draft proposer).
It reads nothing but its arguments: nothing here reaches into a block manager.

    chunks:       A: [a0 a1 a2 a3] from 0     B: [b7] from 7     C: [c0 c1] from 0
    input_ids:    [ a0 a1 a2 a3 | b7 | c0 c1 ]
    positions:    [  0  1  2  3 |  7 |  0  1 ]
    query_start_loc: [0, 4, 5, 7]    context_lens: [4, 8, 2]

Positions, slots and lengths are computed for the whole step in numpy and sent in one copy
through an `InputBuffer`; the metadata keeps the numpy copies (`HostMetadata`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from minilm_engine.model.attention.paged import HostMetadata, PagedAttentionMetadata
from minilm_engine.worker.block_table import BlockTable


@dataclass(slots=True)  # one per request per step: as cheap as a tuple to build
class Chunk:
    """One sequence's tokens in a step.  Invariant: its block table covers positions
    [start, start + len(token_ids))."""

    request_id: str
    token_ids: list[int]
    start: int  # position of token_ids[0]
    block_table: list[int] | None = None  # None: the row of `request_id` in the step's BlockTable

    @property
    def end(self) -> int:
        """One past the last position: the sequence's context length after this step."""
        return self.start + len(self.token_ids)


class InputBuffer:
    """A step's int64 inputs in memory allocated once and reused (vLLM's persistent input
    buffers): laid side by side on the host, sent over in one copy.

        host (pinned on a GPU)   [ input_ids | positions | slot_mapping | query_start_loc | ... ]
                                 device[:used].copy_(host[:used], non_blocking=True)
        device                   [ the same layout ]   the step's tensors are views of it

    Pinned, so the copy does not make the host wait for the GPU; allocated once, since pinned
    memory is slow to allocate.  On a CPU the host array is the device's: nothing is copied.
    Invariant: the tensors `upload` returns hold their values until the next `upload` (which
    first waits for the last copy to be done).  Grows by doubling, never shrinks.
    """

    def __init__(self, device: torch.device | str, size: int = 1024):
        self.device = torch.device(device)
        self._allocate(size)

    def _allocate(self, size: int) -> None:
        on_gpu = self.device.type == "cuda"
        self.host = torch.zeros(size, dtype=torch.int64, pin_memory=on_gpu)  # (size,)
        self.host_array = self.host.numpy()  # the same memory, filled with numpy
        self.on_device = torch.zeros(size, dtype=torch.int64, device=self.device) if on_gpu else self.host
        self._copied = torch.cuda.Event() if on_gpu else None  # recorded after each copy to the GPU

    def upload(self, arrays: Sequence[np.ndarray]) -> list[torch.Tensor]:
        """int64 `arrays` of any shapes -> device tensors of the same shapes and values, views of
        the buffer, sent in one copy."""
        total = sum(a.size for a in arrays)
        if total > self.host.shape[0]:
            self._allocate(max(total, 2 * self.host.shape[0]))
        if self._copied is not None:
            self._copied.synchronize()  # returns at once, unless the last copy is still queued
        views, offset = [], 0
        for array in arrays:
            self.host_array[offset : offset + array.size] = array.reshape(-1)
            views.append((offset, array.size, array.shape))
            offset += array.size
        if self.on_device is not self.host:
            self.on_device[:total].copy_(self.host[:total], non_blocking=True)
            self._copied.record(torch.cuda.current_stream(self.device))  # the stream that copies
        return [self.on_device[start : start + size].view(shape) for start, size, shape in views]


def flatten_chunks(
    chunks: Sequence[Chunk],
    block_size: int,
    device: torch.device,
    block_table: BlockTable | None = None,
    buffer: InputBuffer | None = None,
) -> tuple[torch.Tensor, torch.Tensor, PagedAttentionMetadata]:
    """-> (input_ids (N,), positions (N,), metadata) of one flat forward pass over `chunks`,
    uploaded through `buffer` (None: a buffer for this call alone); valid until its next use."""
    if block_table is None:
        block_table = BlockTable.of([c.block_table for c in chunks], block_size)
        rows = np.arange(len(chunks))
    else:
        rows = np.array([block_table.row_of[c.request_id] for c in chunks], dtype=np.int64)  # (S,)
    token_ids: list[int] = []
    for chunk in chunks:
        token_ids += chunk.token_ids
    input_ids = np.array(token_ids, dtype=np.int64)  # (N,)
    starts = np.array([c.start for c in chunks], dtype=np.int64)  # (S,)
    num_new = np.array([len(c.token_ids) for c in chunks], dtype=np.int64)  # (S,)
    query_start_loc = np.concatenate([[0], np.cumsum(num_new)])  # (S + 1,)
    # Token i of the step belongs to sequence seq_of[i] and sits at its position start + offset.
    seq_of = np.repeat(np.arange(len(chunks)), num_new)  # (N,)
    positions = starts[seq_of] + np.arange(len(input_ids)) - query_start_loc[seq_of]  # (N,)
    slots = block_table.slot_mapping(rows, starts, starts + num_new)  # (N,)
    host = HostMetadata(query_start_loc, starts + num_new, block_table.gather(rows))  # (S + 1,), (S,), (S, W)

    buffer = buffer if buffer is not None else InputBuffer(device, size=0)
    ids_t, positions_t, slots_t, query_start_loc_t, context_lens_t, block_tables_t = buffer.upload(
        [input_ids, positions, slots, host.query_start_loc, host.context_lens, host.block_tables]
    )
    meta = PagedAttentionMetadata(
        slot_mapping=slots_t,
        query_start_loc=query_start_loc_t,
        context_lens=context_lens_t,
        block_tables=block_tables_t,  # (S, longest table of the step)
        max_query_len=int(num_new.max()),
        host=host,
    )
    return ids_t, positions_t, meta
