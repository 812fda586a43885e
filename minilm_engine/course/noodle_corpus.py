"""A deterministic generator of English text from one small noodle shop, the Golden Bowl.

The two models this package ships (the chef and its apprentice) were trained on this text and
nothing else. It is regular enough that a tiny draft model guesses most next tokens right (which
speculative decoding needs), with a few things a model has to learn rather than parrot:

* prices come from one fixed menu, so "Miso Ramen @ $" is always followed by "10.50";
* receipts and delivery notes add up: every line is quantity x unit price, the total is the sum;
* a table number, ticket number or order said once comes back later in the same document.

Everything is pure Python driven by one `random.Random(seed)`: the same `(num_documents, seed)`
gives the same text on every machine, so a corpus is described by those two numbers alone.
"""

import random
from dataclasses import dataclass, field

SHOP_NAME = "the Golden Bowl"
SHOP_TITLE = "The Golden Bowl"  # the same name at the start of a line

# name -> price in cents. Money is kept in integer cents so every total is exact.
NOODLE_SOUPS = {
    "Shoyu Ramen": 950, "Miso Ramen": 1050, "Spicy Miso Ramen": 1100, "Tonkotsu Ramen": 1150,
    "Shio Ramen": 900, "Vegetable Ramen": 900, "Beef Noodle Soup": 1200,
    "Chicken Noodle Soup": 950, "Wonton Noodle Soup": 1050, "Pho Bo": 1100, "Curry Laksa": 1250,
    "Kitsune Udon": 900, "Tempura Udon": 1200, "Curry Udon": 1050, "Duck Soba": 1300,
    "Hot and Sour Noodle Soup": 1000,
}
DRY_NOODLES = {
    "Dan Dan Noodles": 1000, "Cold Sesame Noodles": 850, "Zha Jiang Mian": 950, "Zaru Soba": 850,
    "Chow Mein": 900, "Pad See Ew": 1050, "Hand-Pulled Lamb Noodles": 1350,
    "Tomato Egg Noodles": 800, "Garlic Butter Noodles": 850, "Scallion Oil Noodles": 750,
    "Yaki Udon": 1000,
}
SIDES = {
    "Gyoza": 500, "Spring Rolls": 450, "Edamame": 350, "Pickled Cucumber": 300,
    "Steamed Pork Buns": 550, "Seaweed Salad": 400, "Chicken Karaage": 650, "Sesame Balls": 400,
}
DRINKS = {
    "Green Tea": 200, "Jasmine Tea": 250, "Iced Barley Tea": 250, "Lemonade": 300,
    "Plum Juice": 350, "Ginger Soda": 300, "Soy Milk": 250, "Rice Beer": 500,
}
TOPPINGS = {
    "soft-boiled egg": 150, "chashu pork": 250, "bamboo shoots": 100, "corn": 100, "nori": 50,
    "bok choy": 100, "chili oil": 50, "extra noodles": 200, "fried tofu": 150,
    "bean sprouts": 50, "mushrooms": 150, "fried garlic": 50,
}
MENU_SECTIONS = {
    "Noodle soups": NOODLE_SOUPS, "Dry noodles": DRY_NOODLES, "Sides": SIDES, "Drinks": DRINKS,
}
NOODLES = {**NOODLE_SOUPS, **DRY_NOODLES}
PRICES = {**NOODLES, **SIDES, **DRINKS}

NOODLE_STYLES = ["thin noodles", "thick noodles", "wavy noodles", "firm noodles",
                 "soft noodles", "hand-cut noodles"]
SPECIAL_REQUESTS = ["less salty", "extra spicy", "mild", "no scallions", "no cilantro",
                    "broth on the side", "no garlic", "very hot"]
BROTHS = ["pork", "chicken", "miso", "beef", "vegetable", "dashi"]

