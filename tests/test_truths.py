"""True explanations: every bundled example ships its true answer, and the answer box compares
both answers with it. Per example, on the example's own text and tokens (the embedded model's
tokenizer) with step records that keep or drop the true answer's tokens: the verdicts agree with
the true answer; a wrong full-cache answer is said first, with the model named and the true
answer's place and what the memory kept of it, and the scorer is never blamed for it; a right
full-cache answer against a wrong compressed one says the memory lost it and suggests the
question-aware rerun. An upload without a known answer calls the full cache's answer a reference.
One real run (slow) checks the same on the embedded model's own answers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from memstep.records import RunResult, StepRecord
from memstep.schedules import make_schedule

from ui.documents import EXAMPLE_SETTINGS, EXAMPLES, example
from ui.truths import EXAMPLE_TRUTHS, TrueAnswer

MODEL_WORDS = "the 135M model (SmolLM2-135M-Instruct)"
WRONG = "It is a house, I think."


@pytest.fixture(scope="module")
def tokenizer():
    from ui.models import embedded_tokenizer

    return embedded_tokenizer()


def _prepared(name, tokenizer):
    """The example as a run of the page's defaults prepares it (its own settings where it has some)."""
    from ui.runs import DEFAULT_MAX_TOKENS, RunSettings, prepare

    needs = EXAMPLE_SETTINGS.get(name, {})
    settings = RunSettings("fm", needs.get("chunk", 512), needs.get("memory", 512), rope=needs.get("rope", "auto"))
    max_tokens = needs.get("max_tokens", DEFAULT_MAX_TOKENS)
    return prepare(example(name, tokenizer), tokenizer, max_tokens, 8192, settings), settings


def _records(schedule, sinks: int, memory: int, keep=None, drop=None) -> list[StepRecord]:
    """One layer, one KV head: after each step the sinks and the last ``memory`` positions read,
    with ``keep`` (input positions) always kept and ``drop`` never."""
    records, seen = [], 0
    for step, size in enumerate(schedule.chunk_sizes):
        start, seen = seen, seen + size
        kept = set(range(min(sinks, seen))) | set(range(max(sinks, seen - memory), seen))
        if keep:
            kept |= {p for p in range(*keep) if p < seen}
        if drop:
            kept -= set(range(*drop))
        kept = np.array(sorted(kept), dtype=np.int64).reshape(1, 1, -1)
        records.append(StepRecord(step=step, steps=schedule.steps, chunk_start=start, chunk_size=size,
                                  memory_before=0, memory_budget=memory, memory_after=kept.shape[2], seconds=0.1,
                                  bytes_measured=None, bytes_modeled=1, bytes_modeled_parts={"weights": 0},
                                  kv_bytes_actual=0, kept_positions=kept, evicted=True))
    return records


def _view(document, settings, compressed: str, full: str | None, keep_truth: bool):
    from ui import explain
    from ui.views import RunView

    schedule = make_schedule("fm", document.tokens, settings.chunk, settings.memory)
    view = RunView(document, settings, schedule, question=document.source.question, model_name="SmolLM2-135M-Instruct",
                   model_words=MODEL_WORDS, wants_reference=full is not None)
    truth = explain.truth_positions(view)
    view.records = _records(schedule, 4, settings.memory, keep=truth if keep_truth else None,
                            drop=None if keep_truth else truth)
    result = lambda answer: RunResult(model="m", tokens=document.tokens, prefix_tokens=document.prefix_tokens,  # noqa: E731
                                      schedule={}, scorer="s", sinks=4, device="cpu", dtype="float32",
                                      answer=answer, question=document.source.question)
    view.result, view.full = result(compressed), None if full is None else result(full)
    return view


def _right(truth: TrueAnswer) -> str:
    return f"The answer is {truth.shown}."


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_every_example_ships_its_true_answer(name, tokenizer):
    source = example(name, tokenizer)
    truth = source.truth
    assert truth is not None and (truth.kind == "passkey") == (source.passkey is not None)
    chars = truth.answer_chars(source.text)
    assert chars is not None, f"{name}: the evidence '{truth.evidence}' is not in the text"
    assert any(form.lower() == source.text[chars[0]:chars[1]].lower() for form in truth.accepted) \
        or name in EXAMPLE_TRUTHS and truth.evidence_chars(source.text) == chars  # the answer's words, or its passage
    assert truth.holds(_right(truth)) and not truth.holds(WRONG)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_a_wrong_full_cache_is_said_first_and_the_scorer_is_not_blamed(name, tokenizer):
    from ui.explain import answer_markdown
    from ui.runs import reference_fits

    document, settings = _prepared(name, tokenizer)
    truth = document.source.truth
    full = WRONG if reference_fits(document.tokens, 8192) else None  # no reference past the context (the novel)
    view = _view(document, settings, WRONG, full, keep_truth=False)
    box = answer_markdown(view)
    verdicts = re.findall(r"(✓ right|✗ wrong|✓ yes|✗ no)", box)
    assert verdicts == (["✗ no", "✗ no"] if truth.kind == "passkey" else ["✗ wrong", "✗ wrong"])[: 1 + (full is not None)]
    if full is not None:
        story = box.split("\n\n")[-2 if "Why it can miss" not in box else -3]
        assert "**Neither answer is right: the full cache is wrong too.**" in box
        assert box.index("the full cache is wrong too") < box.index(truth.shown, box.index("the full cache is wrong too"))
        assert MODEL_WORDS[0].upper() + MODEL_WORDS[1:] + " does not find it even with the whole document" in box
        assert "Why it can miss" not in box and not view.suggests_question_aware, story  # the model fails, not the scorer
    else:
        assert f"**The compressed memory's answer is wrong** (the true answer is “{truth.shown}”)" in box
    read = view.document.spans[-1][1]
    if truth.answer_chars(document.source.text)[1] > read:  # cut off by max tokens: the box says so
        assert "beyond the part of the document this run read" in box and "Max tokens" in box
    elif truth.kind == "passkey":
        assert re.search(r"The passkey \(\d+\) was read in step \d+ of \d+ and \*\*left the memory in step \d+\*\*", box)
    else:
        assert re.search(r"\*\*Where it sits\.\*\* \d+% into the document \(“.+”\): it was read in step \d+ of \d+ "
                         r"and \*\*left the memory in step \d+\*\*", box), box


