"""The engine's trace as a table of steps, for the chapters' measurements.

Contract: `steps_dataframe(trace)` is one row per `StepRecord` of `engine.trace` (core/trace.py),
in step order: its token counts, batch and queue sizes, KV-block occupancy, preemptions, drafts,
and timing.  The trace's own `to_dataframe()` is one row per (step, request) instead.
"""

from __future__ import annotations

import pandas as pd

from minilm_engine.core.trace import StepTrace


def steps_dataframe(trace: StepTrace) -> pd.DataFrame:
    """One row per step: token counts, occupancy and timing."""
    return pd.DataFrame(
        [
            {
                "step": r.step,
                "start_time": r.start_time,
                "duration_s": r.duration_s,
                "num_seqs": len(r.chunks),
                "num_prefill_tokens": r.num_prefill_tokens,
                "num_decode_tokens": r.num_decode_tokens,
                "num_running": r.num_running,
                "num_waiting": r.num_waiting,
                "num_used_blocks": r.num_used_blocks,
                "num_cached_blocks": r.num_cached_blocks,
                "kv_usage": r.usage,
                "num_preempted": len(r.preempted),
                "num_draft_tokens": r.num_draft_tokens,
                "num_accepted_tokens": r.num_accepted_tokens,
            }
            for r in trace.records
        ]
    )
