"""How long a compression run from the page will take, before it starts.

The work is counted with the planner's formulas (memstep.planner: the FLOPs of a decoder
layer's projections and MLP, and of attention over the query-key pairs), run by run the way
LaCo and pruning go: the calibration forwards, every LaCo candidate from its base layer up,
every pruned block's forwards and reconstruction steps (backward = 2 x forward), perplexity,
passkey and prefill probes; decode steps (self-generated calibration, passkey answers) are
latency-bound and counted per step. Seconds = FLOPs / (this machine's measured matmul rate x
EFFICIENCY), the fraction of that rate whole runs reached here (docs/hardening.md).
"""

from __future__ import annotations

import functools
import os
import time

from memstep.planner import attention_pairs, layer_linear_params

# Measured on the embedded model (docs/hardening.md, benchmarks/bench_estimates.py): two passes of
# four real runs reached 0.37-0.91 of the measured fp32 matmul rate (median 0.68) on a shared CPU.
EFFICIENCY = float(os.environ.get("MEMSTEP_ESTIMATE_EFFICIENCY", "0.65"))
DECODE_STEP_FLOP_EQUIVALENT = 64  # one decode step costs about this many prefill tokens' work on a CPU
SAVE_BYTES_PER_SECOND = 150e6  # writing safetensors and tokenizer files


@functools.lru_cache(maxsize=1)
def matmul_flops_per_second() -> float:
    """This machine's fp32 matmul rate with the threads torch uses (measured once, ~0.2 s)."""
    import torch

    a, b = torch.randn(256, 576), torch.randn(576, 1536)
    torch.mm(a, b)  # warm up
    best = float("inf")
    for _ in range(5):
        began = time.perf_counter()
        for _ in range(8):
            torch.mm(a, b)
        best = min(best, time.perf_counter() - began)
    return 8 * 2 * 256 * 576 * 1536 / best


def _forward(shape, tokens: int, layers: int, lm_head: bool = False) -> float:
    """FLOPs of ``layers`` decoder layers over one sequence of ``tokens`` (plus the LM head)."""
    linear = 2 * tokens * layer_linear_params(shape)
    attention = 4 * shape.heads * shape.head_dim * attention_pairs(0, tokens, "sdpa")
    return layers * (linear + attention) + (2 * tokens * shape.hidden * shape.vocab if lm_head else 0)


def seconds(flops: float, decode_steps: int, shape, save_bytes: int) -> float:
    rate = matmul_flops_per_second() * EFFICIENCY
    decode = decode_steps * _forward(shape, DECODE_STEP_FLOP_EQUIVALENT, shape.layers, lm_head=True)
    return (flops + decode) / rate + save_bytes / SAVE_BYTES_PER_SECOND


def laco_work(shape, *, sentences: int, tokens: int, C: int, L: int, H: int, evaluate: bool,
              probe: dict, repeats: int, check: bool = False) -> tuple[float, int]:
    """(FLOPs, decode steps) of a LaCo run from the page (upper bound: no merge shrinks the stack);
    ``check``: without the measurements, the guard's check (three models' perplexity) still runs."""
    from memstep.compress.guard import CHECK_WINDOWS

    depth = shape.layers
    flops = sentences * _forward(shape, tokens, depth)  # the dense model's layer inputs
    for base in range(L, H - C + 1):  # each candidate runs its base layer and everything above
        flops += sentences * _forward(shape, tokens, depth - base)
    decode = 0
    if evaluate:
        models = 4  # dense, LaCo, block influence, uniform removal
        per_model = (probe["windows"] * _forward(shape, 256, depth, lm_head=True)
                     + probe["passkey_cases"] * _forward(shape, probe["passkey_tokens"] + 32, depth, lm_head=True)
                     + repeats * _forward(shape, probe["prefill_tokens"], depth))
        flops += models * per_model
        decode = models * probe["passkey_cases"] * 16
    elif check:  # dense, LaCo and block influence on the check's windows
        flops += 3 * CHECK_WINDOWS * _forward(shape, 256, depth, lm_head=True)
    return flops, decode


def sparse_work(shape, *, method: str, technique: str, calibration: str, samples: int, seq_len: int,
                held_out: int, steps: int, batch: int, generated_texts: int = 0,
                self_length: int = 512) -> tuple[float, int]:
    """(FLOPs, decode steps) of one pruning run (one reconstruction technique): ``samples`` is
    every window reconstruction trains on, ``generated_texts`` the texts of ``self_length``
    tokens the model writes first (in batches of 16, one decode step per token)."""
    calib = samples * seq_len
    block = _forward(shape, seq_len, 1)  # one block over one sample
    flops = 2 * (samples + held_out) * _forward(shape, seq_len, shape.layers, lm_head=True)  # perplexity before/after
    per_block = (3 * samples + 3 * held_out) * block  # dense on both inputs, masked, next
    h, i = shape.hidden, shape.intermediate
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    matrices = [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]  # (rows, columns) of each linear layer
    if method != "magnitude":  # the Gram matrix X^T X of every linear layer's input
        per_block += sum(2 * calib * cols * cols for _, cols in matrices)
    if method == "sparsegpt":  # inverse Hessian and column-by-column updates
        per_block += sum(cols ** 3 + 2 * rows * cols * cols for rows, cols in matrices)
    window = 2 if technique == "br+gp+cr" else 1
    if technique != "none":  # forward + backward (2x) on a mini-batch per step
        per_block += steps * min(batch, samples) * 3 * block * window
    flops += shape.layers * per_block
    decode = -(-generated_texts // 16) * (self_length - 1) if calibration != "text" else 0
    return flops, decode


def duration(estimate: float) -> str:
    return f"~{estimate:.0f} s" if estimate < 90 else f"~{estimate / 60:.0f} min"
