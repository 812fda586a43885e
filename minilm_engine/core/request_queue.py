"""Who goes first: the scheduling policy, as vLLM names it (`--scheduling-policy fcfs|priority`).

Contract: a `RequestOrder` ranks requests for one scheduler: `(priority, arrival)` from when it
arrives, lower first (vLLM's convention: 0 is the default, negative numbers are allowed):

    fcfs       the rank is ignored: running requests in the order they were admitted, then the
               waiting queue oldest first; a preempted request goes back to the queue's front
    priority   both lists are kept sorted by rank and the step walks them merged
               (`schedule_step.py`): interactive work (priority 0) before batch work (a large
               priority), the last in rank preempted first, and a full batch gives its
               last-ranked seat to a waiting request that outranks it (vLLM v0's rule)
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import MutableSequence

from minilm_engine.core.request import Request

SCHEDULING_POLICIES = ("fcfs", "priority")


class RequestOrder:
    """Ranks of the requests one scheduler holds; `rank(r) < rank(s)`: r goes before s."""

    def __init__(self, policy: str = "fcfs"):
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {SCHEDULING_POLICIES}, got {policy!r}")
        self.policy = policy
        self._ranks: dict[str, tuple[int, int]] = {}
        self._arrivals = itertools.count()  # a counter, not a clock: two arrivals never tie

    @property
    def by_priority(self) -> bool:
        return self.policy == "priority"

    def arrive(self, request: Request) -> None:
        self._ranks[request.request_id] = (request.priority, next(self._arrivals))

    def leave(self, request: Request) -> None:
        self._ranks.pop(request.request_id, None)

    def rank(self, request: Request) -> tuple[int, int]:
        """(priority, arrival number): the order requests are served in under "priority"."""
        return self._ranks[request.request_id]

    def place(self, queue: MutableSequence[Request], request: Request) -> None:
        """Add a request to the running list or the waiting queue: at the end, or at its rank."""
        if self.by_priority:
            bisect.insort(queue, request, key=self.rank)
        else:
            queue.append(request)

    def requeue(self, waiting: deque[Request], request: Request) -> None:
        """A preempted request back into the waiting queue: at the front (fcfs: it is older than
        everyone waiting), or at its rank (priority)."""
        if self.by_priority:
            bisect.insort(waiting, request, key=self.rank)
        else:
            waiting.appendleft(request)
