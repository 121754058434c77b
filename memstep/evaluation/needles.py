"""The needles of the evaluation: several kinds of fact, several phrasings.

A passkey template alone measures one thing a small model happens to do well. These kinds
hide other facts (a number, a word, a name) in other sentence shapes, each asked back by
the thing it is about; an answer is right when it contains the fact as a whole word
(digits: as a whole run of digits, so "5121" is not 51537). Every draw depends only on the
case's label, so a case is the same needle in every run and in every configuration.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from memstep.passkey import THINGS, answer_contains_passkey, needle_sentence, question_for, random_passkey

WORDS = ("marigold", "lantern", "thimble", "saffron", "juniper", "cobalt", "pebble", "walnut",
         "velvet", "compass", "heron", "quartz")
NAMES = ("Ottoline", "Bartholomew", "Winifred", "Cornelius", "Millicent", "Peregrine", "Araminta",
         "Fitzgerald", "Tobias", "Rosalind", "Ambrose", "Clementine")


@dataclass(frozen=True)
class Needle:
    kind: str
    sentence: str  # what is hidden in the document
    question: str  # what is asked after it
    answer: str  # what a right answer contains


def _passkey(thing: str, rng: random.Random, label: str) -> Needle:
    key = str(random_passkey(label))
    return Needle("passkey", needle_sentence(key, thing), question_for(thing), key)


def _code(thing: str, rng: random.Random, label: str) -> Needle:
    code = str(rng.randint(1000, 9999))
    return Needle("code", f"The door of the {thing} opens with the code {code}.",
                  f"Which code opens the door of the {thing}?", code)


def _word(thing: str, rng: random.Random, label: str) -> Needle:
    word = rng.choice(WORDS)
    return Needle("word", f"The password of the {thing} is {word}.", f"What is the password of the {thing}?", word)


def _name(thing: str, rng: random.Random, label: str) -> Needle:
    name = rng.choice(NAMES)
    return Needle("name", f"The keeper of the {thing} was a man named {name}.",
                  f"What was the name of the keeper of the {thing}?", name)


# passkey: the template the app uses; code: another number in another sentence shape;
# word and name: facts that are not numbers.
KINDS = {"passkey": _passkey, "code": _code, "word": _word, "name": _name}
DEFAULT_KINDS = tuple(KINDS)


def make_needle(kind: str, label: str) -> Needle:
    """The needle of ``kind`` for the case named ``label`` (the same label, the same needle)."""
    rng = random.Random(f"needle-{kind}-{label}")
    thing = rng.choice(THINGS)
    return KINDS[kind](thing, rng, label)


def answer_matches(answer: str, expected: str) -> bool:
    """A number as a whole run of digits; a word or name as a whole word, any case."""
    if expected.isdigit():
        return answer_contains_passkey(answer, expected)
    return re.search(rf"(?<![A-Za-z]){re.escape(expected)}(?![A-Za-z])", answer, re.IGNORECASE) is not None
