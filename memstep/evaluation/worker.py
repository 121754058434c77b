"""A memstep worker: ``python -m memstep.evaluation.worker JOB.json``.

Runs one configuration on the cases of the job (all of one length) in this fresh
process and prints one JSON line per finished cell (see ``process``). With ``--serve`` it
reads jobs from stdin instead, one per line, and keeps its model between them (a Ray
worker's, ``ray_executor``).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from memstep.evaluation.process import load_job, serve_cases, serve_jobs


def retention_per_layer(kept_positions: np.ndarray, positions: range) -> list[float]:
    """Per layer: the fraction of (KV head, passkey token) pairs still in memory."""
    wanted = np.asarray(list(positions))
    layers, heads, _ = kept_positions.shape
    kept = np.isin(kept_positions, wanted).sum(axis=2)  # (layers, heads)
    return [round(float(x), 4) for x in kept.sum(axis=1) / (heads * len(wanted))]


def scheduled_layers(step) -> tuple[list[int], str]:
    """The layers whose retention says something about the schedule and scorer, and their name:
    on a hybrid model (Gemma 3) the global layers, since a sliding layer holds its window
    whatever the schedule (``StepRecord.global_layers``); all layers otherwise."""
    if getattr(step, "layer_types", None):
        return step.global_layers, "global"
    return list(range(step.kept_positions.shape[0])), "all"


def whole_needle(kept_positions: np.ndarray, positions: range) -> float:
    """The fraction of (layer, KV head) slots that keep every token of the answer."""
    wanted = np.asarray(list(positions))
    kept = np.isin(kept_positions, wanted).sum(axis=2)  # (layers, heads): answer tokens kept
    return round(float((kept == len(wanted)).mean()), 4)


def continuation_logits(run, held_out: list[int]):
    """The memory's next-token logits over ``held_out`` (one row per held-out token), from a
    finished run whose memory is as the prefill left it; the memory is left that way again."""
    import torch

    from memstep.generate import crop_memory, memory_mark

    engine = run.engine
    head = engine.model.get_output_embeddings()
    mark = memory_mark(engine)
    with torch.inference_mode():
        rows = [head(engine.last_hidden).float()]
        if len(held_out) > 1:
            hidden = engine.forward(torch.tensor([held_out[:-1]]), engine.position)
            rows.append(head(hidden)[0].float())
    crop_memory(engine, mark)
    return torch.cat(rows).cpu().numpy()


def document_run(lm, config: dict, settings: dict, case: dict, question: str | None, held_out: list[int]):
    """The DocumentRun a configuration makes of a case (its schedule, scorer, positions,
    reference switches and question-aware pooling and weight)."""
    from memstep.presets import fidelity_variant
    from memstep.runner import DocumentRun

    fidelity = fidelity_variant(config.get("fidelity"))
    # RoPE positions: memstep's full cache (no eviction) has none set, and both modes agree there
    positions = {"rope": config["rope"]} if config.get("rope") else {}
    if fidelity.ntk == "dynamic" and positions.get("rope") == "document":
        fidelity = fidelity.with_memstep("ntk")  # dynamic NTK rescales compact positions only
    schedule, chunk = config["schedule"], config.get("chunk") or 512
    if schedule == "once":  # one step reads the whole document (prompt head included), then cuts to M
        schedule, chunk = "fm", len(case.get("head_ids") or []) + len(case["document_ids"])
    ablation = {k: config[k] for k in ("question_pool", "question_weight", "span") if config.get(k) is not None}
    return DocumentRun(
        lm, case["document_ids"] + held_out, schedule=schedule, chunk=chunk, memory=config.get("budget") or 512,
        growth=config.get("growth") or "linear", scorer=config.get("scorer") or "chunk-attention",
        sinks=settings["sinks"], seed=case["seed"], window=settings["window"],
        question=question, max_new_tokens=settings["max_new_tokens"],
        continuation_tokens=len(held_out), question_aware=bool(config.get("question_aware")),
        fidelity=fidelity, **positions, **ablation)


def run_case(lm, config: dict, settings: dict, case: dict, reference: dict | None = None) -> dict:
    """One cell; ``reference``: {"read": path} scores the continuation against the full
    cache's saved log-probabilities, {"write": path} saves this run's as that reference."""
    from memstep.evaluation.divergence import save_reference, score_against
    from memstep.presets import fidelity_variant

    reference = reference or {}
    continuation = case["continuation_ids"]
    prefill = lambda question, held_out: document_run(lm, config, settings, case, question, held_out)  # noqa: E731
    in_prompt = fidelity_variant(config.get("fidelity")).question_place == "prompt"
    began = time.perf_counter()
    if in_prompt and continuation:
        # the question ends the prompt, so the continuation is scored in a prefill of its own
        scored = prefill(None, continuation)
        scored.run()
        result = prefill(case["question"], []).run()
    else:
        scored = prefill(case["question"], continuation)
        result = scored.run()
    nll = scored.result.continuation_nll
    divergence = {}
    if continuation and (reference.get("read") or reference.get("write")):
        logits = continuation_logits(scored, continuation)
        if reference.get("write"):
            save_reference(reference["write"], logits)
        divergence = score_against(reference.get("read") or reference.get("write"), logits)
    seconds = time.perf_counter() - began
    offset = result.prefix_tokens
    start, end = case["passkey_tokens"]
    last = result.steps[-1]
    answer_positions = range(offset + start, offset + end)
    layers, scope = scheduled_layers(last)
    kept = last.kept_positions[layers]
    return {
        "answer": result.answer,
        "continuation_nll": nll,
        "prefill_seconds": result.seconds,
        "seconds": seconds,
        # a global layer's entries on a hybrid model (a sliding one holds its window)
        "memory_entries": int(max(last.layer_entries[i] for i in layers)) if scope == "global" else int(last.memory_after),
        "retention": retention_per_layer(kept, answer_positions),
        "needle_whole": whole_needle(kept, answer_positions),
        "retention_layers": scope,
        "peak_bytes_modeled": result.peak_bytes_modeled,
        "settings": {"question_pool": result.question_pool, "question_weight": result.question_weight,
                     **({"span": config["span"]} if config.get("span") else {}),
                     "chunk": "whole document" if config["schedule"] == "once" else config.get("chunk"),
                     "steps": result.schedule["steps"]},
        **divergence,
    }


def load(job: dict):
    from memstep.models import load_model

    return load_model(job.get("model") or "embedded", device=job.get("device", "cpu"), dtype=job.get("dtype", "float32"))


def main(argv: list[str]) -> int:
    import torch

    if argv and argv[0] == "--serve":
        return serve_jobs(load, lambda lm, job: lambda case, reference: run_case(lm, job["config"], job["settings"],
                                                                                 case, reference))
    job = load_job(argv[0])
    torch.set_num_threads(job.get("threads", 2))
    began = time.perf_counter()
    lm = load(job)
    return serve_cases(lm, job, lambda case, reference: run_case(lm, job["config"], job["settings"], case, reference),
                       began)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
