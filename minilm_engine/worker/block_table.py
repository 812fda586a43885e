"""The step's block tables, kept between steps (vLLM's worker-side `BlockTable`)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from minilm_engine.core.kv_cache_utils import slot_mapping
from minilm_engine.pluggable import is_overridden


class BlockTable:
    """Every scheduled request's block table as a row of one numpy array, kept from step to
    step: a step changes only the rows that got blocks, and reads its rows with one gather.

        row_of = {"A": 0, "B": 1}       num_blocks = [3, 1]
        block_ids (max_num_reqs, max_num_blocks):
            row 0   [7  2  5  .  .]      A's table
            row 1   [4  .  .  .  .]      B's table      (cells past num_blocks: stale, never read)

    `update(request_id, num_kept_blocks, new_block_ids)` applies what the scheduler says changed
    (`ScheduledRequest`): the row keeps its first `num_kept_blocks`, then `new_block_ids` (a new
    row must send its whole table); `remove` frees a row.  Rows and columns grow when needed.

    Invariant: for every request with a row, `block_ids[row, :num_blocks[row]]` equals its table
    in the block manager whenever the scheduler's output has been applied.
    """

    def __init__(self, max_num_reqs: int, max_num_blocks: int, block_size: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        # numpy: its small operations cost a fraction of torch's.
        self.block_ids = np.zeros((max(1, max_num_reqs), max(1, max_num_blocks)), dtype=np.int64)
        self.num_blocks = np.zeros(self.block_ids.shape[0], dtype=np.int64)  # (max_num_reqs,)
        self.row_of: dict[str, int] = {}
        self._free_rows = list(range(self.block_ids.shape[0] - 1, -1, -1))  # pop() gives row 0 first

    @classmethod
    def of(cls, tables: Sequence[Sequence[int]], block_size: int) -> BlockTable:
        """A table whose row i holds `tables[i]` (request ids "0", "1", ...)."""
        table = cls(len(tables), max((len(t) for t in tables), default=1), block_size)
        for i, block_ids in enumerate(tables):
            table.update(str(i), 0, block_ids)
        return table

    def update(self, request_id: str, num_kept_blocks: int, new_block_ids: Sequence[int]) -> int:
        """Keep the row's first `num_kept_blocks`, append `new_block_ids`; -> the row."""
        row = self.row_of.get(request_id)
        if row is None:
            if num_kept_blocks != 0:
                raise ValueError(
                    f"request {request_id!r} has no row yet: its first update must carry its whole "
                    f"table (num_kept_blocks=0), got num_kept_blocks={num_kept_blocks}"
                )
            if not self._free_rows:
                self._grow(num_rows=2 * self.block_ids.shape[0])
            row = self.row_of[request_id] = self._free_rows.pop()
        elif num_kept_blocks > self.num_blocks[row]:
            raise ValueError(
                f"request {request_id!r}: cannot keep {num_kept_blocks} blocks, its row holds "
                f"{int(self.num_blocks[row])}"
            )
        end = num_kept_blocks + len(new_block_ids)
        if end > self.block_ids.shape[1]:
            self._grow(num_cols=max(end, 2 * self.block_ids.shape[1]))
        if new_block_ids:
            self.block_ids[row, num_kept_blocks:end] = new_block_ids
        self.num_blocks[row] = end
        return row

    def remove(self, request_id: str) -> None:
        """Free the request's row; an id without one is ignored (it never ran here)."""
        row = self.row_of.pop(request_id, None)
        if row is not None:
            self.num_blocks[row] = 0
            self._free_rows.append(row)

    def get_row(self, request_id: str) -> list[int]:
        """The request's table as a list (for tests and traces)."""
        row = self.row_of[request_id]
        return self.block_ids[row, : self.num_blocks[row]].tolist()

    def slot_mapping(self, rows: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """(S,), (S,), (S,) -> (N,): the cache slots of positions [starts[i], ends[i]) of the
        request in row rows[i], for i in order.  Raises if a position lies past its row's blocks
        (the scheduler allocated too little, or the update was not applied).

        `kv_cache_utils.slot_mapping`'s arithmetic for the whole step in a few numpy operations;
        when a build exercise replaced that function, it is called once per request instead, so
        the learner's version runs."""
        short = np.flatnonzero(ends > self.num_blocks[rows] * self.block_size)
        if len(short):
            row = int(rows[short[0]])
            request_id = next(rid for rid, r in self.row_of.items() if r == row)
            raise ValueError(
                f"request {request_id!r}: position {int(ends[short[0]]) - 1} lies past its "
                f"{int(self.num_blocks[row])} blocks of {self.block_size}"
            )
        if is_overridden("kv_cache.slot_mapping"):
            slots: list[int] = []
            for row, start, end in zip(rows.tolist(), starts.tolist(), ends.tolist()):
                table = self.block_ids[row, : self.num_blocks[row]].tolist()
                slots += slot_mapping(table, self.block_size, start, end)
            return np.array(slots, dtype=np.int64)
        num_new = ends - starts  # (S,)
        row_of_token = np.repeat(rows, num_new)  # (N,)
        first_rows = np.cumsum(num_new) - num_new  # (S,) each request's first token of the step
        positions = np.arange(num_new.sum()) + np.repeat(starts - first_rows, num_new)  # (N,)
        blocks = self.block_ids[row_of_token, positions // self.block_size]  # (N,)
        return blocks * self.block_size + positions % self.block_size

    def gather(self, rows: np.ndarray) -> np.ndarray:
        """(S, width) the tables of `rows`, `width` the longest (cells past a row's length are
        stale: readers stop at the context length)."""
        width = int(self.num_blocks[rows].max()) if len(rows) else 0
        return self.block_ids[rows, :width]

    def _grow(self, num_rows: int | None = None, num_cols: int | None = None) -> None:
        old_rows, old_cols = self.block_ids.shape
        num_rows, num_cols = num_rows or old_rows, num_cols or old_cols
        grown = np.zeros((num_rows, num_cols), dtype=np.int64)
        grown[:old_rows, :old_cols] = self.block_ids
        self.block_ids = grown
        self.num_blocks = np.concatenate([self.num_blocks, np.zeros(num_rows - old_rows, dtype=np.int64)])
        self._free_rows = list(range(num_rows - 1, old_rows - 1, -1)) + self._free_rows

