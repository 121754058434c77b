"""Pruning with reconstruction-error minimization: masks.py (magnitude, Wanda, SparseGPT),
reconstruct.py (LR, BR, CR training), calibration.py (text or self-generated windows),
blocks.py (running decoder blocks alone), process.py (the block-by-block generator),
records.py, sparsity.py (counting zeros)."""

from memstep.compress.sparse.process import RECONSTRUCTIONS, SparseConfig, SparsePruning  # noqa: F401
