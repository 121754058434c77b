"""Calibration token windows: bundled public-domain text, text the dense model generates
itself, or both; and the held-out windows the errors and perplexities are checked on.

Self-generation follows the seed paper's recipe (after LLM-QAT): each sample starts from a
random vocabulary token and the dense model samples the rest (temperature 1, no top-k or
top-p cut), so the calibration data comes from the model's own distribution.
"""

from __future__ import annotations

import torch

from memstep.cancel import checkpoint, stop_on_cancel
from memstep.compress.data import calibration_texts, held_out_text, token_windows
from memstep.compress.sparse.config import SOURCES
from memstep.errors import MemstepError


def text_windows(tokenizer, samples: int, seq_len: int) -> list[list[int]]:
    """``samples`` windows of ``seq_len`` tokens from the calibration novel (Persuasion)."""
    text = "\n".join(calibration_texts(count=10_000))
    windows = token_windows(tokenizer, text, seq_len, samples)
    if len(windows) < samples:
        raise MemstepError(f"the calibration text holds only {len(windows)} windows of {seq_len} tokens: "
                           "ask for fewer --samples or a shorter --seq-len")
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


def self_generated_windows(model, tokenizer, samples: int, seq_len: int, seed: int = 0,
                           batch_size: int = 16) -> list[list[int]]:
    """``samples`` sequences of exactly ``seq_len`` tokens sampled from ``model`` itself."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    pool = first_token_pool(tokenizer, model.config.vocab_size)
    starts = pool[torch.randint(len(pool), (samples,), generator=generator)]
    eos = model.generation_config.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    windows: list[list[int]] = []
    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)  # generate() samples from the global generator; restored below
    try:
        with torch.inference_mode():
            for first in range(0, samples, batch_size):
                checkpoint()
                ids = starts[first:first + batch_size].reshape(-1, 1).to(device)
                out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=True,
                                     temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=seq_len - 1,
                                     min_new_tokens=seq_len - 1, pad_token_id=pad,
                                     stopping_criteria=stop_on_cancel())
                checkpoint()  # a cancelled generate stops early: its short windows are not kept
                windows += out[:, :seq_len].tolist()
    finally:
        torch.random.set_rng_state(rng_state)
    return windows


def calibration_windows(model, tokenizer, source: str, samples: int, seq_len: int,
                        seed: int = 0) -> list[list[int]]:
    """``text``: all from the novel; ``self``: all generated; ``both``: half and half
    (the generated half gets the odd one)."""
    if source not in SOURCES:
        raise MemstepError(f"unknown calibration source '{source}': choose one of {', '.join(SOURCES)}")
    if source == "text":
        return text_windows(tokenizer, samples, seq_len)
    if source == "self":
        return self_generated_windows(model, tokenizer, samples, seq_len, seed)
    half = samples // 2
    return text_windows(tokenizer, half, seq_len) + self_generated_windows(model, tokenizer, samples - half,
                                                                           seq_len, seed)