CUSTOMERS = [
    "Ana", "Ben", "Chen", "Dara", "Elif", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi",
    "Lena", "Mateo", "Nadia", "Omar", "Pia", "Quinn", "Ravi", "Sofia", "Tariq", "Uma", "Victor",
    "Wen", "Ximena", "Yusuf", "Zoe", "Amara", "Bruno", "Carmen", "Dmitri", "Esther", "Felix",
    "Gita", "Hana", "Ivan", "Jade", "Kofi", "Lucia", "Marek", "Noor", "Oscar", "Paula", "Rin",
    "Sven", "Tomoko", "Ugo", "Vera", "Wanjiru", "Yara", "Zhang Wei", "Mr. Park", "Mrs. Kim",
    "Dr. Osei", "Ms. Novak", "Mr. Rossi", "Mrs. Tanaka",
]
WAITERS = ["Sam", "Mina", "Leo", "Priya", "Tomas", "Aiko", "Ben", "Rosa"]
CHEFS = ["Chef Lin", "Chef Okafor", "Chef Haruto", "Chef Maria"]

# supplier -> (item, unit, price in cents per unit); a unit of "" means "count these".
SUPPLIERS = {
    "Green Valley Farms": [("bok choy", "kg", 240), ("scallions", "kg", 300),
                           ("bean sprouts", "kg", 180), ("mushrooms", "kg", 650),
                           ("cilantro", "bunches", 80)],
    "Miller and Sons": [("wheat flour", "kg", 120), ("buckwheat flour", "kg", 310),
                        ("rice noodles", "kg", 260), ("udon noodles", "kg", 340)],
    "Hillside Butchers": [("pork bones", "kg", 180), ("pork belly", "kg", 890),
                          ("chicken thighs", "kg", 720), ("beef shank", "kg", 1150),
                          ("duck breasts", "", 650)],
    "Harbor Fish Market": [("bonito flakes", "bags", 520), ("kombu", "bags", 430),
                           ("shrimp", "kg", 1480)],
    "Lotus Pantry": [("soy sauce", "bottles", 450), ("sesame oil", "bottles", 620),
                     ("miso paste", "tubs", 780), ("chili paste", "jars", 390),
                     ("rice vinegar", "bottles", 350)],
    "Sunrise Eggs": [("eggs", "dozen", 360), ("tofu", "blocks", 150)],
}

WEEKDAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]

SYSTEM_PROMPT = (
    "You are the assistant of the Golden Bowl, a small noodle shop with twelve tables. "
    "House rules: greet every guest, give them a table number and repeat that number when the "
    "food arrives. Write every order as a list, one dish per line, with the quantity first, "
    "and read the order back to the guest before it goes to the kitchen. Noodle soups come "
    "with a choice of thin, thick, wavy, firm or soft noodles; toppings cost extra and are "
    "listed on the menu. Ask about allergies, and tell the kitchen about peanut, sesame, egg "
    "or wheat allergies on the ticket. Never promise a dish that is sold out. Prices are "
    "fixed: use the menu, never guess. A receipt shows each line as quantity times unit "
    "price, then the number of items and the total, and the total must be the exact sum of "
    "the lines. Tips are welcome but never added without asking. The kitchen cooks tickets "
    "in the order they arrive, except that cold dishes and drinks go out at once. We open at "
    "11:00 and close at 22:00, and the last order is taken at 21:30. Be short, polite and "
    "precise.\n"
)


@dataclass
class OrderLine:
    """One line of an order: `quantity` portions of `name`, with optional details/toppings."""

    quantity: int
    name: str
    details: list[str] = field(default_factory=list)
    toppings: list[str] = field(default_factory=list)

    @property
    def unit_cents(self) -> int:
        return PRICES[self.name]


# ---------------------------------------------------------------------------------------------
# Small formatting helpers.

def money(cents: int) -> str:
    """Format integer cents as dollars: 1950 -> "$19.50"."""
    return f"${cents // 100}.{cents % 100:02d}"


