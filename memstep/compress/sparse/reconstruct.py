"""Reconstruction with the mask fixed: fit the surviving weights to the dense model's outputs.

- LR (layer-wise): each linear layer alone, min ||(m*W) X - W_dense X||^2 on the layer's
  calibration inputs X, in mini-batches of samples like BR.
- BR (block-wise) and CR (cross-block, a window of consecutive blocks): train the blocks'
  surviving weights on mini-batches so their output matches a target (the dense block's
  output; with GP the dense *model's* output, see process.py). ``train="norms"`` trains every
  parameter of the blocks as the reference code does (the surviving linear weights, biases and
  the norms' gains); ``train="linear"`` only the surviving linear weights.

Zeros stay zeros: gradients of pruned weights are masked before each step (so Adam's moments
never move them) and the mask is re-applied after each step.
"""

from __future__ import annotations

import torch

from memstep.cancel import checkpoint
from memstep.compress.sparse.blocks import call_block, linear_layers
from memstep.compress.sparse.config import OPTIMIZERS, TrainOptions  # noqa: F401 (re-exported)

def make_optimizer(params: list, options: TrainOptions):
    """torch.optim with the paper's settings (no weight decay), the learning rate decaying
    linearly to zero over the steps."""
    if options.optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=options.lr, momentum=0.9)
    elif options.optimizer == "adamw":  # the reference's AdamW: betas (0.9, 0.95), no weight decay
        opt = torch.optim.AdamW(params, lr=options.lr, betas=(0.9, 0.95), weight_decay=0.0)
    else:
        opt = torch.optim.Adam(params, lr=options.lr)
    return opt, torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.0, total_iters=options.steps)


def _masked_step(opt, sched, pairs) -> None:
    """One step; a pair's keep mask (None: a parameter that is not pruned) zeroes its gradient
    and, after the step, its pruned entries."""
    for weight, keep in pairs:
        if keep is not None and weight.grad is not None:
            weight.grad.mul_(keep)
    opt.step()
    sched.step()
    with torch.no_grad():
        for weight, keep in pairs:
            if keep is not None:
                weight.mul_(keep)


def epoch_batches(samples: int, batch: int, steps: int, generator: torch.Generator):
    """``steps`` mini-batches of sample indices: passes (epochs) over all ``samples``, each in a
    fresh shuffled order cut into batches of ``batch`` (the last one of a pass may be smaller),
    as the reference's data loader goes; the last pass stops where the steps end."""
    done = 0
    while done < steps:
        order = torch.randperm(samples, generator=generator).tolist()
        for start in range(0, samples, batch):
            if done == steps:
                return
            yield order[start:start + batch]
            done += 1


def _fit(pairs: list, samples: int, options: TrainOptions, seed: int, batch_loss) -> list[float]:
    """Train the weights of ``pairs`` [(weight, keep mask)] for ``options.steps`` steps on shuffled
    mini-batches of sample indices (``epoch_batches``); ``batch_loss(indices)`` gives a batch's
    loss. Returns the losses."""
    for weight, _ in pairs:
        weight.requires_grad_(True)
    opt, sched = make_optimizer([w for w, _ in pairs], options)
    generator = torch.Generator().manual_seed(seed)
    losses = []
    try:
        with torch.enable_grad():
            for idx in epoch_batches(samples, min(options.batch_size, samples), options.steps, generator):
                checkpoint()
                loss = batch_loss(idx)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                _masked_step(opt, sched, pairs)
                losses.append(float(loss.detach()))
    finally:
        for weight, _ in pairs:
            weight.requires_grad_(False)
            weight.grad = None
    return losses


def train_blocks(blocks: list, first: int, kwargs: list[dict], masks: list[dict], x: torch.Tensor,
                 target: torch.Tensor, options: TrainOptions) -> list[float]:
    """BR (one block) or CR (a window): train the surviving linear weights of ``blocks`` (decoder
    layers ``first``, ``first+1``, ...), and with ``options.train == "norms"`` every other
    parameter of theirs too, so that blocks(x) matches ``target``. Returns the normalized error
    of each step's mini-batch."""
    pairs = []
    for block, keeps in zip(blocks, masks):
        block.requires_grad_(False)
        weights = [(linear.weight, keeps[name]) for name, linear in linear_layers(block).items()]
        pairs += weights
        if options.train == "norms":
            masked = {id(weight) for weight, _ in weights}
            pairs += [(param, None) for param in block.parameters() if id(param) not in masked]

    def batch_loss(idx):
        h = x[idx]
        for offset, block in enumerate(blocks):
            h = call_block(block, h, kwargs[first + offset])
        t = target[idx]
        return ((h - t) ** 2).mean() / (t ** 2).mean().clamp_min(1e-30)

    return _fit(pairs, x.shape[0], options, options.seed + first, batch_loss)


def train_layer(linear, dense_weight: torch.Tensor, inputs: torch.Tensor, keep: torch.Tensor,
                options: TrainOptions) -> list[float]:
    """LR for one linear layer: on mini-batches of its calibration inputs (samples, tokens, in),
    min ||(m*W - W_dense) x||^2 / ||W_dense x||^2. Returns each step's normalized error."""
    dense = dense_weight.detach()

    def batch_loss(idx):
        x = inputs[idx]
        target = x @ dense.T
        return ((x @ linear.weight.T - target) ** 2).sum() / (target ** 2).sum().clamp_min(1e-30)

    return _fit([(linear.weight, keep)], inputs.shape[0], options, options.seed, batch_loss)
