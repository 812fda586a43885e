"""Colours shared by the views: one stable colour per request, and fixed colours for block states.

Contract: `RequestColors` gives a request the next colour of a qualitative palette the first time
it sees the request's id, and the same colour ever after.  Every view seeds it from the engine's
trace in step order (`observe`), so two views of one engine agree on who is which colour without
sharing any state.  The palette cycles after `len(palette)` requests.
"""

from __future__ import annotations

from collections.abc import Sequence

import plotly.colors

from minilm_engine.core.trace import StepRecord

# Plotly's default qualitative palette: ten saturated hues, none of them grey or pale, so a
# request never looks like a free block (grey) or a cached-free block (pale).
PALETTE: tuple[str, ...] = tuple(plotly.colors.qualitative.Plotly)

FREE_COLOR = "#D9D9D9"  # a free block: holds nothing worth keeping
CACHED_FREE_COLOR = "#FFF6D5"  # free, but still holds a reusable prefix (ref_cnt 0, hash set)
UNKNOWN_OWNER_COLOR = "#555555"  # in use, but in no block table we can see (should not happen)
PREFILL_LEGEND_COLOR = "#7F7F7F"
DECODE_LEGEND_COLOR = "#3F3F3F"
OUTLINE_COLOR = "#222222"


def lighten(color: str, amount: float) -> str:
    """Blend a '#RRGGBB' colour with white: amount 0 keeps it, 1 gives white."""
    r, g, b = plotly.colors.hex_to_rgb(color)
    mix = [round(c + (255 - c) * amount) for c in (r, g, b)]
    return "#{:02X}{:02X}{:02X}".format(*mix)


class RequestColors:
    """request_id -> colour, assigned in order of first sight and never changed.

    Invariant: `self(rid)` returns the same colour for the same id for the object's lifetime;
    the k-th distinct id seen gets `palette[k % len(palette)]`.
    """

    def __init__(self, palette: Sequence[str] = PALETTE):
        if not palette:
            raise ValueError("palette must hold at least one colour")
        self.palette = tuple(palette)
        self._index: dict[str, int] = {}
        self._num_records_seen = 0

    def __call__(self, request_id: str) -> str:
        index = self._index.setdefault(request_id, len(self._index))
        return self.palette[index % len(self.palette)]

    def observe(self, records: Sequence[StepRecord]) -> None:
        """Assign colours to requests in the order the engine first scheduled them.

        Remembers how far it read, so calling it after every step costs only the new records.
        """
        if self._num_records_seen > len(records):  # the trace was cleared: read it again
            self._num_records_seen = 0
        for record in records[self._num_records_seen :]:
            for chunk in record.chunks:
                self(chunk.request_id)
        self._num_records_seen = len(records)
