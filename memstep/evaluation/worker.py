"""A memstep worker: ``python -m memstep.evaluation.worker JOB.json``.

Runs one configuration on the cases of the job (all of one length) in this fresh
process and prints one JSON line per finished cell (see ``process``).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from memstep.evaluation.process import load_job, serve_cases


def retention_per_layer(kept_positions: np.ndarray, positions: range) -> list[float]:
    """Per layer: the fraction of (KV head, passkey token) pairs still in memory."""
    wanted = np.asarray(list(positions))
    layers, heads, _ = kept_positions.shape
    kept = np.isin(kept_positions, wanted).sum(axis=2)  # (layers, heads)
    return [round(float(x), 4) for x in kept.sum(axis=1) / (heads * len(wanted))]


def run_case(lm, config: dict, settings: dict, case: dict) -> dict:
    from memstep.presets import fidelity_variant
    from memstep.runner import DocumentRun

    continuation = case["continuation_ids"]
    fidelity = fidelity_variant(config.get("fidelity"))
    # RoPE positions: memstep's full cache (no eviction) has none set, and both modes agree there
    positions = {"rope": config["rope"]} if config.get("rope") else {}
    if fidelity.ntk == "dynamic" and positions.get("rope") == "document":
        fidelity = fidelity.with_memstep("ntk")  # dynamic NTK rescales compact positions only

    def prefill(question, held_out):
        return DocumentRun(
            lm, case["document_ids"] + held_out, schedule=config["schedule"],
            chunk=config.get("chunk") or 512, memory=config.get("budget") or 512,
            growth=config.get("growth") or "linear", scorer=config.get("scorer") or "chunk-attention",
            sinks=settings["sinks"], seed=case["seed"], window=settings["window"],
            question=question, max_new_tokens=settings["max_new_tokens"],
            continuation_tokens=len(held_out), question_aware=bool(config.get("question_aware")),
            fidelity=fidelity, **positions)

    began = time.perf_counter()
    nll = None
    if fidelity.question_place == "prompt" and continuation:
        # the question ends the prompt, so the continuation is scored in a prefill of its own
        nll = prefill(None, continuation).run().continuation_nll
        result = prefill(case["question"], []).run()
    else:
        result = prefill(case["question"], continuation).run()
        nll = result.continuation_nll
    seconds = time.perf_counter() - began
    offset = result.prefix_tokens
    start, end = case["passkey_tokens"]
    last = result.steps[-1]
    return {
        "answer": result.answer,
        "continuation_nll": nll,
        "prefill_seconds": result.seconds,
        "seconds": seconds,
        "memory_entries": int(last.memory_after),
        "retention": retention_per_layer(last.kept_positions, range(offset + start, offset + end)),
        "peak_bytes_modeled": result.peak_bytes_modeled,
    }


def main(argv: list[str]) -> int:
    import torch

    job = load_job(argv[0])
    torch.set_num_threads(job.get("threads", 2))
    from memstep.models import load_model

    began = time.perf_counter()
    lm = load_model(job.get("model") or "embedded", device=job.get("device", "cpu"), dtype=job.get("dtype", "float32"))
    return serve_cases(lm, job, lambda case: run_case(lm, job["config"], job["settings"], case), began)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