@pytest.mark.parametrize("name", [n for n in EXAMPLES if "whole novel" not in n])
def test_a_right_full_cache_against_a_wrong_memory_suggests_question_aware(name, tokenizer):
    from ui.explain import answer_markdown

    document, settings = _prepared(name, tokenizer)
    truth = document.source.truth
    view = _view(document, settings, WRONG, _right(truth), keep_truth=False)
    box = answer_markdown(view)
    read = truth.answer_chars(document.source.text)[1] <= view.document.spans[-1][1]
    assert re.findall(r"(✓ right|✗ wrong|✓ yes|✗ no)", box) == (["✗ no", "✓ yes"] if truth.kind == "passkey"
                                                                 else ["✗ wrong", "✓ right"])
    assert "**Why the answers differ.** The full cache is right" in box and "wrong too" not in box
    assert view.suggests_question_aware == read and ("Why it can miss" in box) == read  # never for an unread answer
    both = answer_markdown(_view(document, settings, _right(truth), _right(truth), keep_truth=True))
    assert f"**Both answers are right** (“{truth.shown}”)" in both and "Why it can miss" not in both
    right_alone = answer_markdown(_view(document, settings, _right(truth), WRONG, keep_truth=True))
    assert "**The full cache is wrong; the compressed memory is right.**" in right_alone


def test_an_upload_without_a_known_answer_calls_the_full_cache_a_reference(tokenizer):
    from ui.documents import DocumentSource, with_needle
    from ui.explain import answer_markdown
    from ui.runs import RunSettings, prepare

    text = ("Mr. Okafor keeps the ledger of the harbour. " * 40) + "The harbour master is Mr. Okafor. " + \
        ("Ships come and go in the morning light. " * 40)
    source = DocumentSource("notes.txt", text, "Who is the harbour master?")
    assert with_needle("notes.txt", text).truth is None  # nothing known about an upload without a passkey
    document = prepare(source, tokenizer, None, 8192, RunSettings("fm", 256, 128))
    view = _view(document, RunSettings("fm", 256, 128), "It is a sailor.", "The harbour master is Mr. Okafor.",
                 keep_truth=False)
    box = answer_markdown(view)
    assert "**From the full cache (a reference, not the truth):**" in box and "✓" not in box and "✗" not in box
    assert "the full cache's answer is a reference, not the truth" in box and "“Mr. Okafor”" in box
    passkey = with_needle("p.txt", "Some prose. The magic number for the vault is 41234. More prose.")
    assert passkey.truth.holds("It is 41234.") and not passkey.truth.holds("It is 412345.")  # an upload's passkey


@pytest.mark.slow
def test_the_embedded_models_answers_get_true_verdicts(tokenizer):
    """Pride and Prejudice ch. 1-2 on the embedded model (its full cache answers wrongly there, as
    measured): whatever the two answers are, each verdict is the true answer's, and a wrong full
    cache is said first, with no question-aware suggestion."""
    from ui import handlers
    from ui.views import RunView

    name = "Pride and Prejudice, chapters 1-2 (2.3k tokens)"
    source = example(name, tokenizer)
    *_, last = handlers.run_document(source, None, "imdc", "linear", 512, 512, "chunk-attention", 4, 4096,
                                     source.question, True, progress=lambda *args, **kwargs: None)
    view = next(v for v in last if isinstance(v, RunView))
    box = last[6]
    truth = source.truth
    marks = re.findall(r"(✓ right|✗ wrong)", box)
    assert marks == ["✓ right" if truth.holds(a) else "✗ wrong" for a in (view.result.answer, view.full.answer)]
    if not truth.holds(view.full.answer):
        assert "the full cache is wrong" in box and "Why it can miss" not in box and "SmolLM2-135M-Instruct" in box
