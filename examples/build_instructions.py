"""The generator of zerokit/data/corpus/tiny_instructions.jsonl: original question/answer chats in the messages
format (arithmetic and simple facts in the tiny corpus's words), seeded, so it is rebuilt bit for bit:

    python examples/build_instructions.py zerokit/data/corpus/tiny_instructions.jsonl
"""
import json
import random
import sys

r = random.Random(1234)
SEASONS = ["spring", "summer", "autumn", "winter"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
TRADES = {"baker": "bread", "miller": "flour", "weaver": "cloth", "smith": "horseshoes and nails", "potter": "pots from clay",
          "carpenter": "tables and chairs from wood", "clockmaker": "clocks", "glazier": "windows of glass",
          "mason": "walls of stone", "cooper": "barrels", "tanner": "leather", "chandler": "candles",
          "cartographer": "maps"}
LEGS = {"fox": 4, "badger": 4, "heron": 2, "otter": 4, "sparrow": 2, "owl": 2, "hare": 4, "deer": 4, "beetle": 6,
        "wren": 2, "falcon": 2, "mole": 4, "stoat": 4, "newt": 4, "swallow": 2, "lark": 2, "crow": 2, "goose": 2,
        "raven": 2, "squirrel": 4, "hedgehog": 4, "moth": 6, "cricket": 6, "dragonfly": 6, "tortoise": 4,
        "lizard": 4, "kingfisher": 2}
KIND = {"fox": "mammal", "badger": "mammal", "heron": "bird", "otter": "mammal", "sparrow": "bird", "owl": "bird",
        "hare": "mammal", "deer": "mammal", "beetle": "insect", "salmon": "fish", "wren": "bird", "falcon": "bird",
        "mole": "mammal", "pike": "fish", "trout": "fish", "moth": "insect", "cricket": "insect", "squirrel": "mammal",
        "crow": "bird", "goose": "bird", "raven": "bird", "hedgehog": "mammal", "dragonfly": "insect"}
NUMBER_WORDS = {2: "two", 4: "four", 6: "six"}
OPPOSITES = {"quiet": "loud", "bright": "dark", "ancient": "new", "narrow": "wide", "gentle": "rough",
             "careful": "careless", "tiny": "enormous", "muddy": "clean", "sunny": "cloudy", "brave": "afraid",
             "honest": "dishonest", "hollow": "solid", "weary": "rested", "proud": "humble", "early": "late",
             "warm": "cold", "heavy": "light", "full": "empty", "open": "closed", "high": "low"}
COLOURS = {"fresh snow": "white", "a clear summer sky": "blue", "spring grass": "green", "coal": "black",
           "a ripe tomato": "red", "the yolk of an egg": "yellow", "a rain cloud": "grey",
           "a fox's coat": "red", "a crow's feathers": "black", "a lemon": "yellow"}
SYSTEM = "You are a careful helper. Answer in one short sentence."
WORDS = ["owl", "lantern", "river", "kettle", "meadow", "harbour", "violin", "compass", "wren", "basket"]


def arithmetic():
    kind = r.randrange(4)
    if kind == 0:
        a, b = r.randint(2, 99), r.randint(2, 99)
        return f"What is {a} plus {b}?", f"{a} plus {b} is {a + b}."
    if kind == 1:
        a, b = sorted((r.randint(2, 99), r.randint(2, 99)), reverse=True)
        return f"What is {a} minus {b}?", f"{a} minus {b} is {a - b}."
    if kind == 2:
        a, b = r.randint(2, 12), r.randint(2, 12)
        return f"What is {a} times {b}?", f"{a} times {b} is {a * b}."
    a, b = r.sample(range(2, 100), 2)
    return f"Which is larger, {a} or {b}?", f"{max(a, b)} is larger than {min(a, b)}."


def fact():
    kind = r.randrange(9)
    if kind == 0:
        s = r.choice(SEASONS)
        return f"Which season comes after {s}?", f"{SEASONS[(SEASONS.index(s) + 1) % 4].capitalize()} comes after {s}."
    if kind == 1:
        d = r.choice(DAYS)
        return f"What day comes after {d}?", f"{DAYS[(DAYS.index(d) + 1) % 7]} comes after {d}."
    if kind == 2:
        t = r.choice(list(TRADES))
        return f"What does a {t} make?", f"A {t} makes {TRADES[t]}."
    if kind == 3:
        a = r.choice(list(LEGS))
        return f"How many legs does a {a} have?", f"A {a} has {NUMBER_WORDS[LEGS[a]]} legs."
    if kind == 4:
        a, k = r.choice(list(KIND)), r.choice(["bird", "fish", "insect", "mammal"])
        yes = KIND[a] == k
        art = lambda w: ("an " if w[0] in "aeiou" else "a ") + w  # noqa: E731 - a one-line helper beside its one use
        return f"Is the {a} {art(k)}?", (f"Yes, the {a} is {art(k)}." if yes else f"No, the {a} is {art(KIND[a])}.")
    if kind == 5:
        w = r.choice(list(OPPOSITES))
        return f"What is the opposite of {w}?", f"The opposite of {w} is {OPPOSITES[w]}."
    if kind == 6:
        c = r.choice(list(COLOURS))
        return f"What colour is {c}?", f"{c[0].upper() + c[1:]} is {COLOURS[c]}."
    if kind == 7:
        n = r.randint(2, 98)
        return f"Is {n} even or odd?", f"{n} is {'even' if n % 2 == 0 else 'odd'}."
    w = r.choice(WORDS)
    return f"How many letters are in the word {w}?", f"The word {w} has {len(w)} letters."


def record():
    pick = arithmetic if r.random() < 0.5 else fact
    q, a = pick()
    messages = []
    if r.random() < 0.2:
        messages.append({"role": "system", "content": SYSTEM})
    messages += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    if r.random() < 0.15:  # a second exchange in the same conversation
        q2, a2 = (arithmetic if r.random() < 0.5 else fact)()
        messages += [{"role": "user", "content": q2}, {"role": "assistant", "content": a2}]
    return messages


seen, lines = set(), []
while len(lines) < 320:
    m = record()
    key = json.dumps(m)
    if key in seen:
        continue
    seen.add(key)
    lines.append(json.dumps({"messages": m}, ensure_ascii=False))
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
