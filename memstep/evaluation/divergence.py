"""How far a compressed memory's next-token predictions are from the full cache's.

Over the held-out continuation that follows the document, both runs predict every next
token; the full cache's log-probabilities are saved once per case (the reference) and each
compressed run is scored against them: the mean KL divergence KL(full || memory) in nats
per token and the top-1 agreement (how often both pick the same next token). Neither hangs
on whether a small model can answer a question. numpy only: the kvpress peer imports this
from its own virtualenv.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np


def log_softmax(logits) -> np.ndarray:
    """Log-probabilities over the last axis, in float64 (a float32 KL of two nearly equal
    distributions is mostly rounding)."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(reference: np.ndarray, logits) -> dict:
    """KL(reference || logits) averaged over positions, its largest position, and the top-1
    agreement; ``reference`` holds log-probabilities, ``logits`` raw scores (same shape)."""
    ref = np.asarray(reference, dtype=np.float64)
    mine = log_softmax(logits).astype(np.float32).astype(np.float64)  # stored at the reference's precision
    if ref.shape != mine.shape:
        raise ValueError(f"reference {ref.shape} and logits {mine.shape} differ in shape")
    kl = (np.exp(ref) * (ref - mine)).sum(axis=-1)
    kl = np.maximum(kl, 0.0)  # rounding can leave -1e-17 for identical rows
    return {"kl": float(kl.mean()), "kl_max": float(kl.max()),
            "top1": float((ref.argmax(axis=-1) == mine.argmax(axis=-1)).mean())}


def save_reference(path: str | Path, logits) -> None:
    """The full cache's log-probabilities over the continuation, for the compressed runs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.npy")
    np.save(tmp, log_softmax(logits).astype(np.float32))
    tmp.replace(path)  # a reader never sees half a file


def score_against(path: str | Path | None, logits) -> dict:
    """``compare`` against the reference at ``path``; {} when there is none (no KL asked for,
    or the full cache's cell failed)."""
    if not path or not Path(path).exists():
        return {}
    return compare(np.load(path), logits)
