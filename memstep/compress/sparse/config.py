"""The settings of a pruning run, checked without torch (the CLI builds its parser from these
names, and `memstep plan` / `memstep schedule` must stay free of torch imports)."""

from __future__ import annotations

from dataclasses import dataclass

from memstep.errors import MemstepError

METHODS = ("magnitude", "wanda", "sparsegpt")
# Calibration sources: real text; self-generated windows only; "both" splits --samples in half;
# "add" is the reference code's gen_add: --samples real windows plus --self-samples generated
# ones added to them ("additional calibration data"), reconstruction training on all of them.
SOURCES = ("text", "self", "both", "add")
# What reconstruction trains: "norms" = every parameter of the block (surviving linear weights,
# biases and the norms' gains), as the reference code (LOG-postech/rethinking-LLM-pruning) does;
# "linear" = the surviving linear weights only.
TRAINABLE = ("norms", "linear")
# Which calibration windows the masks' statistics come from: "real" text only (the reference's
# masks never see self-generated data), or "all" windows reconstruction uses.
MASK_DATA = ("real", "all")


@dataclass(frozen=True)
class Pattern:
    """Unstructured ``sparsity`` or N:M (``n`` of every ``m`` survive)."""

    sparsity: float = 0.5
    n: int = 0
    m: int = 0

    @property
    def nm(self) -> bool:
        return self.m > 0

    @property
    def target(self) -> float:
        """The fraction of weights pruned."""
        return 1 - self.n / self.m if self.nm else self.sparsity

    def label(self) -> str:
        return f"{self.n}:{self.m}" if self.nm else f"{self.sparsity:.0%} unstructured"

    def validate(self) -> "Pattern":
        if self.nm:
            if not (0 < self.n < self.m):
                raise MemstepError(f"N:M needs 0 < N < M (got {self.n}:{self.m}), e.g. --nm 2:4")
        elif not (0 < self.sparsity < 1):
            raise MemstepError(f"--sparsity must lie strictly between 0 and 1 (got {self.sparsity:g})")
        return self


def parse_nm(text: str) -> Pattern:
    """'2:4' -> Pattern(n=2, m=4)."""
    try:
        n, m = (int(part) for part in str(text).split(":"))
    except ValueError:
        raise MemstepError(f"N:M must look like 2:4 (got '{text}')") from None
    return Pattern(n=n, m=m).validate()


OPTIMIZERS = ("adam", "adamw", "sgd")


@dataclass(frozen=True)
class TrainOptions:
    optimizer: str = "adam"
    lr: float = 1e-3
    steps: int = 20
    batch_size: int = 4
    seed: int = 0
    train: str = "norms"

    def validate(self) -> "TrainOptions":
        if self.train not in TRAINABLE:
            raise MemstepError(f"unknown --train '{self.train}': choose {' or '.join(TRAINABLE)}")
        if self.optimizer not in OPTIMIZERS:
            raise MemstepError(f"unknown optimizer '{self.optimizer}': choose one of {', '.join(OPTIMIZERS)}")
        if not self.lr > 0:
            raise MemstepError(f"--lr must be positive (got {self.lr:g})")
        if self.steps < 1:
            raise MemstepError(f"--steps must be at least 1 (got {self.steps})")
        if self.batch_size < 1:
            raise MemstepError(f"--batch-size must be at least 1 (got {self.batch_size})")
        return self


RECONSTRUCTIONS = ("none", "lr", "br", "br+gp", "br+gp+cr")


