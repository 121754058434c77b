"""Pruning masks for one linear layer: magnitude, Wanda and SparseGPT.

A mask is a bool tensor shaped like the weight, True where the weight survives. Two sparsity
patterns: unstructured (a fraction of the weights) and N:M (in every group of M consecutive
input columns of a row, N weights survive). How "exactly the requested sparsity" is counted:

- magnitude: round(sparsity x numel) weights of the whole matrix are pruned;
- Wanda: round(sparsity x columns) weights of every output row (Wanda compares within a row);
- SparseGPT: round(sparsity x rows x block columns) weights of every block of columns (the
  mask is chosen block by block, as the OBS update moves through the columns).
"""

from __future__ import annotations

import torch

from memstep.compress.sparse.config import METHODS, Pattern, parse_nm  # noqa: F401 (re-exported)
from memstep.errors import MemstepError


def _prune_lowest(scores: torch.Tensor, count: int) -> torch.Tensor:
    """Keep-mask that prunes the ``count`` lowest scores along the last dimension."""
    keep = torch.ones_like(scores, dtype=torch.bool)
    if count > 0:
        keep.scatter_(-1, torch.topk(scores, count, dim=-1, largest=False).indices, False)
    return keep


def nm_mask(scores: torch.Tensor, n: int, m: int) -> torch.Tensor:
    """In every group of ``m`` consecutive columns of a row, keep the ``n`` highest scores."""
    rows, cols = scores.shape
    if cols % m:
        raise MemstepError(f"N:M sparsity needs the input width ({cols}) to be a multiple of M={m}")
    return _prune_lowest(scores.reshape(rows, cols // m, m), m - n).reshape(rows, cols)


def score_mask(scores: torch.Tensor, pattern: Pattern, per_row: bool) -> torch.Tensor:
    """Mask from scores (higher = more important): N:M, per row, or over the whole matrix."""
    if pattern.nm:
        return nm_mask(scores, pattern.n, pattern.m)
    if per_row:
        return _prune_lowest(scores, round(pattern.sparsity * scores.shape[1]))
    return _prune_lowest(scores.flatten(), round(pattern.sparsity * scores.numel())).reshape(scores.shape)


def magnitude_mask(weight: torch.Tensor, pattern: Pattern) -> torch.Tensor:
    """Han et al. (2015): prune the smallest |W| of the matrix (N:M: of each group)."""
    return score_mask(weight.detach().abs().float(), pattern, per_row=False)


def wanda_scores(weight: torch.Tensor, input_norms: torch.Tensor) -> torch.Tensor:
    """Sun et al. (2024): |W_ij| x ||X_j||_2, the weight times the L2 norm of its input feature
    over all calibration tokens."""
    return weight.detach().abs().float() * input_norms.float().reshape(1, -1)


def wanda_mask(weight: torch.Tensor, input_norms: torch.Tensor, pattern: Pattern) -> torch.Tensor:
    return score_mask(wanda_scores(weight, input_norms), pattern, per_row=True)


def sparsegpt_prune(weight: torch.Tensor, hessian: torch.Tensor, pattern: Pattern, block_columns: int = 128,
                    damp: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    """Frantar & Alistarh (2023): prune column by column and update the not-yet-visited columns
    with the optimal-brain-surgeon correction, using the inverse of the damped Hessian
    H = X^T X / tokens + damp x mean(diag H) x I. The mask is chosen per block of columns by
    w^2 / [H^-1]_jj^2. Returns (new weight, keep mask)."""
    w = weight.detach().clone().float()
    rows, cols = w.shape
    if pattern.nm and block_columns % pattern.m:
        raise MemstepError(f"the SparseGPT block ({block_columns} columns) must be a multiple of M={pattern.m}")
    h = hessian.detach().clone().float()
    dead = torch.diag(h) == 0  # inputs that never fire: any weight on them is free to prune
    h[dead, dead] = 1
    w[:, dead] = 0
    h += damp * torch.mean(torch.diag(h)) * torch.eye(cols, dtype=h.dtype, device=h.device)
    # Upper Cholesky factor of H^-1: row i holds the update for column i given columns < i fixed.
    h_inv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    keep = torch.ones_like(w, dtype=torch.bool)
    for start in range(0, cols, block_columns):
        end = min(start + block_columns, cols)
        block, h_block = w[:, start:end].clone(), h_inv[start:end, start:end]
        diag = torch.diag(h_block)
        errors = torch.zeros_like(block)
        if not pattern.nm:
            scores = block ** 2 / diag.reshape(1, -1) ** 2
            block_keep = score_mask(scores, pattern, per_row=False)
        else:
            block_keep = torch.ones_like(block, dtype=torch.bool)
        for i in range(end - start):
            if pattern.nm and i % pattern.m == 0:
                group = block[:, i:i + pattern.m] ** 2 / diag[i:i + pattern.m].reshape(1, -1) ** 2
                block_keep[:, i:i + pattern.m] = _prune_lowest(group, pattern.m - pattern.n)
            column = block[:, i]
            pruned = torch.where(block_keep[:, i], column, torch.zeros_like(column))
            error = (column - pruned) / h_block[i, i]
            block[:, i:] -= error.unsqueeze(1) @ h_block[i, i:].unsqueeze(0)
            block[:, i] = pruned
            errors[:, i] = error
        w[:, start:end] = block
        w[:, end:] -= errors @ h_inv[start:end, end:]
        keep[:, start:end] = block_keep
    w[~keep] = 0
    return w.to(weight.dtype), keep