def join_words(words: list[str]) -> str:
    """["a"] -> "a", ["a", "b"] -> "a and b", ["a", "b", "c"] -> "a, b and c"."""
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def random_time(rng: random.Random) -> str:
    """A time the shop is open, during lunch (11-14h) or dinner (17-21h), in 5-minute steps."""
    hour = rng.choice([11, 12, 12, 13, 13, 14, 17, 18, 18, 19, 19, 20, 21])
    return f"{hour}:{rng.randrange(0, 60, 5):02d}"


def random_date(rng: random.Random) -> str:
    return f"{rng.choice(WEEKDAYS)} {rng.randint(1, 28)} {rng.choice(MONTHS)}"


def count_words(quantity: int, noun: str) -> str:
    """2, "bowl" -> "two bowls"."""
    word = NUMBER_WORDS[quantity] if quantity < len(NUMBER_WORDS) else str(quantity)
    if quantity != 1:
        noun += "es" if noun.endswith("s") else "s"
    return f"{word} {noun}"


def spoken(line: OrderLine) -> str:
    """How a waiter says an order line: "two bowls of Miso Ramen with corn"."""
    if line.name in NOODLES:
        noun = "bowl"
    elif line.name in SIDES:
        noun = "plate"
    else:
        noun = "cup" if "Tea" in line.name else "glass"
    words = f"{count_words(line.quantity, noun)} of {line.name}"
    if line.toppings:
        words += " with " + join_words(line.toppings)
    return words


def described(line: OrderLine) -> str:
    """A dish with its details for tickets and orders: "Miso Ramen (thick noodles, add corn)"."""
    notes = line.details + (["add " + join_words(line.toppings)] if line.toppings else [])
    return line.name + (f" ({', '.join(notes)})" if notes else "")


def random_order(rng: random.Random, max_dishes: int = 4) -> list[OrderLine]:
    """One to four noodle dishes, maybe some sides and drinks; each name appears once."""
    lines = []
    for name in rng.sample(sorted(NOODLES), rng.randint(1, max_dishes - 1)):
        line = OrderLine(rng.choice([1, 1, 1, 2, 2, 3]), name)
        if rng.random() < 0.4:
            line.details.append(rng.choice(NOODLE_STYLES))
        if rng.random() < 0.3:
            line.details.append(rng.choice(SPECIAL_REQUESTS))
        if rng.random() < 0.45:
            line.toppings = rng.sample(sorted(TOPPINGS), rng.choice([1, 1, 2]))
        lines.append(line)
    for menu_part, chance in ((SIDES, 0.5), (DRINKS, 0.6)):
        if rng.random() < chance:
            lines.append(OrderLine(rng.choice([1, 1, 2]), rng.choice(sorted(menu_part))))
    return lines


# ---------------------------------------------------------------------------------------------
# One function per kind of document. Each takes the shared rng and returns the text.

def make_order(rng: random.Random) -> str:
    table = rng.randint(1, 12)
    lines = random_order(rng)
    notes = [
        f"table {table} wants everything served together.",
        f"table {table} is in a hurry, please cook it first.",
        f"the guest at table {table} is allergic to peanuts.",
        f"bring table {table} extra napkins and chopsticks.",
        f"table {table} is celebrating a birthday.",
    ]
    text = f"Order for table {table}:\n"
    text += "".join(f"- {line.quantity} x {described(line)}\n" for line in lines)
    text += f"Customer: {rng.choice(CUSTOMERS)}\nTime: {random_time(rng)}\n"
    text += f"Total items: {sum(line.quantity for line in lines)}\n"
    if rng.random() < 0.5:
        text += f"Note: {rng.choice(notes)}\n"
    return text


