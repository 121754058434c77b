"""Calibration token windows: real text (the bundled novel or the user's own file), text the
dense model generates itself, or both; and the held-out windows the errors and perplexities
are checked on.

Self-generation follows the reference code (LOG-postech/rethinking-LLM-pruning, generate_data.py,
after LLM-QAT): each text starts from a random vocabulary token and the model continues it
greedily to 5 tokens; that start is kept only if langdetect reads it as English (otherwise a
new first token is drawn); the rest is sampled at temperature 1 with transformers' default
top-k of 50 (what the reference's ``generate()`` used), up to ``self_length`` tokens (the
reference: 2048). The model writes a pool of such texts (``self_texts``, by default one per
generated window; the reference writes 512 for its 256 samples) and each window is drawn as
the reference's data loader draws it: a text at random, then a random offset in it (seeded by
``seed``; windows may overlap). Two choices differ from the reference, to keep the cost known
on a CPU: first tokens are drawn among the non-special tokens, and the end-of-text token is
held off until a text is full (the reference lets a text end early and skips those shorter
than a window).

The masks' statistics come from real text only unless asked (``mask_data="all"``), as in the
reference, where self-generated samples only join the reconstruction.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from memstep.cancel import checkpoint, stop_on_cancel
from memstep.compress.data import CALIBRATION_FILE, held_out_text, paragraphs, token_windows
from memstep.compress.sparse.config import SOURCES, SparseConfig
from memstep.errors import MemstepError

GREEDY_TOKENS = 5  # the first token and its greedy continuation, checked for the language
TOP_K = 50
LANGUAGE = "en"
MAX_STARTS = 64  # batches of first tokens drawn before the language filter gives up


@dataclass
class CalibrationSet:
    """Every calibration window, reconstruction's first: ``windows[:recon]`` are trained on,
    ``windows[stats[0]:stats[1]]`` feed the masks' statistics (Wanda's norms, SparseGPT's
    Hessian), ``generated`` of them are self-generated, drawn from ``texts`` texts the model wrote."""

    windows: list[list[int]]
    recon: int
    stats: tuple[int, int]
    generated: int = 0
    texts: int = 0


def bundled_text() -> str:
    """The bundled calibration novel (Persuasion), its paragraphs of 200+ characters."""
    return "\n".join(paragraphs(CALIBRATION_FILE.read_text(encoding="utf-8"), 200))


def text_windows(tokenizer, samples: int, seq_len: int, text: str | None = None,
                 name: str | None = None) -> list[list[int]]:
    """``samples`` consecutive windows of ``seq_len`` tokens from ``text`` (default: the bundled novel)."""
    windows = token_windows(tokenizer, bundled_text() if text is None else text, seq_len, samples)
    if len(windows) < samples:
        raise MemstepError(f"the calibration text{f' {name}' if name else ''} is too short: it holds {len(windows)} "
                           f"window(s) of {seq_len} tokens and {samples} are needed; give a longer text or lower "
                           "--samples or --seq-len")
    return windows


def held_out_windows(tokenizer, samples: int, seq_len: int) -> list[list[int]]:
    """Windows of held-out text (Pride and Prejudice), never used for calibration."""
    windows = token_windows(tokenizer, held_out_text(), seq_len, samples)
    if len(windows) < samples:
        raise MemstepError(f"the held-out text holds only {len(windows)} windows of {seq_len} tokens")
    return windows


def first_token_pool(tokenizer, vocab_size: int) -> torch.Tensor:
    """Token ids a sample may start with: the vocabulary without special tokens."""
    special = set(tokenizer.all_special_ids or [])
    return torch.tensor([i for i in range(min(vocab_size, len(tokenizer))) if i not in special])


def is_language(text: str, language: str = LANGUAGE) -> bool:
    """langdetect's reading of ``text`` (seeded, so the same text always gets the same answer)."""
    from langdetect import DetectorFactory, LangDetectException, detect

    DetectorFactory.seed = 0
    try:
        return detect(text) == language
    except LangDetectException:  # no letters to go by
        return False


def _pad_id(model, tokenizer) -> int:
    eos = model.generation_config.eos_token_id
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)


def english_starts(model, tokenizer, count: int, generator: torch.Generator, batch_size: int = 16) -> list[list[int]]:
    """``count`` starts of GREEDY_TOKENS tokens: a random first token, its greedy continuation,
    kept when the decoded start reads as English."""
    device = next(model.parameters()).device
    pool = first_token_pool(tokenizer, model.config.vocab_size)
    starts: list[list[int]] = []
    for _ in range(MAX_STARTS):
        checkpoint()
        firsts = pool[torch.randint(len(pool), (batch_size,), generator=generator)].reshape(-1, 1).to(device)
        out = model.generate(input_ids=firsts, attention_mask=torch.ones_like(firsts), do_sample=False,
                             max_new_tokens=GREEDY_TOKENS - 1, min_new_tokens=GREEDY_TOKENS - 1,
                             pad_token_id=_pad_id(model, tokenizer), temperature=None, top_p=None, top_k=None)
        for ids in out.tolist():
            if len(starts) < count and is_language(tokenizer.decode(ids, skip_special_tokens=True)):
                starts.append(ids)
        if len(starts) == count:
            return starts
    raise MemstepError(f"the model wrote no {LANGUAGE} start in {MAX_STARTS * batch_size} tries: "
                       "use text calibration (--calibration text or FILE)")


