"""Build zerokit's bundled tiny corpus and its BPE tokenizer (vocab exactly 2048). No downloads.

The corpus is original text generated here from a small probabilistic grammar (a deterministic seed),
so it is free of any license question and is rebuilt bit for bit by running this script:

    python examples/build_tokenizer.py            # writes zerokit/data/corpus/ and zerokit/data/tokenizer/

Outputs:
    zerokit/data/corpus/tiny_corpus.txt            one short "document" per line, ~150 KB
    zerokit/data/tokenizer/tokenizer.json          byte-level BPE trained with the `tokenizers` library
    zerokit/data/tokenizer/tokenizer_config.json   loadable with transformers.AutoTokenizer
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 2048
EOS, PAD, BOS = "<|endoftext|>", "<|pad|>", "<|bos|>"

NAMES = """Ada Bram Cora Dunstan Elsa Fenwick Greta Hollis Ines Jasper Kira Leopold Mira Nestor Opal Perrin Quill
Rosalind Silas Tamsin Ulric Vera Wendell Xenia Yorick Zelda Aldous Bettina Cosmo Delphine Evander Flora Gideon Hester
Ignatius Juno Kasimir Lorna Magnus Nerys Oswin Petra Quentin Rhoda Sebastian Thea Umberto Violetta Wilhelmina Yusuf""".split()
PLACES = """Amberly Brackenford Coldwater Dunmere Eastholm Fallowdale Greywick Harrowgate Ivybridge Juniper Kestrel
Larkspur Millbrook Northcombe Oakhaven Pennyfield Quarrystone Ravensmoor Saltmarsh Thornbury Underhill Valemont
Westerly Yarrowby Zephyr Ashgrove Birchwood Copperhill Dovecote Elmstead Foxhollow Glenrock Hawthorne Ironbridge""".split()
ANIMALS = """fox badger heron otter sparrow owl hare deer beetle salmon wren falcon mole stoat pike newt swallow
lark crow goose raven squirrel hedgehog trout moth cricket dragonfly tortoise lizard kingfisher""".split()
OBJECTS = """lantern kettle compass ladder basket spindle anchor bell candle chisel drum flute hammer jar key loom map
needle oar pail quill rope saddle telescope umbrella violin wagon barrel clock mirror shovel teapot tapestry
notebook pencil bicycle engine bridge tower window garden orchard meadow harbour library workshop mill""".split()
ADJECTIVES = """small quiet bright ancient narrow golden silver hollow crooked gentle patient stubborn curious clever
weary cheerful careful restless distant tangled polished broken faded sturdy tiny enormous muddy frosty sunny windy
cloudy humble proud nervous brave honest secret forgotten""".split()
VERBS_PAST = """found carried repaired painted followed counted mended watched opened closed lifted buried polished
borrowed returned discovered measured crossed climbed visited described remembered traded sketched tuned""".split()
VERBS_PRESENT = """flows winds climbs falls turns rises bends drifts narrows widens""".split()
DIRECTIONS = "north south east west northeast northwest southeast southwest".split()
SEASONS = "spring summer autumn winter".split()
TIMES = "morning noon afternoon evening midnight dawn dusk".split()
MATERIALS = "oak pine copper brass iron glass clay wool linen stone slate willow".split()
COLOURS = "red blue green amber grey white black violet ochre teal crimson".split()
TRADES = """baker miller weaver smith potter carpenter fisher shepherd clockmaker glazier mason cooper tanner
chandler cartographer librarian gardener ferryman""".split()


PREFIXES = """Ash Bel Cal Dor Ed Fal Gar Hal Is Jor Kel Lin Mar Nor Or Pel Quen Ros Sel Tor Ul Var Wil Yer Zan
Bran Cres Dun Elm Fen Glen Hart Kings Lang Mere Nether Pem Red Stan Thorn""".split()
SUFFIXES = """by ford wick ton ham stead dale mere worth field bury combe leigh thorpe holm gate haven moor shaw
brook well ridge wood ley croft""".split()


def _invented_place(r: random.Random) -> str:
    return r.choice(PREFIXES) + r.choice(SUFFIXES)


def _sentence(r: random.Random) -> str:
    kind = r.randrange(9)
    n, a = r.choice(NAMES), r.choice(ANIMALS)
    p = r.choice(PLACES) if r.random() < 0.5 else _invented_place(r)
    o, adj, v = r.choice(OBJECTS), r.choice(ADJECTIVES), r.choice(VERBS_PAST)
    if kind == 0:
        return f"{n} the {r.choice(TRADES)} {v} a {adj} {o} near {p}."
    if kind == 1:
        return (f"The river {p} {r.choice(VERBS_PRESENT)} {r.choice(DIRECTIONS)} for {r.randint(3, 480)} "
                f"kilometres before it reaches {_invented_place(r)}.")
    if kind == 2:
        return f"In {r.choice(SEASONS)} the {adj} {a} of {p} sleeps under the {r.choice(OBJECTS)}."
    if kind == 3:
        return (f"At {r.choice(TIMES)}, {n} counted {r.randint(2, 99)} {a}s and {r.randint(2, 99)} "
                f"{r.choice(ANIMALS)}s by the {r.choice(OBJECTS)}.")
    if kind == 4:
        return f"The {r.choice(COLOURS)} {o} was made of {r.choice(MATERIALS)} in the year {r.randint(1201, 1999)}."
    if kind == 5:
        x, y = r.randint(2, 60), r.randint(2, 60)
        return f"{n} added {x} and {y} and wrote {x + y} on the {r.choice(COLOURS)} {o}."
    if kind == 6:
        return f"\"Where is my {o}?\" asked {n}. \"It is in {p}, behind the {adj} {r.choice(OBJECTS)},\" said {r.choice(NAMES)}."
    if kind == 7:
        return f"Every {r.choice(SEASONS)} the people of {p} hold a fair where the {a} is the guest of honour."
    return f"{n} {v} the {adj} {o} and then {r.choice(VERBS_PAST)} it again, because it was {r.choice(ADJECTIVES)}."


def build_corpus(target_bytes: int = 150_000, seed: int = 1234) -> str:
    r = random.Random(seed)
    docs, size = [], 0
    while size < target_bytes:
        doc = " ".join(_sentence(r) for _ in range(r.randint(3, 8)))
        docs.append(doc)
        size += len(doc) + 1
    return "\n".join(docs) + "\n"


def build_tokenizer(corpus_lines: list[str], vocab_size: int = VOCAB_SIZE):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD, BOS, EOS],  # ids 0, 1, 2: bos 1 and eos 2 as in the bundled tiny-llama config,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines, trainer=trainer)
    if tok.get_vocab_size() != vocab_size:
        raise SystemExit(f"tokenizer has {tok.get_vocab_size()} tokens, wanted {vocab_size}: enlarge the corpus")
    return tok


# ChatML-shaped, on the vocabulary's own BOS/EOS (the 2048 ids are all taken: no new tokens): what
# `zerokit launch --data-format chat` renders the bundled instruction set with
CHAT_TEMPLATE = ("{% for message in messages %}{{ bos_token }}{{ message['role'] }}\n{{ message['content'] }}"
                 "{{ eos_token }}{% endfor %}{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "zerokit" / "data"), help="zerokit/data directory")
    args = ap.parse_args(argv)
    out = Path(args.out)
    text = build_corpus()
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    (out / "corpus" / "tiny_corpus.txt").write_text(text)
    tok = build_tokenizer(text.splitlines())

    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD, bos_token=BOS,
                                   model_max_length=4096)
    tdir = out / "tokenizer"
    tdir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(tdir))
    # transformers 5 writes tokenizer_class "TokenizersBackend", which transformers 4.x cannot read;
    # "PreTrainedTokenizerFast" loads in both.
    cfg_path = tdir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg.pop("backend", None)
    cfg["chat_template"] = CHAT_TEMPLATE  # in the config itself, so transformers 4.x reads it too
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    for extra in ("special_tokens_map.json", "chat_template.jinja"):
        (tdir / extra).unlink(missing_ok=True)
    print(f"corpus {len(text)} bytes, {len(text.splitlines())} documents; tokenizer {tok.get_vocab_size()} tokens -> {tdir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