def make_kitchen_ticket(rng: random.Random) -> str:
    ticket, table = rng.randint(100, 999), rng.randint(1, 12)
    food = [line for line in random_order(rng) if line.name not in DRINKS]
    text = f"Kitchen ticket #{ticket}\n"
    text += f"Table {table}, {random_time(rng)}, waiter {rng.choice(WAITERS)}\n"
    for line in food:
        extras = line.details + (["add " + join_words(line.toppings)] if line.toppings else [])
        text += f"{line.quantity} x {line.name}" + (f": {', '.join(extras)}" if extras else "")
        text += "\n"
    text += f"Dishes to cook: {sum(line.quantity for line in food)}\n"
    text += f"{rng.choice(CHEFS)}: ticket #{ticket} is ready for table {table}.\n"
    return text


def make_receipt(rng: random.Random) -> str:
    number, table = rng.randint(1000, 9999), rng.randint(1, 12)
    lines = random_order(rng)
    text = f"Receipt #{number}\n{SHOP_TITLE}, table {table}\n"
    text += f"{random_date(rng)}, {random_time(rng)}\nServed by {rng.choice(WAITERS)}\n"
    total, num_items = 0, 0
    for line in lines:
        amount = line.quantity * line.unit_cents
        text += f"{line.quantity} x {line.name} @ {money(line.unit_cents)} = {money(amount)}\n"
        total, num_items = total + amount, num_items + line.quantity
        for topping in line.toppings:
            amount = line.quantity * TOPPINGS[topping]
            text += (f"  + {line.quantity} x {topping} @ {money(TOPPINGS[topping])}"
                     f" = {money(amount)}\n")
            total += amount
    text += f"Items: {num_items}\nTotal: {money(total)}\n"
    text += f"Paid by {rng.choice(['card', 'card', 'cash', 'phone'])}. "
    text += f"Thank you, see you again at table {table}!\n"
    return text


def make_menu(rng: random.Random) -> str:
    text = f"{SHOP_TITLE} - menu for {rng.choice(WEEKDAYS)}\n"
    for section, dishes in MENU_SECTIONS.items():
        chosen = set(rng.sample(sorted(dishes), rng.randint(3, min(7, len(dishes)))))
        text += f"{section}:\n"
        # Keep the menu's own order so the same dish tends to follow the same dish.
        text += "".join(f"- {name} {money(cents)}\n" for name, cents in dishes.items()
                        if name in chosen)
    toppings = rng.sample(sorted(TOPPINGS), 4)
    text += "Toppings, each: " + ", ".join(f"{t} {money(TOPPINGS[t])}" for t in toppings) + "\n"
    dish, topping = rng.choice(sorted(NOODLES)), rng.choice(sorted(TOPPINGS))
    text += (f"Chef's special: {dish} with {topping}, "
             f"{money(NOODLES[dish] + TOPPINGS[topping])}.\n")
    text += "Open 11:00 to 22:00, last order at 21:30.\n"
    return text


def make_dialogue(rng: random.Random) -> str:
    waiter, guest, table = rng.choice(WAITERS), rng.choice(CUSTOMERS), rng.randint(1, 12)
    time = random_time(rng)
    greeting = "Good afternoon" if int(time.split(":")[0]) < 17 else "Good evening"
    num_guests = rng.choice([1, 2, 2, 3, 4])
    lines = random_order(rng)
    text = f"{waiter}: {greeting} and welcome to {SHOP_NAME}! How many of you today?\n"
    text += f"{guest}: {NUMBER_WORDS[num_guests].capitalize()}, please.\n"
    text += f"{waiter}: Please follow me, table {table} is free by the window.\n"
    if rng.random() < 0.5:
        tip = rng.choice(sorted(NOODLES))
        text += f"{guest}: What do you recommend?\n"
        text += f"{waiter}: The {tip} is very good today. It is {money(NOODLES[tip])}.\n"
    if rng.random() < 0.3:
        asked = rng.choice(sorted(PRICES))
        text += f"{guest}: How much is the {asked}?\n"
        text += f"{waiter}: The {asked} is {money(PRICES[asked])}.\n"
    order_words = join_words([spoken(line) for line in lines])
    text += f"{guest}: {'I' if num_guests == 1 else 'We'} would like {order_words}.\n"
    if rng.random() < 0.3:
        text += f"{waiter}: Any allergies I should tell the kitchen about?\n"
        text += f"{guest}: " + rng.choice(["No, thank you.", "Yes, no peanuts please.",
                                           "One of us cannot eat sesame."]) + "\n"
    text += f"{waiter}: So that is {order_words} "
    text += f"for table {table}. It will be ready in about {rng.choice([5, 10, 15])} minutes.\n"
    if rng.random() < 0.5:
        total = sum(line.quantity * (line.unit_cents + sum(TOPPINGS[t] for t in line.toppings))
                    for line in lines)
        text += f"{guest}: Can we have the bill, please?\n"
        text += f"{waiter}: Of course. Table {table}, that is {money(total)} in total.\n"
    return text


