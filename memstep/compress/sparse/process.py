"""Prune a causal LM block by block with reconstruction-error minimization (Shin et al.,
EMNLP 2024, "Rethinking Pruning Large Language Models").

For every decoder block, in order:
1. the dense block's copy runs on the block's inputs from the pruned model so far; hooks
   collect each linear layer's input Gram matrix X^T X (Wanda's feature norms are its diagonal,
   SparseGPT's Hessian is the matrix itself);
2. each linear layer gets its mask (magnitude, Wanda or SparseGPT, which also updates the
   surviving weights); embeddings and the LM head are never pruned;
3. reconstruction with the mask fixed:
   none; LR (each linear layer to the dense layer's output on the same inputs);
   BR (the block's output on the pruned model's inputs to the dense block's output on those
   same inputs); BR+GP (the target is the dense *model's* output at this block: inputs come
   from the pruned model, targets from the dense one); BR+GP+CR (the window of this block and
   the previous one trained together towards the dense model's output, so the windows overlap
   and stitch the blocks; as in the reference code, block 0 is first trained alone and, after
   the last window, the last block alone once more: blocks + 1 trainings in all);
4. the pruned model's hidden states move on to the next block, and the dense model's too.

``SparsePruning`` is iterable: it yields one BlockRecord per block as it goes (the CLI's
progress bar, the app's curves and the benchmark all read the same records), then holds the
SparseResult.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict

import torch

from memstep.cancel import checkpoint
from memstep.compress.data import pooled_perplexity, save_model, window_nlls
from memstep.compress.sparse.blocks import (decoder_layers, embed, error_parts, layer_kwargs, linear_layers,
                                            normalized_error, run_block)
from memstep.compress.sparse.calibration import calibration_set, held_out_windows
from memstep.compress.sparse.config import RECONSTRUCTIONS, SparseConfig  # noqa: F401 (re-exported)
from memstep.compress.sparse.masks import magnitude_mask, sparsegpt_prune, wanda_mask
from memstep.compress.sparse.records import BlockRecord, SparseResult
from memstep.compress.sparse.reconstruct import train_blocks, train_layer
from memstep.compress.sparse.sparsity import count_sparsity, pruned_matrices, verify_saved
from memstep.errors import MemstepError

def _collect_inputs(block, x: torch.Tensor, kwargs: list[dict], idx: int, batch_size: int, want_grams: bool,
                    keep_inputs: bool, stats: tuple[int, int] | None = None, recon: int | None = None):
    """Run the (dense) block on x; return its outputs, each linear layer's input Gram matrix X^T X
    over the samples ``x[stats[0]:stats[1]]`` (all by default) and, when ``keep_inputs``, the
    inputs themselves (samples, tokens, in) of the first ``recon`` samples, for LR."""
    grams: dict[str, torch.Tensor] = {}
    inputs: dict[str, list] = {}
    stats = stats or (0, x.shape[0])
    recon = x.shape[0] if recon is None else recon
    batch = {"stats": False, "recon": False}  # what the batch running now feeds

    def hook(name):
        def record(module, args):
            inp = args[0].detach()
            if want_grams and batch["stats"]:
                flat = inp.reshape(-1, inp.shape[-1]).float()
                grams[name] = grams.get(name, 0) + flat.T @ flat
            if keep_inputs and batch["recon"]:
                inputs.setdefault(name, []).append(inp)
        return record

    # batches never straddle a boundary, so each one either feeds the statistics or not
    bounds = sorted({0, x.shape[0], *stats, recon} & set(range(x.shape[0] + 1)))
    handles = [lin.register_forward_pre_hook(hook(name)) for name, lin in linear_layers(block).items()]
    outs = []
    try:
        for a, b in zip(bounds, bounds[1:]):
            batch["stats"], batch["recon"] = stats[0] <= a < stats[1], a < recon
            outs.append(run_block([block], x[a:b], kwargs, idx, batch_size))
    finally:
        for h in handles:
            h.remove()
    return torch.cat(outs), grams, {name: torch.cat(parts) for name, parts in inputs.items()}


def prune_block(block, grams: dict, tokens: int, config: SparseConfig) -> dict[str, torch.Tensor]:
    """Mask every linear layer of ``block`` in place; return the keep masks by layer name."""
    pattern, masks = config.pattern, {}
    with torch.no_grad():
        for name, linear in linear_layers(block).items():
            w = linear.weight
            if config.method == "magnitude":
                keep = magnitude_mask(w, pattern)
            elif config.method == "wanda":
                keep = wanda_mask(w, torch.diag(grams[name]).clamp_min(0).sqrt(), pattern)
            else:
                new, keep = sparsegpt_prune(w, grams[name] / tokens, pattern, config.block_columns, config.damp)
                w.copy_(new)
            w.mul_(keep.to(w.device))
            masks[name] = keep.to(w.device)
    return masks


class SparsePruning:
    """Iterate to prune ``lm`` (a memstep LoadedModel, changed in place) block by block."""

    def __init__(self, lm, config: SparseConfig, output: str | None = None, info: dict | None = None,
                 dense_perplexity: dict | None = None, calibration_text: str | None = None, calibration=None):
        """``dense_perplexity``: {"calibration": x, "held_out": y} measured before on the same windows
        (a benchmark reuses it across runs); measured here when None. ``calibration_text``: the
        user's own calibration text (the bundled novel when None). ``calibration``: a
        CalibrationSet made before for the same settings (a benchmark reuses self-generated text)."""
        self.lm, self.config, self.output = lm, config.validate(), output
        self.dense_perplexity = dense_perplexity
        self.calibration_text, self.calibration = calibration_text, calibration
        self.info = info or {}
        self.records: list[BlockRecord] = []
        self.result: SparseResult | None = None

    def __iter__(self):
        cfg, model, tok = self.config, self.lm.model, self.lm.tokenizer
        started = time.perf_counter()
        layers = decoder_layers(model)
        model.requires_grad_(False)
        self.calibration = self.calibration or calibration_set(model, tok, cfg, self.calibration_text)
        windows, n = self.calibration.windows, self.calibration.recon
        calib = windows[:n]  # reconstruction's windows; any after them only feed the masks
        held = held_out_windows(tok, cfg.held_out_samples, cfg.seq_len)
        dense_held = None if self.dense_perplexity else window_nlls(model, held)
        ppl_dense = self.dense_perplexity or {"calibration": pooled_perplexity(window_nlls(model, calib)),
                                              "held_out": pooled_perplexity(dense_held)}
        kwargs = layer_kwargs(model, cfg.seq_len)
        xp = xd = embed(model, windows)  # calibration: pruned model's / dense model's hidden states
        hp = hd = embed(model, held)  # held-out: the same
        xp_prev = hp_prev = None
        masks: list[dict] = []
        bs = max(1, cfg.batch_size)
        stats = self.calibration.stats
        tokens = (stats[1] - stats[0]) * xp.shape[1]
        for idx, block in enumerate(layers):
            checkpoint()
            t0 = time.perf_counter()
            dense = copy.deepcopy(block)
            # the dense block on the pruned model's inputs: BR's target, the masks' statistics, LR's inputs
            y_local, grams, inputs = _collect_inputs(dense, xp, kwargs, idx, bs, cfg.method != "magnitude",
                                                       cfg.reconstruct == "lr", stats, n)
            yd = run_block([dense], xd, kwargs, idx, bs)  # the dense model's output at this block
            hyd = run_block([dense], hd, kwargs, idx, bs)
            masks.append(prune_block(block, grams, tokens, cfg))
            xp_masked = run_block([block], xp, kwargs, idx, bs)
            hp_masked = run_block([block], hp, kwargs, idx, bs)
            err_cal_masked, err_held_masked = normalized_error(xp_masked[:n], yd[:n]), normalized_error(hp_masked, hyd)
            t1 = time.perf_counter()
            losses, steps = self._reconstruct(idx, block, dense, masks, inputs, kwargs, xp, xp_prev, y_local, yd)
            window = sorted({i for step in steps for i in step})
            if cfg.reconstruct == "none":
                xp_next, hp_next = xp_masked, hp_masked
            elif window[0] < idx:  # CR changed the previous block too: re-run the window from its input
                xp_next = run_block(layers[idx - 1:idx + 1], xp_prev, kwargs, idx - 1, bs)
                hp_next = run_block(layers[idx - 1:idx + 1], hp_prev, kwargs, idx - 1, bs)
            else:
                xp_next = run_block([block], xp, kwargs, idx, bs)
                hp_next = run_block([block], hp, kwargs, idx, bs)
            t2 = time.perf_counter()
            matrices = {name: count_sparsity(lin.weight) for name, lin in linear_layers(block).items()}
            zeros = sum(int((lin.weight == 0).sum()) for lin in linear_layers(block).values())
            weights = sum(lin.weight.numel() for lin in linear_layers(block).values())
            record = BlockRecord(
                block=idx, blocks=len(layers), window=window, steps=steps,
                error_calibration_masked=err_cal_masked, error_calibration=normalized_error(xp_next[:n], yd[:n]),
                error_held_out_masked=err_held_masked, error_held_out=normalized_error(hp_next, hyd),
                sparsity=zeros / weights, matrices=matrices, losses=losses,
                seconds_mask=t1 - t0, seconds_reconstruct=t2 - t1, seconds=t2 - t0)
            self.records.append(record)
            xp_prev, hp_prev = xp, hp
            xp, hp, xd, hd = xp_next, hp_next, yd, hyd
            del dense, grams, inputs, y_local, xp_masked, hp_masked
            yield record
        pruned_held = window_nlls(model, held)
        ppl_pruned = {"calibration": pooled_perplexity(window_nlls(model, calib)),
                      "held_out": pooled_perplexity(pruned_held)}
        squared, reference = error_parts(hp, hd)  # after the last block: the pruned and the dense model's states
        windows_held = {"nll_pruned": [t / n for t, n in pruned_held], "error_squared": squared,
                        "error_reference": reference}
        if dense_held is not None:
            windows_held["nll_dense"] = [t / n for t, n in dense_held]
        weights = pruned_matrices(model)
        matrices = {name: count_sparsity(w) for name, w in weights.items()}
        all_zeros = sum(int((w == 0).sum()) for w in weights.values())
        all_weights = sum(w.numel() for w in weights.values())
        self.result = SparseResult(
            model=self.lm.name, settings=asdict(cfg), records=self.records,
            perplexity={k: {"dense": ppl_dense[k], "pruned": ppl_pruned[k]} for k in ppl_dense},
            sparsity=all_zeros / all_weights, matrices=matrices,
            calibration_tokens=len(calib) * cfg.seq_len, held_out_tokens=len(held) * cfg.seq_len,
            mask_tokens=tokens if cfg.method != "magnitude" else 0, generated_windows=self.calibration.generated,
            real_windows=n - self.calibration.generated, generated_texts=self.calibration.texts,
            epochs=None if cfg.reconstruct == "none" or cfg.steps is not None else cfg.epochs,
            steps=0 if cfg.reconstruct == "none" else cfg.training_steps,
            steps_per_epoch=cfg.steps_per_epoch, held_out_windows=windows_held,
            calibration_preview=[tok.decode(ids[:48]) for ids in calib[-2:]],
            seconds=time.perf_counter() - started)
        if self.output:
            info = {"method": "sparse", "source_model": self.lm.name, "settings": asdict(cfg),
                    "sparsity": self.result.sparsity, "perplexity": self.result.perplexity, **self.info}
            save_model(model, tok, self.output, info)
            self.result.output = str(self.output)
            self.result.verified = verify_saved(self.output, model)
            if not self.result.verified:
                raise MemstepError(f"the saved model in {self.output} lost zeros: its sparsity does not match")

    def _reconstruct(self, idx, block, dense, masks, inputs, kwargs, xp, xp_prev, y_local, yd):
        """Apply the configured reconstruction on the reconstruction windows; returns (step losses,
        the windows of blocks trained, in order)."""
        cfg, opts, n = self.config, self.config.train, self.calibration.recon
        if cfg.reconstruct == "none":
            return [], [[idx]]
        if cfg.reconstruct == "lr":
            dense_layers = linear_layers(dense)
            losses = []
            for name, linear in linear_layers(block).items():
                checkpoint()
                losses += train_layer(linear, dense_layers[name].weight, inputs[name], masks[idx][name], opts)[-1:]
            return losses, [[idx]]
        if cfg.reconstruct == "br":
            return train_blocks([block], idx, kwargs, [masks[idx]], xp[:n], y_local[:n], opts), [[idx]]
        if cfg.reconstruct == "br+gp" or idx == 0:
            return train_blocks([block], idx, kwargs, [masks[idx]], xp[:n], yd[:n], opts), [[idx]]
        layers = decoder_layers(self.lm.model)  # br+gp+cr: the window (idx-1, idx)
        losses = train_blocks([layers[idx - 1], block], idx - 1, kwargs, masks[idx - 1:idx + 1], xp_prev[:n], yd[:n],
                              opts)
        if idx < len(layers) - 1:
            return losses, [[idx - 1, idx]]
        # the reference's last round: the last block alone, on its input from the final previous block
        x_last = run_block([layers[idx - 1]], xp_prev[:n], kwargs, idx - 1, max(1, cfg.batch_size))
        losses += train_blocks([block], idx, kwargs, [masks[idx]], x_last, yd[:n], opts)
        return losses, [[idx - 1, idx], [idx]]
