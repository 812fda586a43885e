"""Write the JSONL files of the noodle-shop lm-evaluation-harness tasks (tests/test_real_clients.py).

    python tests/data/lm_eval_tasks/make_noodle_tasks.py

Every document comes from `minilm_engine.course.noodle_corpus` with seeds the shipped models were
not trained on (their corpus used seed 0, their held-out set seed 1), so the tasks test what
the chef learned, not what it saw:

    noodle_receipt_total.jsonl   generate_until: a receipt up to "Total: $"; the answer is the
                                 exact sum of its lines ("23.50")
    noodle_price_choice.jsonl    multiple_choice: a receipt up to "... @ $" (the unit price of a
                                 menu item) or "Total: $"; four choices, one right
    noodle_chat_price.jsonl      generate_until through chat: a guest asks a price as in the
                                 corpus's dialogues; the answer is the menu price ("$10.50")

The files are committed, so the tests read fixed data; this script says how they were made.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from minilm_engine.course.noodle_corpus import PRICES, make_receipt, money

HERE = Path(__file__).resolve().parent
NUM_DOCS = 16


def receipts(seed: int, count: int) -> list[str]:
    rng = random.Random(seed)
    return [make_receipt(rng) for _ in range(count)]


def receipt_totals(seed: int = 11) -> list[dict]:
    rows = []
    for text in receipts(seed, NUM_DOCS):
        head, tail = text.split("Total: $")
        rows.append({"context": head + "Total: $", "answer": tail.split("\n")[0]})
    return rows


def price_choices(seed: int = 12) -> list[dict]:
    """Half unit prices (a menu item's, learned), half totals (a sum, harder): four choices each."""
    rng = random.Random(seed + 1000)
    rows = []
    for i, text in enumerate(receipts(seed, NUM_DOCS)):
        lines = text.split("\n")
        if i % 2 == 0:  # the first item line's unit price: "2 x Miso Ramen @ $" -> "10.50"
            n = next(j for j, line in enumerate(lines) if " @ $" in line)
            head, price = lines[n].split(" @ $")
            context = "\n".join(lines[:n] + [head + " @ $"])
            right = price.split(" ")[0]
            others = sorted({money(c)[1:] for c in PRICES.values()} - {right})
            wrong = rng.sample(others, 3)
        else:  # the total, against totals 0.50 to 2.00 away
            head, tail = text.split("Total: $")
            context, right = head + "Total: $", tail.split("\n")[0]
            cents = round(float(right) * 100)
            offsets = rng.sample([-200, -150, -100, -50, 50, 100, 150, 200], 3)
            wrong = [money(cents + d)[1:] for d in offsets]
        choices = [right, *wrong]
        rng.shuffle(choices)
        rows.append({"context": context, "choices": choices, "label": choices.index(right)})
    return rows


def chat_prices(seed: int = 13) -> list[dict]:
    rng = random.Random(seed)
    names = rng.sample(sorted(PRICES), NUM_DOCS)
    return [{"question": f"How much is the {name}?", "answer": money(PRICES[name])} for name in names]


def main() -> None:
    for name, rows in (("noodle_receipt_total", receipt_totals()), ("noodle_price_choice", price_choices()),
                       ("noodle_chat_price", chat_prices())):
        path = HERE / f"{name}.jsonl"
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        print(f"wrote {len(rows)} rows to {path}")


if __name__ == "__main__":
    main()