def make_diary(rng: random.Random) -> str:
    supplier = rng.choice(sorted(SUPPLIERS))
    item = rng.choice(SUPPLIERS[supplier])[0]
    table, dish = rng.randint(1, 12), rng.choice(sorted(NOODLES))
    sentences = [
        f"A busy {rng.choice(['lunch', 'dinner'])}: we served {rng.randint(30, 180)} bowls, "
        f"and the favourite was the {dish}.",
        f"The {rng.choice(BROTHS)} broth ran out at {random_time(rng)}, "
        f"so {rng.choice(CHEFS)} started a new pot.",
        f"Table {table} waited {rng.choice([15, 20, 25, 30])} minutes for their {dish}, "
        f"so we gave table {table} free {rng.choice(sorted(SIDES))}.",
        f"{rng.choice(CUSTOMERS)} came back again and ordered the {rng.choice(sorted(NOODLES))} "
        f"with {rng.choice(sorted(TOPPINGS))}, as always.",
        f"{rng.choice(WAITERS)} dropped a tray of {rng.choice(sorted(DRINKS))} near table "
        f"{rng.randint(1, 12)}. Nobody was hurt.",
        f"Rain all afternoon, only {rng.randint(5, 30)} guests came in.",
        f"We sold out of {rng.choice(sorted(SIDES))} by {random_time(rng)}.",
        f"{rng.choice(CHEFS)} tried a new recipe for the {rng.choice(sorted(NOODLES))}, "
        f"and the regulars liked it.",
        f"Cash in the drawer at closing: {money(rng.randint(200, 1500) * 100)}.",
    ]
    chosen = rng.sample(sentences, rng.randint(2, 5))
    chosen.append(f"Tomorrow: order more {item} from {supplier}.")
    separator = rng.choice([" ", "\n"])
    return f"Shop diary, {random_date(rng)}\n" + separator.join(chosen) + "\n"


def make_delivery(rng: random.Random) -> str:
    supplier = rng.choice(sorted(SUPPLIERS))
    items = rng.sample(SUPPLIERS[supplier], rng.randint(1, min(4, len(SUPPLIERS[supplier]))))
    note = f"D-{rng.randint(100, 999)}"
    text = f"Delivery note {note}\nFrom: {supplier}\nTo: the kitchen of {SHOP_NAME}\n"
    text += f"{random_date(rng)}, {rng.choice(['07', '08', '09'])}:{rng.randrange(0, 60, 15):02d}\n"
    total = 0
    for name, unit, unit_cents in items:
        quantity = rng.randint(2, 20)
        amount = quantity * unit_cents
        total += amount
        amount_text = f"{quantity} {unit} {name}" if unit else f"{quantity} {name}"
        text += f"- {amount_text} @ {money(unit_cents)} = {money(amount)}\n"
    text += f"Total due: {money(total)}\n"
    text += f"Received by {rng.choice(CHEFS)}. Note {note} is to be paid within 30 days.\n"
    return text


