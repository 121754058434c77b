"""The kvpress side of `memstep eval`: one press (or none: the plain Hugging Face full
cache) on the cases of a job, run with the python of the kvpress virtualenv:

    .venv-kvpress/bin/python peers/kvpress_peer.py JOB.json

kvpress 0.5.5 needs transformers<5.3, so this runs in its own virtualenv and speaks to
memstep only through the job file (token ids, prepared by memstep) and JSON lines on
stdout (memstep.evaluation.process). The whole context is prefilled in one pass with the
press's hooks compressing each layer to the same final budget as memstep (budget + sinks
entries); then the held-out continuation is scored and the question answered greedily,
in the same order and with the same positions as memstep's runner.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # memstep's model loader

import torch  # noqa: E402

from memstep.evaluation.process import load_job, serve_cases  # noqa: E402


def make_press(name: str | None, window: int):
    """The kvpress press for a peer configuration; None = no compression (HF full cache)."""
    if name is None:
        return None
    import kvpress

    presses = {"snapkv": lambda: kvpress.SnapKVPress(window_size=window),
               "knorm": kvpress.KnormPress,
               "streaming-llm": kvpress.StreamingLLMPress,
               "observed-attention": kvpress.ObservedAttentionPress}
    if name not in presses:
        raise SystemExit(f"unknown press '{name}': choose from {', '.join(presses)}")
    return presses[name]()


def set_ratio(press, context_tokens: int, keep: int) -> None:
    """kvpress keeps int(tokens * (1 - ratio)) entries; pick the ratio that keeps exactly ``keep``."""
    press.compression_ratio = max(0.0, 1.0 - (keep + 0.5) / context_tokens) if keep < context_tokens else 0.0


def extend(model, cache, ids: list[int], position: int, last_only: bool) -> torch.Tensor:
    """Append tokens after the cache at their true positions; logits (tokens or last, vocab)."""
    positions = torch.arange(position, position + len(ids), device=model.device)[None]
    out = model(input_ids=torch.tensor([ids], device=model.device), past_key_values=cache,
                position_ids=positions, use_cache=True, logits_to_keep=1 if last_only else 0)
    return out.logits[0].float()


def crop(cache, entries: list[int]) -> None:
    for layer, length in zip(cache.layers, entries):
        layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


def run_case(model, tokenizer, press, settings: dict, case: dict) -> dict:
    from transformers import DynamicCache

    # question-aware: the question (the chat template's tail) ends the context the press compresses, so
    # SnapKV's window is the question; the document keeps the same budget, the question its own entries
    aware = bool(settings.get("question_aware"))
    question = case["question_ids"]
    context = case["head_ids"] + case["document_ids"] + (question if aware else [])
    continuation = [] if aware else case["continuation_ids"]  # the question would sit before it
    keep = settings["budget"] + settings["sinks"] + (len(question) if aware else 0) if settings.get("budget") \
        else len(context)
    cache = DynamicCache()
    began = time.perf_counter()
    with torch.inference_mode():
        if press is not None:
            set_ratio(press, len(context), keep)
            with press(model):
                hidden = model.model(input_ids=torch.tensor([context], device=model.device),
                                     past_key_values=cache, use_cache=True).last_hidden_state
        else:
            hidden = model.model(input_ids=torch.tensor([context], device=model.device),
                                 past_key_values=cache, use_cache=True).last_hidden_state
        prefill_seconds = time.perf_counter() - began
        entries = [layer.keys.shape[2] for layer in cache.layers]
        nll = None
        if continuation:
            first = model.get_output_embeddings()(hidden[:, -1]).float()
            rest = extend(model, cache, continuation[:-1], len(context), False) if len(continuation) > 1 else first[:0]
            target = torch.tensor(continuation, device=first.device)
            nll = float(torch.nn.functional.cross_entropy(torch.cat([first, rest]), target))
            crop(cache, entries)
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
        position = len(context)
        if aware:  # the question is in the cache already
            logits = model.get_output_embeddings()(hidden[:, -1]).float()
        else:
            logits = extend(model, cache, question, position, True)
            position += len(question)
        out: list[int] = []
        for _ in range(settings["max_new_tokens"]):
            token = int(logits[-1].argmax())
            if token in eos:
                break
            out.append(token)
            logits = extend(model, cache, [token], position, True)
            position += 1
    return {"answer": tokenizer.decode(out, skip_special_tokens=True).strip(), "continuation_nll": nll,
            "prefill_seconds": prefill_seconds, "seconds": time.perf_counter() - began,
            "memory_entries": max(entries), "retention": None}


def main(argv: list[str]) -> int:
    job = load_job(argv[0])
    torch.set_num_threads(job.get("threads", 2))
    from memstep.models import load_model

    began = time.perf_counter()
    lm = load_model(job.get("model") or "embedded", device=job.get("device", "cpu"), dtype=job.get("dtype", "float32"))
    config, settings = job["config"], dict(job["settings"])
    settings["budget"] = config.get("budget")
    settings["question_aware"] = config.get("question_aware")
    press = make_press(config.get("scorer"), settings.get("peer_window", 64))
    if config.get("scorer") == "observed-attention":  # needs the attention weights
        lm.model.set_attn_implementation("eager")
    return serve_cases(lm, job, lambda case: run_case(lm.model, lm.tokenizer, press, settings, case), began)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
