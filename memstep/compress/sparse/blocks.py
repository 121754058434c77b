"""Running decoder blocks one at a time on stored hidden states.

The model's own forward builds what each decoder layer is called with (RoPE cos/sin, the
causal mask, position ids); rather than rebuilding that per family, a pre-hook records every
layer's keyword arguments during one forward of a single window. Windows all have the same
length and no padding, so those (batch-1) tensors broadcast over any batch of windows.
"""

from __future__ import annotations

import torch
from torch import nn

from memstep.cancel import checkpoint
from memstep.errors import MemstepError


class _Stop(Exception):
    pass


def decoder_layers(model) -> nn.ModuleList:
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise MemstepError(f"{type(model).__name__} has no decoder blocks at .model.layers: "
                           "pruning supports Llama-style causal LMs")
    return layers


def layer_kwargs(model, seq_len: int) -> list[dict]:
    """The keyword arguments the model passes each decoder layer for a batch-1 window."""
    layers = decoder_layers(model)
    captured: list[dict] = [{} for _ in layers]

    def recorder(idx):
        def hook(module, args, kwargs):
            captured[idx] = {k: v for k, v in kwargs.items() if k not in ("hidden_states", "cache",
                                                                          "past_key_values", "past_key_value")}
            captured[idx]["use_cache"] = False
            if idx == len(layers) - 1:
                raise _Stop
        return hook

    handles = [layer.register_forward_pre_hook(recorder(i), with_kwargs=True) for i, layer in enumerate(layers)]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            model.model(input_ids=torch.zeros(1, seq_len, dtype=torch.long, device=device), use_cache=False)
    except _Stop:
        pass
    finally:
        for h in handles:
            h.remove()
    return captured


def embed(model, windows: list[list[int]]) -> torch.Tensor:
    """The input of the first decoder block for the windows: (samples, seq_len, hidden)."""
    device = next(model.parameters()).device
    captured = {}

    def hook(module, args, kwargs):
        captured["x"] = (args[0] if args else kwargs["hidden_states"]).detach()
        raise _Stop

    handle = decoder_layers(model)[0].register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.model(input_ids=torch.tensor(windows, device=device), use_cache=False)
    except _Stop:
        pass
    finally:
        handle.remove()
    return captured["x"]


def run_block(blocks, x: torch.Tensor, kwargs: list[dict], first: int, batch_size: int = 8,
              grad: bool = False) -> torch.Tensor:
    """Run ``blocks`` (consecutive decoder layers starting at index ``first``) on ``x`` in batches."""
    outs = []
    with torch.set_grad_enabled(grad):
        for start in range(0, x.shape[0], batch_size):
            checkpoint()
            h = x[start:start + batch_size]
            for offset, block in enumerate(blocks):
                h = call_block(block, h, kwargs[first + offset])
            outs.append(h)
    return torch.cat(outs)


def call_block(block, h: torch.Tensor, kwargs: dict) -> torch.Tensor:
    out = block(h, **kwargs)
    return out[0] if isinstance(out, tuple) else out


def linear_layers(block) -> dict[str, nn.Linear]:
    """The block's linear layers by name (self_attn.q_proj, ..., mlp.down_proj): what gets pruned."""
    return {name: module for name, module in block.named_modules() if isinstance(module, nn.Linear)}


# The first position of every window is the attention sink: from the middle blocks on its hidden
# state carries a massive activation (SmolLM2-135M: norm ~23,000 against ~150 for the other
# tokens), which would be nearly all of ||target||^2 and hide the error on the text itself.
SINK_POSITIONS = 1


def error_parts(out: torch.Tensor, target: torch.Tensor, skip: int = SINK_POSITIONS) -> tuple[list, list]:
    """Per sample: ||out - target||^2 and ||target||^2 over the positions after the first ``skip``."""
    out, target = out[:, skip:].float(), target[:, skip:].float()
    return ((out - target) ** 2).sum(dim=(1, 2)).tolist(), (target ** 2).sum(dim=(1, 2)).tolist()


def normalized_error(out: torch.Tensor, target: torch.Tensor, skip: int = SINK_POSITIONS) -> float:
    """||out - target||^2 / ||target||^2 over all samples and positions after the first ``skip``."""
    out, target = out[:, skip:].float(), target[:, skip:].float()
    return float(((out - target) ** 2).sum() / (target ** 2).sum().clamp_min(1e-30))