# kind -> (maker, weight). Dialogues and receipts are the most common, as in a real shop.
_MAKERS = {
    "order": (make_order, 2),
    "kitchen_ticket": (make_kitchen_ticket, 2),
    "dialogue": (make_dialogue, 3),
    "receipt": (make_receipt, 3),
    "menu": (make_menu, 1),
    "diary": (make_diary, 2),
    "delivery": (make_delivery, 1),
}
DOCUMENT_KINDS = tuple(_MAKERS)


def make_document(kind: str, rng: random.Random) -> str:
    """One document of the given kind (one of `DOCUMENT_KINDS`), drawn with `rng`."""
    if kind not in _MAKERS:
        raise ValueError(f"unknown document kind {kind!r}; expected one of {DOCUMENT_KINDS}")
    return _MAKERS[kind][0](rng)


SYSTEM_PROMPT_RATE = 0.05  # share of documents that start with the house rules


def generate_documents(num_documents: int, seed: int = 0) -> list[str]:
    """Return `num_documents` noodle-shop documents; the same arguments give the same text.

    Kinds are mixed at random (see `DOCUMENT_KINDS`); each document ends with a newline and is
    a few lines to a few hundred tokens long. Training joins them with an end-of-text token.
    One document in twenty starts with `SYSTEM_PROMPT`, so a model trained on the corpus
    continues "house rules + opening line" prompts (the shared prefix of the prefix-caching
    chapters) as well as bare openings.
    """
    if num_documents < 0:
        raise ValueError(f"num_documents must be >= 0, got {num_documents}")
    rng = random.Random(seed)
    kinds = list(_MAKERS)
    weights = [weight for _, weight in _MAKERS.values()]
    documents = []
    for _ in range(num_documents):
        prefix = SYSTEM_PROMPT if rng.random() < SYSTEM_PROMPT_RATE else ""
        documents.append(prefix + make_document(rng.choices(kinds, weights)[0], rng))
    return documents


def sample_prompts(num_prompts: int, seed: int = 0) -> list[str]:
    """Return realistic prompts: the first line (newline included) of generated documents.

    For example "Order for table 7:\n", "Receipt #1042\n" or a waiter's greeting. They are
    the openings of `generate_documents(num_prompts, seed)` (without the house rules some of
    those start with; prepend `SYSTEM_PROMPT` for a shared-prefix workload), so a model
    trained on the corpus knows how to continue them.
    """
    prompts = []
    for doc in generate_documents(num_prompts, seed):
        doc = doc.removeprefix(SYSTEM_PROMPT)
        prompts.append(doc[: doc.index("\n") + 1])
    return prompts


# The engine ships a fixed sample of the corpus (it never imports the course): `bench serve`'s
# "noodle" dataset draws from it, and AWQ calibrates on its held-out documents by default.
SHIPPED_SAMPLE_SEED = 20261203
NUM_SHIPPED_DOCUMENTS = 512
CALIBRATION_SEED = 2  # the documents AWQ calibrates on by default (model/quantization/calibration.py)
NUM_CALIBRATION_DOCUMENTS = 64


def shipped_sample() -> dict[str, list[str]]:
    """What `minilm_engine/checkpoints/noodle_corpus_sample.json` holds (a test keeps them equal):
    documents and their opening lines for the bench, and the default calibration documents."""
    return {
        "documents": generate_documents(NUM_SHIPPED_DOCUMENTS, seed=SHIPPED_SAMPLE_SEED),
        "prompts": sample_prompts(NUM_SHIPPED_DOCUMENTS, seed=SHIPPED_SAMPLE_SEED),
        "calibration": generate_documents(NUM_CALIBRATION_DOCUMENTS, seed=CALIBRATION_SEED),
    }


def write_shipped_sample(path) -> None:
    import json
    from pathlib import Path

    Path(path).write_text(json.dumps(shipped_sample(), indent=0, ensure_ascii=False) + "\n")
