"""A record of every engine step, for plots, widgets and tests.

Contract: after each step the engine appends one `StepRecord` (who ran, with how many prefill
and decode tokens, what happened to which KV block, pool occupancy, wall time) and calls every
registered callback with it; `to_dataframe()` gives one row per (step, request).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from minilm_engine.core.block_pool import BlockEvent, BlockEventLog


@dataclass
class ScheduledChunk:
    request_id: str
    num_prefill_tokens: int
    num_decode_tokens: int
    num_cached_tokens: int = 0  # prefix-cache hit taken in this step
    # Speculative decoding: the drafts verified this step, how many the target accepted, and
    # the tokens appended (accepted drafts, then the target's own: a correction or a bonus).
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    draft_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)


@dataclass
class StepRecord:
    step: int
    start_time: float
    duration_s: float
    chunks: list[ScheduledChunk]
    preempted: list[str]
    finished: list[str]
    block_events: list[BlockEvent]
    num_waiting: int
    num_running: int
    num_blocks: int
    num_used_blocks: int
    num_cached_blocks: int  # free but still holding a reusable prefix
    block_tables: dict[str, list[int]] = field(default_factory=dict)  # running requests
    tokens_in_cache: dict[str, int] = field(default_factory=dict)  # their computed tokens

    @property
    def num_prefill_tokens(self) -> int:
        return sum(c.num_prefill_tokens for c in self.chunks)

    @property
    def num_decode_tokens(self) -> int:
        return sum(c.num_decode_tokens for c in self.chunks)

    @property
    def num_draft_tokens(self) -> int:
        return sum(c.num_draft_tokens for c in self.chunks)

    @property
    def num_accepted_tokens(self) -> int:
        return sum(c.num_accepted_tokens for c in self.chunks)

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks


StepCallback = Callable[[StepRecord], None]


class StepTrace:
    """The records so far, the callbacks to call with each new one, and `block_log`, the block
    pool's observer, holding the block events of the step under way."""

    def __init__(self) -> None:
        self.records: list[StepRecord] = []
        self.callbacks: list[StepCallback] = []
        self.block_log = BlockEventLog()

    def append(self, record: StepRecord) -> None:
        self.records.append(record)
        for callback in self.callbacks:
            callback(record)

    def clear(self) -> None:
        self.records.clear()

    def to_records(self) -> list[dict]:
        """One dict per (step, scheduled request)."""
        return [
            {"step": rec.step, "start_time": rec.start_time, "duration_s": rec.duration_s,
             **asdict(chunk),
             "num_running": rec.num_running, "num_waiting": rec.num_waiting, "kv_usage": rec.usage}
            for rec in self.records
            for chunk in rec.chunks
        ]

    def to_dataframe(self):
        import pandas as pd

        return pd.DataFrame(self.to_records())
