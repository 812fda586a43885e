"""Chapter 00's ledger: what a token costs, measured on the engine, and a receipt that must add up.

Contract: the cost functions are plain arithmetic on numbers the caller gives (prices in any
currency per hour, speeds in tokens per second) and validate them; `measure_throughput` runs
the package's real `LLM.generate` and returns what it saw; `measure_throughput_rounds` times
several ways of serving in alternating rounds, so that they can be compared with a spread.  Nothing here changes the engine.

The whole economics of serving fits in one division, the noodle shop's and the GPU's alike:

    cost per bowl  = monthly cost of the shop / bowls sold     (12 yuan = 120,000 / 10,000 bowls)
    cost per token = cost of the machine      / tokens it produced

    cost per million tokens = price per hour / (tokens per second * 3600) * 1,000,000

The numerator is the hardware's price: fixed once you rent it.  The denominator is throughput,
and every chapter after this one is a way to make it larger on the same machine.
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

from minilm_engine.course.noodle_corpus import PRICES, TOPPINGS
from minilm_engine.core.sampling_params import SamplingParams

SECONDS_PER_HOUR = 3600
TOKENS_PER_MILLION = 1_000_000


def _check_positive(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError(f"{name} must be a positive number, got {value!r}")
        if math.isinf(value):
            raise ValueError(f"{name} must be finite, got {value!r}")


# -- the ledger ------------------------------------------------------------------------------


def unit_cost(total_cost: float, num_units: float) -> float:
    """Cost of one unit: what was spent divided by what was sold (bowls, tokens, ...)."""
    _check_positive(total_cost=total_cost, num_units=num_units)
    return total_cost / num_units


def cost_per_million_tokens(price_per_hour: float, tokens_per_second: float) -> float:
    """What one million generated tokens cost on a machine rented at `price_per_hour`,
    producing `tokens_per_second` (in the currency of the price)."""
    _check_positive(price_per_hour=price_per_hour, tokens_per_second=tokens_per_second)
    tokens_per_hour = tokens_per_second * SECONDS_PER_HOUR
    return price_per_hour / tokens_per_hour * TOKENS_PER_MILLION


def tokens_per_second_needed(price_per_hour: float, cost_per_million: float) -> float:
    """The throughput at which a machine rented at `price_per_hour` produces a million tokens
    for `cost_per_million`: the inverse of `cost_per_million_tokens`."""
    _check_positive(price_per_hour=price_per_hour, cost_per_million=cost_per_million)
    return price_per_hour / cost_per_million * TOKENS_PER_MILLION / SECONDS_PER_HOUR


def cost_table(
    tokens_per_second: dict[str, float], prices_per_hour: dict[str, float]
) -> list[dict[str, float | str]]:
    """One row per measured setup: its tokens/s, then its cost per million tokens at each price.

    `tokens_per_second`: setup name -> measured speed; `prices_per_hour`: column name -> price.
    """
    rows: list[dict[str, float | str]] = []
    for setup, speed in tokens_per_second.items():
        row: dict[str, float | str] = {"setup": setup, "tokens/s": speed}
        for label, price in prices_per_hour.items():
            row[label] = cost_per_million_tokens(price, speed)
        rows.append(row)
    return rows


# -- measuring the denominator ---------------------------------------------------------------


@dataclass(frozen=True)
class Throughput:
    """What one timed `generate` call produced, and how fast."""

    num_requests: int
    num_prompt_tokens: int
    num_output_tokens: int
    elapsed_s: float  # wall clock of the whole call (measure_throughput: the fastest of its repeats)
    mean_tpot_s: float | None  # mean time per output token seen by one request

    @property
    def output_tokens_per_s(self) -> float:
        """Generated tokens per second: the denominator of the cost per token."""
        return self.num_output_tokens / self.elapsed_s

    @property
    def total_tokens_per_s(self) -> float:
        """Prompt and generated tokens per second (what some dashboards report)."""
        return (self.num_prompt_tokens + self.num_output_tokens) / self.elapsed_s

    @property
    def tokens_per_s_per_request(self) -> float | None:
        """The speed one user sees while streaming: 1 / time per output token."""
        return None if not self.mean_tpot_s else 1.0 / self.mean_tpot_s


def measure_throughput(
    llm, prompts: list[str], max_tokens: int, one_at_a_time: bool = False, num_repeats: int = 1
) -> Throughput:
    """Generate `max_tokens` tokens (greedy, EOS ignored) for every prompt and time it.

    `one_at_a_time=True` sends the prompts one after the other (batch size 1, the chef cooking
    one bowl at a time); False hands them all to the engine at once, which batches them as its
    strategy allows.  The fastest of `num_repeats` runs is kept: on a shared machine, noise
    only ever adds time.
    """
    if not prompts:
        raise ValueError("prompts must not be empty")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive int, got {max_tokens!r}")
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    batches = [[p] for p in prompts] if one_at_a_time else [list(prompts)]
    best = None
    for _ in range(num_repeats):
        outputs = []
        start = time.perf_counter()
        for batch in batches:
            outputs += llm.generate(batch, params, use_tqdm=False)
        elapsed = time.perf_counter() - start
        if best is None or elapsed < best[0]:
            best = (elapsed, outputs)
    elapsed, outputs = best
    tpots = [o.metrics.tpot for o in outputs if o.metrics is not None and o.metrics.tpot]
    return Throughput(
        num_requests=len(outputs),
        num_prompt_tokens=sum(len(o.prompt_token_ids) for o in outputs),
        num_output_tokens=sum(len(o.outputs[0].token_ids) for o in outputs),
        elapsed_s=elapsed,
        mean_tpot_s=sum(tpots) / len(tpots) if tpots else None,
    )


def measure_throughput_rounds(
    llm, setups: dict[str, tuple[list[str], bool]], max_tokens: int, num_repeats: int = 5
) -> dict[str, list[Throughput]]:
    """Time several ways of serving side by side: `setups` maps a name to (prompts,
    one_at_a_time), each as in `measure_throughput`.  Every round runs each setup once, in an
    order rotated round by round, so drift on a shared machine hits every setup alike; returns
    name -> one `Throughput` per round.  Compare two setups with the paired ratios of their
    rounds (`teaching.claims.Measurement.ratio`), not with one run of each."""
    if not setups:
        raise ValueError("setups must not be empty")
    if isinstance(num_repeats, bool) or not isinstance(num_repeats, int) or num_repeats < 1:
        raise ValueError(f"num_repeats must be a positive int, got {num_repeats!r}")
    names = list(setups)
    runs: dict[str, list[Throughput]] = {name: [] for name in names}
    for round_index in range(num_repeats):
        shift = round_index % len(names)
        for name in names[shift:] + names[:shift]:
            prompts, one_at_a_time = setups[name]
            runs[name].append(measure_throughput(llm, prompts, max_tokens, one_at_a_time=one_at_a_time))
    return runs


def median_run(runs: list[Throughput]) -> Throughput:
    """The run of median wall time (the lower middle one for an even count): a real run, so
    its tokens, time and time per token belong together."""
    if not runs:
        raise ValueError("runs must not be empty")
    return sorted(runs, key=lambda r: r.elapsed_s)[(len(runs) - 1) // 2]


# -- a receipt that must add up --------------------------------------------------------------

# "2 x Miso Ramen @ $10.50 = $21.00"  and the topping lines "  + 2 x corn @ $1.00 = $2.00"
_LINE = re.compile(r"^(\s*\+\s*)?(\d+) x (.+?) @ \$(\d+)\.(\d\d) = \$(\d+)\.(\d\d)\s*$")
_ITEMS = re.compile(r"^Items: (\d+)\s*$")
_TOTAL = re.compile(r"^Total: \$(\d+)\.(\d\d)\s*$")


@dataclass(frozen=True)
class ReceiptLine:
    quantity: int
    name: str
    unit_cents: int
    amount_cents: int
    is_topping: bool

    @property
    def menu_cents(self) -> int | None:
        """The menu's price for this item, or None if the menu has no such item."""
        return (TOPPINGS if self.is_topping else PRICES).get(self.name)

    @property
    def arithmetic_ok(self) -> bool:
        return self.quantity * self.unit_cents == self.amount_cents


