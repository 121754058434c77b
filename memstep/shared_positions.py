"""Shared compact RoPE positions (``rope shared``).

Compact positions (the reference code's) put each KV head's memory at 0..m-1 on its own, so
one token sits at a different position in every head and layer that keeps it: the model reads
a different text in each. Shared positions keep the memory as short as the tokens it holds, and
give every layer and head the same text: each memory entry sits at its token's rank among all
the document positions the memory holds in any layer or head, the entries read after the
memory (the chunk, the question, the answer) right after the last rank. Where every head keeps
the same tokens they are the compact positions; where nothing is evicted, the document's.
"""

from __future__ import annotations

import torch


def held_tokens(positions: list[torch.Tensor]) -> torch.Tensor:
    """The sorted document positions the memory holds in any layer or KV head."""
    held = [p.flatten() for p in positions if p.numel()]
    if not held:
        return torch.zeros(0, dtype=torch.long)
    return torch.unique(torch.cat([p.to(held[0].device) for p in held]))


def shared_positions(held: torch.Tensor, memory: torch.Tensor, later: int) -> torch.Tensor:
    """RoPE positions (kv_heads, m + later) of one layer's cache: its memory entries ``memory``
    (kv_heads, m; document positions) at their rank in ``held``, then ``later`` entries read
    after the memory at len(held), len(held) + 1, ..."""
    held = held.to(memory.device)
    ranks = torch.searchsorted(held, memory)
    after = len(held) + torch.arange(later, device=memory.device)
    return torch.cat([ranks, after[None].expand(memory.shape[0], -1)], dim=1)