def self_generated_texts(model, tokenizer, count: int, length: int = 512, seed: int = 0,
                         batch_size: int = 16) -> list[list[int]]:
    """``count`` texts of ``length`` tokens the model writes (an English greedy start, then sampled)."""
    generator = torch.Generator().manual_seed(seed)
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # generate() samples from the global generator; restored below
    texts: list[list[int]] = []
    try:
        with torch.inference_mode():
            starts = english_starts(model, tokenizer, count, generator, batch_size)
            device = next(model.parameters()).device
            rest = length - GREEDY_TOKENS
            for first in range(0, count, batch_size):
                checkpoint()
                ids = torch.tensor(starts[first:first + batch_size], device=device)
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                     temperature=1.0, top_k=TOP_K, top_p=1.0, max_new_tokens=rest,
                                     min_new_tokens=rest, pad_token_id=_pad_id(model, tokenizer),
                                     stopping_criteria=stop_on_cancel())
                checkpoint()  # a cancelled generate stops early: its short texts are not kept
                texts += out.tolist()
    finally:
        torch.random.set_rng_state(rng_state)
    return texts


def draw_windows(texts: list[list[int]], count: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    """``count`` windows of ``seq_len`` tokens, each from a text drawn at random and a random
    offset in it, as the reference's loader draws them (seeded; draws may overlap)."""
    usable = [t for t in texts if len(t) >= seq_len]
    if not usable:
        raise MemstepError(f"no self-generated text holds a window of {seq_len} tokens")
    rng = random.Random(seed)
    windows = []
    for _ in range(count):
        text = usable[rng.randrange(len(usable))]
        offset = rng.randint(0, len(text) - seq_len)
        windows.append(text[offset:offset + seq_len])
    return windows


def self_generated_windows(model, tokenizer, samples: int, seq_len: int, seed: int = 0, length: int = 512,
                           batch_size: int = 16, pool: int | None = None,
                           texts: list[list[int]] | None = None) -> list[list[int]]:
    """``samples`` windows of ``seq_len`` tokens drawn from a pool of ``pool`` texts of ``length``
    tokens the model writes (default: one text per window); ``texts``: a pool written before."""
    if texts is None:
        texts = self_generated_texts(model, tokenizer, pool or samples, length, seed, batch_size)
    return draw_windows(texts, samples, seq_len, seed)


def calibration_set(model, tokenizer, config: SparseConfig, text: str | None = None,
                    texts: list[list[int]] | None = None) -> CalibrationSet:
    """The windows ``config`` asks for. ``text``: the user's calibration text (the bundled novel
    when None). ``self`` with masks from real text reads ``samples`` real windows for the masks
    alone; ``both`` takes half real windows and half self-generated ones; ``add`` takes
    ``samples`` real windows and adds ``self_samples`` generated ones (the reference's gen_add).
    ``texts``: a pool of texts the model wrote before (a benchmark writes it once); the
    generated windows are drawn from it with the run's seed."""
    source, samples, seq_len = config.calibration, config.samples, config.seq_len
    if source not in SOURCES:
        raise MemstepError(f"unknown calibration source '{source}': choose one of {', '.join(SOURCES)}")
    name = config.calibration_file
    pool = len(texts) if texts is not None else config.pool_texts

    def generate(count):
        return self_generated_windows(model, tokenizer, count, seq_len, config.seed, config.self_length, pool=pool,
                                      texts=texts)

    if source == "text":
        return CalibrationSet(text_windows(tokenizer, samples, seq_len, text, name), samples, (0, samples))
    if source == "self":
        windows = generate(samples)
        if config.mask_data == "all" or config.method == "magnitude":
            return CalibrationSet(windows, samples, (0, samples), samples, pool)
        real = text_windows(tokenizer, samples, seq_len, text, name)
        return CalibrationSet(windows + real, samples, (samples, 2 * samples), samples, pool)
    if source == "add":
        real, extra = text_windows(tokenizer, samples, seq_len, text, name), generate(config.generated_samples)
        total = samples + len(extra)
        stats = (0, samples) if config.mask_data == "real" else (0, total)
        return CalibrationSet(real + extra, total, stats, len(extra), pool)
    half = samples // 2  # both: the generated half gets the odd one
    real = text_windows(tokenizer, half, seq_len, text, name) if half else []
    stats = (0, half) if config.mask_data == "real" and half else (0, samples)
    return CalibrationSet(real + generate(samples - half), samples, stats, samples - half, pool)


def calibration_windows(model, tokenizer, source: str, samples: int, seq_len: int, seed: int = 0) -> list[list[int]]:
    """The reconstruction windows of ``source`` with the other settings at their defaults."""
    config = SparseConfig(calibration=source, samples=samples, seq_len=seq_len, seed=seed)
    found = calibration_set(model, tokenizer, config)
    return found.windows[:found.recon]
