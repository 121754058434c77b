"""Counting zeros: the achieved sparsity of the model in memory and of a saved folder."""

from __future__ import annotations

from pathlib import Path

import torch

from memstep.compress.sparse.blocks import decoder_layers, linear_layers


def count_sparsity(weight: torch.Tensor) -> float:
    """The fraction of exact zeros in a matrix."""
    return float((weight == 0).sum()) / weight.numel()


def pruned_matrices(model) -> dict[str, torch.Tensor]:
    """Every linear weight inside the decoder blocks, by its state-dict name."""
    prefix = "model.layers"
    return {f"{prefix}.{i}.{name}.weight": lin.weight
            for i, block in enumerate(decoder_layers(model)) for name, lin in linear_layers(block).items()}


def saved_tensors(folder: str | Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        tensors.update(load_file(str(path)))
    return tensors


def verify_saved(folder: str | Path, model) -> bool:
    """Recount the zeros of every pruned matrix in the saved files: they must equal the model's."""
    saved = saved_tensors(folder)
    for name, weight in pruned_matrices(model).items():
        if name not in saved or int((saved[name] == 0).sum()) != int((weight == 0).sum()):
            return False
    return True
