"""Plain-data records of a pruning run: one per decoder block, and the run's result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class BlockRecord:
    """One pruned (and reconstructed) decoder block.

    Errors are normalized, ||pruned model's hidden state - dense model's||^2 / ||dense's||^2,
    after this block: the error accumulated through every block so far (the seed paper's
    Figure 3 quantity), the first position of each window (the attention sink) left out (see
    blocks.normalized_error). ``*_masked`` is the same right after masking, before reconstruction.
    With CR the window (block-1, block) was reconstructed together, so the values describe
    both blocks' final weights; ``steps`` lists the windows trained at this block, in order (the
    last block under CR: the window, then the block alone)."""

    block: int
    blocks: int
    window: list[int]
    error_calibration_masked: float
    error_calibration: float
    error_held_out_masked: float
    error_held_out: float
    sparsity: float  # zeros / weights over this block's pruned matrices
    matrices: dict[str, float]  # sparsity of each pruned matrix (q_proj, ..., down_proj)
    losses: list[float] = field(default_factory=list)  # reconstruction steps' normalized errors
    seconds_mask: float = 0.0
    seconds_reconstruct: float = 0.0
    seconds: float = 0.0
    steps: list[list[int]] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class SparseResult:
    """The whole run: settings, per-block records, perplexities before/after, sparsity."""

    model: str
    settings: dict
    records: list[BlockRecord]
    perplexity: dict  # {"calibration": {"dense": x, "pruned": y}, "held_out": {...}}
    sparsity: float  # zeros / weights over every pruned matrix of the model
    matrices: dict[str, float]  # every pruned matrix by parameter name
    calibration_tokens: int
    held_out_tokens: int
    calibration_preview: list[str]  # the first calibration samples, decoded (see what self-generation made)
    seconds: float
    output: str | None = None
    verified: bool | None = None
    mask_tokens: int = 0  # calibration tokens the masks' statistics came from (0: magnitude needs none)
    generated_windows: int = 0  # self-generated windows among the reconstruction's calibration windows
    real_windows: int = 0  # windows of real text among them
    generated_texts: int = 0  # texts the model wrote, the generated windows' pool
    epochs: int | None = None  # passes over the reconstruction windows per block (None: --steps set the count)
    steps: int = 0  # optimizer steps per block (or window) of reconstruction; 0 without reconstruction
    steps_per_epoch: int = 0  # mini-batches in one pass over the reconstruction windows
    # per held-out window: mean next-token NLL (nats) of the dense and the pruned model, and the
    # parts of the final normalized error (||pruned - dense||^2, ||dense||^2 after the last block)
    held_out_windows: dict = field(default_factory=dict)

    @property
    def final_error(self) -> dict:
        last = self.records[-1]
        return {"calibration": last.error_calibration, "held_out": last.error_held_out}

    def to_dict(self) -> dict:
        out = asdict(self)
        out["records"] = [r.to_dict() for r in self.records]
        out["final_error"] = self.final_error
        return out
