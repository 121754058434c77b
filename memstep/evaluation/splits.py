"""The evaluation's two splits: *dev*, the cases settings are chosen on, and *test*, drawn once and frozen.

dev: memstep's needle suite in the two bundled Austen texts (needles.KINDS) and the public
needle test (Paul Graham's essays): every setting memstep runs by default was chosen on these.
test: cases none of those texts or needle sentences appear in: four other public-domain texts
(assets/test-split/, by Carroll, Milton and Austen) and the ten needle templates below (names,
places, objects, numbers as words and as digits, colours, animals, two- and three-word facts),
each asked in two or three wordings, at depths drawn over 5-95% of the document. The list is drawn
from one seed by ``draw_test_split`` and committed with its SHA-256 (``TEST_SHA256``) before
anything ran on it; ``memstep eval --split test`` refuses a list that does not match the hash, so
a test result is always a result on the cases drawn first.

A case of the list holds text, not tokens (any tokenizer builds the same documents from it).
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path

from memstep.errors import MemstepError

SPLITS = ("dev", "test")
TEST_FOLDER = Path(__file__).resolve().parent.parent.parent / "assets" / "test-split"
TEST_TEXTS = ("alice_in_wonderland.txt", "areopagitica.txt", "emma_ch1-8.txt", "northanger_abbey_ch1-8.txt")
TEST_LIST = TEST_FOLDER / "cases.json"
TEST_SEED = "memstep-test-split-2026-12-07"
# cases drawn per length: the 135M model's full cache answers about a third of such needles, and the
# split must hold 96 answered cases at 2,048 tokens and 48 at 4,096
TEST_DRAWS = {2048: 320, 4096: 160}
DEPTHS = (0.05, 0.95)
TEST_PREFIX = "t-"  # the test templates' kinds: no dev kind starts so
# the committed list's hash: changing it (or the list) after a test run is what the split forbids
TEST_SHA256 = "29d589e3d27c0944544f943b729ec41c273cd140eda75a2bbd890c1d580e30b7"


@dataclass(frozen=True)
class Template:
    kind: str
    sentence: str  # {subject}, {answer}
    questions: tuple[str, ...]  # wordings, {subject}
    subjects: tuple[str, ...]
    answers: tuple[str, ...] | tuple[int, int]  # words, or an inclusive range of numbers written in digits


TEMPLATES = (
    Template("t-captain", "The captain of the {subject} was a woman called {answer}.",
             ("Who was the captain of the {subject}?", "What was the name of the captain of the {subject}?",
              "Which woman was the captain of the {subject}?"),
             ("river ferry", "fishing boat", "mail steamer", "old barge", "island ferry"),
             ("Henrietta", "Marguerite", "Philippa", "Georgiana", "Evangeline", "Beatrix", "Theodora", "Lavinia")),
    Template("t-birthplace", "The painter {subject} was born in the town of {answer}.",
             ("In which town was the painter {subject} born?", "Where was the painter {subject} born?"),
             ("Edmund Hale", "Agnes Morrow", "Silas Crane", "Lydia Fenwick", "Oscar Pell"),
             ("Dunmore", "Halston", "Kilbride", "Tarbury", "Wexham", "Corwen", "Ellesby", "Brackwater")),
    Template("t-drawer", "Inside the {subject} there was nothing but an old {answer}.",
             ("What was inside the {subject}?", "What did the {subject} hold?"),
             ("locked drawer", "tin trunk", "oak chest", "leather pouch", "sea chest"),
             ("thermometer", "candlestick", "hourglass", "paintbrush", "teapot", "spyglass", "inkwell", "harmonica")),
    Template("t-windows", "The {subject} has exactly {answer} windows.",
             ("How many windows does the {subject} have?", "How many windows are there in the {subject}?"),
             ("stone chapel", "mill house", "school on the hill", "toll house", "boathouse"),
             ("eleven", "thirteen", "fifteen", "seventeen", "nineteen", "twenty", "thirty", "forty")),
    Template("t-platform", "The train to {subject} leaves from platform {answer}.",
             ("From which platform does the train to {subject} leave?",
              "Which platform does the train to {subject} leave from?"),
             ("Marlow", "Hexham", "Whitby", "Ludlow", "Oban"), (2, 48)),
    Template("t-door", "The door of the {subject} was painted {answer}.",
             ("What colour was the door of the {subject}?", "In what colour was the door of the {subject} painted?"),
             ("old chapel", "coaching inn", "schoolhouse", "bakehouse", "village hall"),
             ("crimson", "turquoise", "scarlet", "ochre", "lilac", "amber", "emerald", "mauve")),
    Template("t-ingredient", "The secret ingredient of {subject} is {answer}.",
             ("What is the secret ingredient of {subject}?", "Which secret ingredient goes into {subject}?"),
             ("Aunt Mabel's soup", "the miller's bread", "the innkeeper's stew", "Grandmother Ivy's cake",
              "the cook's pie"),
             ("roasted chestnuts", "wild thyme honey", "smoked paprika", "candied ginger", "burnt sugar",
              "sour cherries", "toasted fennel seeds", "dried figs")),
    Template("t-founded", "The {subject} was founded in the year {answer}.",
             ("In which year was the {subject} founded?", "When was the {subject} founded?"),
             ("chess society", "botanical society", "choir", "lifeboat station", "glass works"), (1650, 1899)),
    Template("t-mascot", "The mascot of the {subject} is a {answer}.",
             ("What animal is the mascot of the {subject}?", "What is the mascot of the {subject}?"),
             ("rowing club", "cricket team", "debating society", "brass band", "fire brigade"),
             ("badger", "pelican", "hedgehog", "otter", "kingfisher", "tortoise", "falcon", "walrus")),
    Template("t-meets", "The {subject} meets every Thursday at the {answer}.",
             ("Where does the {subject} meet every Thursday?", "At which place does the {subject} meet on Thursdays?"),
             ("knitting circle", "chess club", "poetry society", "bell ringers", "walking club"),
             ("Red Lion", "Old Mill", "Blue Anchor", "Stone Bridge", "Crooked Elm", "Green Man", "Seven Stars",
              "Black Swan")),
)
KINDS = tuple(t.kind for t in TEMPLATES)


def draw_needle(template: Template, rng: random.Random) -> dict:
    """One needle of ``template``: its subject, answer, sentence and one of its question wordings."""
    subject = rng.choice(template.subjects)
    if isinstance(template.answers[0], int):
        answer = str(rng.randint(*template.answers))
    else:
        answer = rng.choice(template.answers)
    return {"kind": template.kind, "subject": subject, "answer": answer,
            "sentence": template.sentence.format(subject=subject, answer=answer),
            "question": rng.choice(template.questions).format(subject=subject)}


def read_test_texts(folder: Path = TEST_FOLDER) -> dict[str, str]:
    from memstep.evaluation.suite import read_haystacks

    return read_haystacks([folder / name for name in TEST_TEXTS])


def draw_test_split(texts: dict[str, str] | None = None, seed: str = TEST_SEED,
                    draws: dict[int, int] | None = None) -> list[dict]:
    """The test cases, drawn from ``seed``: at each length, texts and templates in turn (each pair
    equally often), a depth uniform over 5-95%, a window of the text and a needle from the seed."""
    from memstep.evaluation.suite import window_start

    texts = texts or read_test_texts()
    names = sorted(texts)
    rng = random.Random(seed)
    cases = []
    for length, count in sorted((draws or TEST_DRAWS).items()):
        pairs = [(names[i % len(names)], TEMPLATES[(i // len(names)) % len(TEMPLATES)]) for i in range(count)]
        rng.shuffle(pairs)
        for index, (name, template) in enumerate(pairs):
            depth = round(rng.uniform(*DEPTHS), 3)
            case = {"length": length, "seed": index, "haystack": name, "depth": depth,
                    "start": window_start(texts[name], name, length, depth, f"{seed}-{index}"),
                    **draw_needle(template, rng)}
            cases.append(case)
    return cases


def list_text(cases: list[dict]) -> str:
    """The committed form of a case list (one case a line, keys sorted): its bytes are what the hash covers."""
    return "[\n" + ",\n".join(json.dumps(case, sort_keys=True) for case in cases) + "\n]\n"


def digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_test_split(path: Path | None = None, expected: str | None = None) -> list[dict]:
    """The frozen test cases, refused unless the file's SHA-256 is the committed one."""
    path = TEST_LIST if path is None else path
    expected = TEST_SHA256 if expected is None else expected
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError:
        raise MemstepError(f"the test split's case list {path} is missing: restore it from the repository") from None
    found = digest(text)
    if found != expected:
        raise MemstepError(f"the test split's case list {path} does not match its committed hash (sha256 {found[:12]}, "
                           f"expected {expected[:12]}): the test split is drawn once and never edited; restore the "
                           "file from the repository")
    return json.loads(text)


def test_cases(tokenizer, lengths=None, continuation_tokens: int = 32, path: Path | None = None) -> list:
    """The frozen test split's cases at ``lengths`` (default: every length it holds) as Case objects."""
    from memstep.evaluation.needles import Needle
    from memstep.evaluation.suite import check_lengths, make_case

    specs = load_test_split(path)
    held = sorted({spec["length"] for spec in specs})
    wanted = list(lengths) if lengths else held
    for length in wanted:
        if length not in held:
            raise MemstepError(f"the test split holds cases of {', '.join(map(str, held))} tokens, not {length}: "
                               "choose --lengths among those")
    texts = read_test_texts()
    check_lengths(texts, tokenizer, [max(wanted)], continuation_tokens)
    return [make_case(texts[spec["haystack"]], tokenizer, spec["length"], spec["depth"], spec["seed"],
                      continuation_tokens, spec["haystack"], start=spec["start"], kind=spec["kind"],
                      needle=Needle(spec["kind"], spec["sentence"], spec["question"], spec["answer"]))
            for spec in specs if spec["length"] in wanted]