@dataclass(frozen=True)
class ReceiptAudit:
    """A receipt the model wrote, checked line by line like a bookkeeper would."""

    lines: list[ReceiptLine]
    stated_items: int | None
    stated_total_cents: int | None

    @property
    def counted_items(self) -> int:
        return sum(line.quantity for line in self.lines if not line.is_topping)

    @property
    def summed_total_cents(self) -> int:
        return sum(line.amount_cents for line in self.lines)

    @property
    def problems(self) -> list[str]:
        """Everything that does not add up, in words; empty when the receipt is right."""
        found = []
        if not self.lines:
            found.append("no priced lines found")
        for line in self.lines:
            unit, amount = line.unit_cents / 100, line.amount_cents / 100
            if not line.arithmetic_ok:
                found.append(f"{line.quantity} x {unit:.2f} != {amount:.2f} ({line.name})")
            if line.menu_cents is None:
                found.append(f"{line.name!r} is not on the menu")
            elif line.menu_cents != line.unit_cents:
                menu = line.menu_cents / 100
                found.append(f"{line.name} costs {menu:.2f} on the menu, not {unit:.2f}")
        if self.stated_items is None:
            found.append("no 'Items:' line")
        elif self.stated_items != self.counted_items:
            found.append(f"Items: {self.stated_items} stated, {self.counted_items} counted")
        if self.stated_total_cents is None:
            found.append("no 'Total:' line")
        elif self.stated_total_cents != self.summed_total_cents:
            found.append(
                f"Total: {self.stated_total_cents / 100:.2f} stated, "
                f"{self.summed_total_cents / 100:.2f} summed"
            )
        return found

    @property
    def adds_up(self) -> bool:
        return not self.problems


