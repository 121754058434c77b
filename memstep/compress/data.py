"""Calibration data, held-out text and perplexity, shared by the compression methods.

Calibration comes from *Persuasion* (assets/persuasion_excerpt.txt); held-out perplexity is
measured on *Pride and Prejudice* (assets/pride_and_prejudice_ch1-12.txt): two different
public-domain novels, so a method cannot look good by fitting the text it is scored on.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from memstep.cancel import checkpoint
from memstep.errors import MemstepError
from memstep.outputs import staged_folder

ASSETS = Path(__file__).resolve().parents[2] / "assets"
CALIBRATION_FILE = ASSETS / "persuasion_excerpt.txt"
HELD_OUT_FILE = ASSETS / "pride_and_prejudice_ch1-12.txt"


# A calibration file a user gives goes through the same reading as a document (extension,
# size limit, decoding, binary and empty checks): one readable line for each problem.
MIN_PARAGRAPH_CHARS = 80


def read_calibration(path: str | Path) -> str:
    """The text of a user's calibration file (.txt/.md/.pdf/.html), read as documents are."""
    from memstep.reading import read_document

    return read_document(path)


def paragraphs(text: str, min_chars: int = MIN_PARAGRAPH_CHARS) -> list[str]:
    """Blocks separated by blank lines, their wrapped lines joined, of ``min_chars`` or more."""
    blocks = re.split(r"\n\s*\n", text.replace("\r\n", "\n"))
    joined = (" ".join(line.strip() for line in block.splitlines() if line.strip()) for block in blocks)
    return [p for p in joined if len(p) >= min_chars]


def calibration_texts(count: int = 8, text: str | None = None, min_chars: int = 200,
                      name: str | None = None) -> list[str]:
    """The first ``count`` paragraphs of at least ``min_chars`` characters of ``text`` (default:
    the bundled Persuasion excerpt). Fewer than ``count`` is an error: the text is too short."""
    text = CALIBRATION_FILE.read_text(encoding="utf-8") if text is None else text
    found = paragraphs(text, min_chars)
    if len(found) < count:
        raise MemstepError(f"the calibration text{f' {name}' if name else ''} is too short: it has {len(found)} "
                           f"paragraph(s) of {min_chars}+ characters (separated by blank lines) and {count} are "
                           "needed; give a longer text or ask for fewer (--sentences)")
    return found[:count]


def held_out_text() -> str:
    return HELD_OUT_FILE.read_text(encoding="utf-8")


def token_windows(tokenizer, text: str, seq_len: int, count: int) -> list[list[int]]:
    """Up to ``count`` consecutive windows of ``seq_len`` token ids from ``text``."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return [ids[i:i + seq_len] for i in range(0, min(len(ids), seq_len * count), seq_len)
            if len(ids[i:i + seq_len]) == seq_len]


def window_nlls(model, windows: list[list[int]]) -> list[tuple[float, int]]:
    """Each window's summed next-token NLL (nats) and the number of tokens it scores, each
    window scored on its own."""
    import torch

    device = next(model.parameters()).device
    found = []
    with torch.inference_mode():
        for ids in windows:
            checkpoint()
            x = torch.tensor([ids], device=device)
            logits = model(input_ids=x).logits[0, :-1].float()
            found.append((torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum").item(), len(ids) - 1))
    return found


def pooled_perplexity(nlls: list[tuple[float, int]]) -> float:
    """exp(mean next-token NLL) over every scored token of ``window_nlls``' windows."""
    count = sum(n for _, n in nlls)
    if count == 0:
        raise MemstepError("no text to measure perplexity on")
    return math.exp(sum(total for total, _ in nlls) / count)


def perplexity(model, windows: list[list[int]]) -> float:
    """exp(mean next-token NLL) over the windows (each scored on its own)."""
    return pooled_perplexity(window_nlls(model, windows))


def save_model(model, tokenizer, folder: str | Path, info: dict | None = None) -> Path:
    """Save so that ``from_pretrained`` / ``memstep run --model FOLDER`` load it; ``info`` goes
    to memstep_compress.json beside the weights (how the model was made). Written into a
    temporary sibling and renamed when complete (memstep.outputs): an existing non-empty folder
    is refused unless the command line forced it, and nothing memstep did not write is removed."""
    with staged_folder(folder, info={"method": (info or {}).get("method")}) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        if info is not None:
            (partial / "memstep_compress.json").write_text(json.dumps(info, indent=1))
    return Path(folder)
