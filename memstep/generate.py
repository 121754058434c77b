"""After the prefill: answer a question from the compressed memory, or score a held-out
continuation given it.

The prompt is split around the document by the model's chat template: the template's
head (system + user turn opening) is prefilled with the document under the schedule; the
question and the assistant opening are appended after the compressed memory, never
compressed (question place "after"), or, as the reference code does (question place
"prompt"), prefilled and compressed with the document: the first answer token then comes
from the last chunk's logits (``answer_from_prefill``). Their RoPE positions continue from
the engine's ``position``: right after the compact memory (rope compact) or after the true
end of the document (rope document).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from memstep.engine import ChunkedPrefill

_MARK = "\u2063DOCUMENT\u2063"  # an invisible separator no real document contains


@dataclass(frozen=True)
class PromptParts:
    head: list[int]  # tokens before the document (prefilled, may be compressed)
    tail: list[int]  # tokens after the document up to the question


def prompt_parts(tokenizer, question: str | None = None) -> PromptParts:
    """Token ids around the document: chat template where the model has one, else a plain
    "Document ... Question: ... Answer:" frame."""
    body = f"{_MARK}\n\nQuestion: {question}" if question else _MARK
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                             add_generation_prompt=True)
    else:
        text = f"{body}\nAnswer:" if question else body
    head, tail = text.split(_MARK)
    encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"] if s else []  # noqa: E731
    return PromptParts(encode(head), encode(tail))


def _extend(engine: ChunkedPrefill, ids: list[int], logits_to_keep: int | None = None) -> torch.Tensor:
    """Append tokens after the memory (no eviction) and return their logits."""
    hidden = engine.forward(torch.tensor([ids]), engine.position)
    with torch.inference_mode():
        if logits_to_keep:
            hidden = hidden[:, -logits_to_keep:]
        logits = engine.model.get_output_embeddings()(hidden)[0].float()
    engine.tokens_seen += len(ids)
    engine.position += len(ids)
    return logits


def answer(engine: ChunkedPrefill, tokenizer, question: str, max_new_tokens: int = 32) -> str:
    """Greedy answer to ``question`` from the engine's compressed memory.

    The memory must have been prefilled from ``prompt_parts(tokenizer).head`` + document."""
    tail = prompt_parts(tokenizer, question).tail
    return _greedy(engine, tokenizer, _extend(engine, tail, logits_to_keep=1), max_new_tokens)


def answer_from_prefill(engine: ChunkedPrefill, tokenizer, max_new_tokens: int = 32) -> str:
    """Greedy answer when the question ended the prefilled prompt (the reference code's way):
    the first token from the last chunk's logits (attention over the memory before that step's
    cut and the chunk), the next ones decoded over the compressed memory."""
    with torch.inference_mode():
        logits = engine.model.get_output_embeddings()(engine.last_hidden).float()
    return _greedy(engine, tokenizer, logits, max_new_tokens)


def _greedy(engine: ChunkedPrefill, tokenizer, logits: torch.Tensor, max_new_tokens: int) -> str:
    """Greedy decoding from ``logits`` (the last row predicts the first token) over the memory."""
    eos = set(_as_list(getattr(engine.model.generation_config, "eos_token_id", None)))
    eos |= set(_as_list(tokenizer.eos_token_id))
    out: list[int] = []
    for _ in range(max_new_tokens):
        token = int(logits[-1].argmax())
        if token in eos:
            break
        out.append(token)
        logits = _extend(engine, [token], logits_to_keep=1)
    return tokenizer.decode(out, skip_special_tokens=True).strip()


def continuation_nll(engine: ChunkedPrefill, held_out: list[int]) -> float:
    """Mean negative log-likelihood (nats/token) of ``held_out`` following the memory."""
    with torch.inference_mode():
        first = engine.model.get_output_embeddings()(engine.last_hidden).float()
    rest = _extend(engine, held_out[:-1]) if len(held_out) > 1 else first[:0]
    logits = torch.cat([first, rest])
    target = torch.tensor(held_out, device=logits.device)
    return float(torch.nn.functional.cross_entropy(logits, target))


def memory_mark(engine: ChunkedPrefill) -> tuple[list[int], int, int]:
    """What ``crop_memory`` needs to undo later appends: entries per layer, tokens seen, position."""
    return [layer.keys.shape[2] for layer in engine.cache.layers], engine.tokens_seen, engine.position


def crop_memory(engine: ChunkedPrefill, mark: tuple[list[int], int, int]) -> None:
    """Drop everything appended after ``memory_mark`` (a scored continuation, an answer)."""
    entries, engine.tokens_seen, engine.position = mark
    for layer, n in zip(engine.cache.layers, entries):
        layer.keys, layer.values = layer.keys[:, :, :n], layer.values[:, :, :n]


def _as_list(value) -> list:
    if value is None:
        return []
    return list(value) if isinstance(value, (list, tuple)) else [value]
