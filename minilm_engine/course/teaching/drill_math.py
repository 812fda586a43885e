"""Arithmetic behind chapter 09's drills on queueing, sampling, formats and capacity planning.

Contract: pure functions of their arguments (no model shapes: those are in `drills.py`), each the
formula a worked derivation in chapter 09 writes out; `drills.FORMULAS` names them for the bank.

    erlang_c             M/M/c: probability an arrival has to wait (all c servers busy)
    mmc_wait_s           M/M/c: mean time in the queue, C(c, a) / (c mu - lambda)
    mmc_max_rate         the highest arrival rate whose mean queueing wait stays under a target
    tail_samples         samples needed to have k of them above a quantile (k / (1 - q))
    max_exceeds_pct      probability that the maximum of n samples lies above the q-quantile
    scaled_bits          bits per element of a block-scaled format (element bits + scale / block)
    accuracy_ci_pts      half-width of a 95% interval of an accuracy measured on n items
    spot_cost            what a useful hour costs on capacity that is interrupted
"""

from __future__ import annotations

import math


def erlang_c(servers: int, offered_load: float) -> float:
    """P(wait) in M/M/c with `offered_load` a = lambda / mu (< servers), by the stable recurrence
    of Erlang B: B(0) = 1, B(k) = a B(k-1) / (k + a B(k-1)); C = B / (1 - rho (1 - B))."""
    if servers < 1 or offered_load < 0:
        raise ValueError(f"need servers >= 1 and a load >= 0, got {servers}, {offered_load}")
    rho = offered_load / servers
    if rho >= 1:
        return 1.0
    b = 1.0
    for k in range(1, servers + 1):
        b = offered_load * b / (k + offered_load * b)
    return b / (1 - rho * (1 - b))


def mmc_wait_s(rate_per_s: float, service_s: float, servers: int) -> float:
    """Mean wait in the queue (before service) of M/M/c; inf at or past saturation."""
    mu = 1 / service_s
    if rate_per_s >= servers * mu:
        return math.inf
    return erlang_c(servers, rate_per_s * service_s) / (servers * mu - rate_per_s)


def mmc_max_rate(service_s: float, servers: int, max_wait_s: float) -> float:
    """The highest arrival rate whose mean queueing wait is at most `max_wait_s` (bisection: the
    wait grows with the rate)."""
    lo, hi = 0.0, servers / service_s
    for _ in range(80):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if mmc_wait_s(mid, service_s, servers) <= max_wait_s else (lo, mid)
    return lo


def tail_samples(quantile_pct: float, tail_count: int) -> float:
    """Samples needed so that about `tail_count` of them lie above the quantile."""
    return tail_count / (1 - quantile_pct / 100)


def max_exceeds_pct(quantile_pct: float, num_samples: int) -> float:
    """P(max of n independent samples > the q-quantile) = 1 - q^n, in percent."""
    return 100 * (1 - (quantile_pct / 100) ** num_samples)


def scaled_bits(element_bits: float, scale_bits: float, block: int, tensor_scale_bits: float = 0.0,
                tensor_elements: int | None = None) -> float:
    """Bits per element of a block-scaled format: the element, plus one scale per `block`
    elements (plus a per-tensor scale, negligible for a real tensor)."""
    extra = tensor_scale_bits / tensor_elements if tensor_elements else 0.0
    return element_bits + scale_bits / block + extra


def accuracy_ci_pts(accuracy_pct: float, num_items: int) -> float:
    """Half-width, in accuracy points, of the normal-approximation 95% interval on n items."""
    p = accuracy_pct / 100
    return 100 * 1.96 * math.sqrt(p * (1 - p) / num_items)


def spot_cost(spot_price: float, interruptions_per_hour: float, lost_minutes: float) -> float:
    """Price of one useful hour on interrupted capacity: each interruption loses `lost_minutes`
    (restart, reload the weights, warm the cache, redo lost work)."""
    useful = 1 - interruptions_per_hour * lost_minutes / 60
    if useful <= 0:
        raise ValueError("the capacity is interrupted more than it works")
    return spot_price / useful
