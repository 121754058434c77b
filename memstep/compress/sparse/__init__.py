"""Pruning with reconstruction-error minimization: config.py (settings, no torch), masks.py
(magnitude, Wanda, SparseGPT), reconstruct.py (LR, BR, CR training), calibration.py (text or
self-generated windows), blocks.py (running decoder blocks alone), process.py (the
block-by-block generator), records.py, sparsity.py (counting zeros)."""

from memstep.compress.sparse.config import RECONSTRUCTIONS, SparseConfig  # noqa: F401


def __getattr__(name):  # SparsePruning imports torch: only when asked for
    if name == "SparsePruning":
        from memstep.compress.sparse.process import SparsePruning

        return SparsePruning
    raise AttributeError(name)