@dataclass
class SparseConfig:
    """Defaults sized for the embedded 135M model on a 2-core CPU: a few minutes for BR+GP."""

    method: str = "wanda"
    sparsity: float = 0.5
    nm: str | None = None  # "2:4": N:M instead of unstructured
    reconstruct: str = "br+gp"
    calibration: str = "text"
    calibration_file: str | None = None  # the name of the user's text (the text itself is passed apart)
    mask_data: str = "real"
    samples: int = 16
    seq_len: int = 128
    self_length: int = 512  # tokens per self-generated text (the reference: 2048)
    self_samples: int | None = None  # "add": generated windows added to the real ones (default: as many)
    self_texts: int | None = None  # texts the model writes, the windows' pool (default: one per generated window)
    held_out_samples: int = 8
    optimizer: str = "adam"
    lr: float = 1e-3
    epochs: int = 5  # passes over every reconstruction window per block, as the reference trains
    steps: int | None = None  # optimizer steps per block (or window) instead of epochs
    batch_size: int = 4
    damp: float = 0.01  # SparseGPT: damping, a fraction of the Hessian's mean diagonal
    block_columns: int = 128  # SparseGPT: columns per block of the OBS update
    seed: int = 0
    train_params: str = "norms"

    @property
    def pattern(self) -> Pattern:
        return parse_nm(self.nm) if self.nm else Pattern(sparsity=self.sparsity).validate()

    @property
    def generated_samples(self) -> int:
        """How many self-generated windows the calibration holds."""
        return {"text": 0, "self": self.samples, "both": self.samples - self.samples // 2,
                "add": self.self_samples or self.samples}.get(self.calibration, 0)

    @property
    def pool_texts(self) -> int:
        """How many texts the model writes for the generated windows to be drawn from."""
        return self.self_texts or self.generated_samples

    @property
    def recon_windows(self) -> int:
        """The windows reconstruction trains on: every real and generated one (masks-only real
        windows of ``self`` calibration excluded)."""
        return self.samples + (self.generated_samples if self.calibration == "add" else 0)

    @property
    def steps_per_epoch(self) -> int:
        """Mini-batches in one pass over the reconstruction windows (the last one may be smaller)."""
        return -(-self.recon_windows // min(self.batch_size, self.recon_windows))

    @property
    def training_steps(self) -> int:
        """Optimizer steps per block (or window): ``steps`` when given, else ``epochs`` passes
        over every reconstruction window, so more windows train more steps (the reference's rule)."""
        return self.steps if self.steps is not None else self.epochs * self.steps_per_epoch

    @property
    def train(self) -> TrainOptions:
        return TrainOptions(self.optimizer, self.lr, self.training_steps, self.batch_size, self.seed,
                            self.train_params)

    def validate(self) -> "SparseConfig":
        if self.method not in METHODS:
            raise MemstepError(f"unknown pruning method '{self.method}': choose one of {', '.join(METHODS)}")
        if self.reconstruct not in RECONSTRUCTIONS:
            raise MemstepError(f"unknown reconstruction '{self.reconstruct}': choose one of "
                               f"{', '.join(RECONSTRUCTIONS)}")
        if self.calibration not in SOURCES:
            raise MemstepError(f"unknown calibration '{self.calibration}': choose one of {', '.join(SOURCES)} "
                               "or give a text file (.txt, .md, .pdf, .html)")
        if self.mask_data not in MASK_DATA:
            raise MemstepError(f"unknown --mask-data '{self.mask_data}': choose {' or '.join(MASK_DATA)}")
        if self.calibration != "text" and self.self_length < self.seq_len:
            raise MemstepError(f"--self-length ({self.self_length}) must be at least --seq-len ({self.seq_len}): "
                               "each self-generated text is cut into windows of --seq-len tokens")
        if self.self_samples is not None and self.self_samples < 1:
            raise MemstepError(f"--self-samples must be at least 1 (got {self.self_samples})")
        if self.self_texts is not None and self.self_texts < 1:
            raise MemstepError(f"--self-texts must be at least 1 (got {self.self_texts})")
        if self.epochs < 1:
            raise MemstepError(f"--epochs must be at least 1 (got {self.epochs})")
        if self.steps is not None and self.steps < 1:
            raise MemstepError(f"--steps must be at least 1 (got {self.steps})")
        if self.samples < 1 or self.held_out_samples < 1:
            raise MemstepError("--samples and --held-out-samples must be at least 1")
        if self.seq_len < 2:
            raise MemstepError(f"--seq-len must be at least 2 tokens (got {self.seq_len})")
        if self.damp <= 0 or self.block_columns < 1:
            raise MemstepError("--damp must be positive and --block-columns at least 1")
        self.pattern  # noqa: B018 (raises on a bad sparsity or N:M)
        if self.reconstruct != "none":
            self.train.validate()
        return self


