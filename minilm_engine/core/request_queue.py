"""Who goes first: the scheduling policy, as vLLM names it (`--scheduling-policy fcfs|priority`).

Contract: a `RequestOrder` ranks requests for one scheduler.  Every request gets a rank when it
arrives, `(priority, arrival)`, lower first (vLLM's convention: priority 0 is the default, a
smaller number is served earlier, negative numbers are allowed).  The policy decides what the
rank is used for:

    fcfs       the rank is ignored: running requests in the order they were admitted, then the
               waiting queue oldest first; a preempted request goes back to the queue's front
               (the engine's behaviour before tiers, unchanged)
    priority   both lists are kept sorted by rank, and one step hands out its token budget down
               the ranks across them: a waiting interactive request (priority 0) is admitted
               before a running batch request (a large priority) gets its tokens; the
               request preempted when the pool is full is the last in rank (vLLM's rule:
               the largest (priority, arrival)); and when every seat (max_num_seqs) is
               taken, the last-ranked running request gives its seat to a waiting request
               that outranks it (vLLM v0's priority preemption), to be recomputed later

`place(queue, request)` puts a request where the policy wants it: at the end (fcfs), or at its
rank (priority); `requeue` puts a preempted one back.
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

    def goes_before(self, a: Request, b: Request) -> bool:
        """Whether `a` takes its share of a step before `b` does (never, under fcfs: running
        requests always go before waiting ones)."""
        return self.by_priority and self.rank(a) < self.rank(b)

    def place(self, queue: MutableSequence[Request], request: Request) -> None:
        """Add a request to the running list or the waiting queue."""
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