def audit_receipt(text: str) -> ReceiptAudit:
    """Parse a Golden Bowl receipt (the corpus's format) and collect what it claims."""
    lines, items, total = [], None, None
    for raw in text.splitlines():
        if m := _LINE.match(raw):
            topping, qty, name, unit_d, unit_c, amt_d, amt_c = m.groups()
            lines.append(
                ReceiptLine(
                    quantity=int(qty),
                    name=name,
                    unit_cents=int(unit_d) * 100 + int(unit_c),
                    amount_cents=int(amt_d) * 100 + int(amt_c),
                    is_topping=topping is not None,
                )
            )
        elif m := _ITEMS.match(raw):
            items = int(m.group(1))
        elif m := _TOTAL.match(raw):
            total = int(m.group(1)) * 100 + int(m.group(2))
    return ReceiptAudit(lines, items, total)


# -- the picture -----------------------------------------------------------------------------


def throughput_figure(results: dict[str, Throughput], price_per_hour: float, currency: str = "$"):
    """Bars of tokens/s per setup, with the cost per million tokens at `price_per_hour` on top."""
    import plotly.graph_objects as go

    names = list(results)
    speeds = [results[n].output_tokens_per_s for n in names]
    costs = [cost_per_million_tokens(price_per_hour, s) for s in speeds]
    fig = go.Figure(
        go.Bar(
            x=names,
            y=speeds,
            text=[f"{currency}{c:.3g} / M tokens" for c in costs],
            textposition="outside",
            marker_color="#E45756",
        )
    )
    fig.update_layout(
        title=f"Same machine, same hourly price ({currency}{price_per_hour:.2f}/h): "
        "more bowls at once, cheaper bowls",
        yaxis_title="generated tokens / s",
        xaxis_title="how the requests were served",
        height=420,
        margin=dict(t=60),
    )
    fig.update_yaxes(range=[0, max(speeds) * 1.2])
    return fig
