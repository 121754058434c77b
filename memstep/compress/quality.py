"""What a compressed model keeps and what it saves, on the same measures for every model:
held-out perplexity, passkey accuracy on a small grid, a short greedy generation (does the
model still write, or repeat itself?), parameters, weight and KV bytes, and the prefill
seconds of one document (a full prefill through memstep's runner).

A *check* probe (``make_check_probe``) holds only a few perplexity windows: what the guard
needs to decide a save when the full measurements are off (``--no-eval``)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from memstep.cancel import checkpoint
from memstep.compress.data import held_out_text, perplexity, token_windows
from memstep.compress.guard import CHECK_WINDOWS
from memstep.compress.layers import model_costs
from memstep.errors import MemstepError
from memstep.models import LoadedModel
from memstep.passkey import PasskeyDoc, answer_contains_passkey, make_haystack, random_passkey, random_thing

PASSKEY_TOKENS = 1024
PASSKEY_CASES = 4
PERPLEXITY_WINDOWS = 8
PERPLEXITY_TOKENS = 256
PREFILL_TOKENS = 2048
SAMPLE_PROMPT = "Write two sentences about the sea."
SAMPLE_TOKENS = 40


@dataclass
class Probe:
    """The shared test material: perplexity windows, passkey documents, one prefill document
    (``check_only``: perplexity windows alone, see ``make_check_probe``)."""

    windows: list[list[int]]
    passkeys: list[PasskeyDoc]
    prefill_ids: list[int]
    check_only: bool = False

    def to_dict(self) -> dict:
        return {"perplexity_windows": len(self.windows),
                "perplexity_tokens": sum(len(w) for w in self.windows),
                "passkey_cases": [{"tokens": d.length_tokens, "depth": d.depth} for d in self.passkeys],
                "prefill_tokens": len(self.prefill_ids), "sample_prompt": None if self.check_only else SAMPLE_PROMPT,
                "sample_tokens": 0 if self.check_only else SAMPLE_TOKENS, "check_only": self.check_only}


def make_probe(tokenizer, *, windows: int = PERPLEXITY_WINDOWS, window_tokens: int = PERPLEXITY_TOKENS,
               passkey_cases: int = PASSKEY_CASES, passkey_tokens: int = PASSKEY_TOKENS,
               prefill_tokens: int = PREFILL_TOKENS) -> Probe:
    """Held-out text (Pride and Prejudice): perplexity windows from its start, passkeys at
    evenly spread depths in it, and its first ``prefill_tokens`` tokens as the prefill document."""
    text = held_out_text()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if prefill_tokens > len(ids):
        raise MemstepError(f"the held-out text has {len(ids)} tokens: ask for at most that many prefill tokens")
    docs = [make_haystack(text, tokenizer, passkey_tokens, (i + 0.5) / passkey_cases, random_passkey(i),
                          thing=random_thing(i)) for i in range(passkey_cases)]
    return Probe(token_windows(tokenizer, text, window_tokens, windows), docs, ids[:prefill_tokens])


def make_check_probe(tokenizer, windows: int = CHECK_WINDOWS, window_tokens: int = PERPLEXITY_TOKENS) -> Probe:
    """The guard's check alone: ``windows`` held-out perplexity windows from the start of the
    held-out text (the full probe's first ones), no passkeys, no prefill, no generation."""
    found = token_windows(tokenizer, held_out_text(), window_tokens, windows)
    if not found:
        raise MemstepError(f"the held-out text holds no window of {window_tokens} tokens for the check")
    return Probe(found, [], [], check_only=True)


def passkey_answers(lm: LoadedModel, docs: list[PasskeyDoc]) -> list[str]:
    """The greedy answer to each document's question after a full prefill."""
    from memstep.runner import DocumentRun

    answers = []
    for doc in docs:
        checkpoint()
        ids = lm.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
        run = DocumentRun(lm, ids, schedule="full", chunk=len(ids), memory=len(ids), question=doc.question,
                          max_new_tokens=16)
        answers.append(run.run().answer or "")
    return answers


def prefill_seconds(lm: LoadedModel, ids: list[int], repeats: int = 1) -> tuple[float, float]:
    """Best wall seconds and best process CPU seconds of a full prefill of ``ids`` (memstep's
    runner, one chunk). With one torch thread the CPU seconds barely move with other load."""
    from memstep.runner import DocumentRun

    wall = cpu = float("inf")
    for _ in range(repeats):
        checkpoint()
        run = DocumentRun(lm, ids, schedule="full", chunk=len(ids), memory=len(ids))
        began = time.process_time()
        wall = min(wall, run.run().seconds)
        cpu = min(cpu, time.process_time() - began)
    return wall, cpu


def generation_sample(lm: LoadedModel, prompt: str = SAMPLE_PROMPT, tokens: int = SAMPLE_TOKENS) -> str:
    """The model's greedy answer to ``prompt`` (through its chat template when it has one)."""
    import torch

    tok = lm.tokenizer
    if getattr(tok, "chat_template", None):
        ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                      return_dict=True)["input_ids"]
    else:
        ids = tok(prompt)["input_ids"]
    x = torch.tensor([list(ids)], device=next(lm.model.parameters()).device)
    eos = lm.model.generation_config.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if isinstance(eos, list) else eos)
    with torch.inference_mode():
        out = lm.model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False, max_new_tokens=tokens,
                                pad_token_id=pad, temperature=None, top_p=None, top_k=None)
    return tok.decode(out[0, x.shape[1]:], skip_special_tokens=True).strip()


def measure(lm: LoadedModel, probe: Probe, repeats: int = 1) -> dict:
    """Costs and quality of one model on ``probe`` (a check probe: costs and perplexity only)."""
    if probe.check_only:
        return {**model_costs(lm.model), "perplexity": perplexity(lm.model, probe.windows), "passkey_accuracy": None,
                "passkey_correct": [], "passkey_answers": [], "sample": None, "prefill_seconds": None,
                "prefill_cpu_seconds": None}
    answers = passkey_answers(lm, probe.passkeys)
    wall, cpu = prefill_seconds(lm, probe.prefill_ids, repeats)
    correct = [answer_contains_passkey(a, d.answer) for a, d in zip(answers, probe.passkeys)]
    return {**model_costs(lm.model),
            "perplexity": perplexity(lm.model, probe.windows),
            "passkey_accuracy": sum(correct) / len(correct) if correct else None,
            "passkey_correct": correct, "passkey_answers": answers, "sample": generation_sample(lm),
            "prefill_seconds": wall, "prefill_cpu_seconds": cpu}


def relative(row: dict, dense: dict) -> dict:
    """A model's measures against the dense model's: fractions of dense (or saved); None for
    what was not measured (the prefill seconds of a check)."""
    def saved(key):
        return None if row.get(key) is None or not dense.get(key) else 1 - row[key] / dense[key]

    return {"params_kept": row["params"] / dense["params"], "weight_bytes_saved": saved("weight_bytes"),
            "kv_bytes_per_token_saved": saved("kv_bytes_per_token"), "prefill_seconds_saved": saved("prefill_seconds"),
            "prefill_cpu_seconds_saved": saved("prefill_cpu_seconds"),
            "perplexity_ratio": row["perplexity"] / dense["perplexity"]}
