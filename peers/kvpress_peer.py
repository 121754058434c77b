"""The kvpress side of `memstep eval`: one press (or none: the plain Hugging Face full
cache) on the cases of a job, run with the python of the kvpress virtualenv:

    .venv-kvpress/bin/python peers/kvpress_peer.py JOB.json

kvpress 0.5.5 needs transformers<5.3, so this runs in its own virtualenv and speaks to
memstep only through the job file (token ids, prepared by memstep) and JSON lines on
stdout (memstep.evaluation.process). The whole context is prefilled in one pass with the
press's hooks compressing each layer to the same final budget as memstep (budget + sinks
entries of the document); then the question is answered greedily and the held-out
continuation is scored over the document's memory, with the positions kvpress's own
pipeline uses (true positions; after a press that re-rotates keys, the cache's length).

Each press is set as its authors set it, and those settings go into every cell:
question-aware, the question ends the compressed context (SnapKV's observation window is
the question, as in its paper; ChunkKV wraps that SnapKV and keeps whole chunks of 20;
Finch reads the question after a delimiter and keeps the top entries over the whole context,
as kvpress's evaluation registry runs it); KeyDiff runs block-wise (BlockPress, as kvpress's
docstring says reproduces its paper), question-agnostic like Knorm and StreamingLLM.

On a model with sliding-window layers (Gemma 3) the presses compress the global layers only
and the sliding ones keep every entry (kvpress's own rule for Gemma 3); each layer kind then
gets its own attention mask for the tokens read after the press.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # memstep's model loader

import torch  # noqa: E402

from memstep.evaluation.process import emit, load_job, model_identity, serve_cases, serve_jobs  # noqa: E402


# finch as kvpress's evaluation registry runs it (FinchPress(): one top-k over the whole context,
# keys re-rotated); two variants that tell its parts apart: chunk by chunk, and keys left at
# their document positions
FINCH = ("finch", "finch-chunked", "finch-unrotated")
QUESTION_PRESSES = FINCH
AGNOSTIC_PRESSES = ("keydiff", "knorm", "streaming-llm")
CHUNKKV_CHUNK = 20  # ChunkKV's paper and kvpress default
KEYDIFF_BLOCK = 128  # kvpress BlockPress default, its KeyDiff docstring's recipe
SNAPKV_KERNEL = 5  # kvpress and the SnapKV paper
SNAPKV_MAX_KERNEL = 15  # snapkv-max15: the SnapKV code's max-pooling option, 15 keys wide


def max_pooled_snapkv(kvpress, window: int, kernel: int):
    """kvpress's SnapKVPress with its pooling switched from avg_pool1d to max_pool1d (the SnapKV
    authors' code offers both); everything else as kvpress scores it."""
    import torch.nn.functional as F

    class MaxPooledSnapKVPress(kvpress.SnapKVPress):
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            batch, kv_heads, length, _ = keys.shape
            groups = module.config.num_attention_heads // kv_heads
            if attentions is not None:
                weights = attentions[..., -self.window_size:, :-self.window_size]
            else:
                weights = self.compute_window_attention(module, hidden_states, keys, self.window_size,
                                                        kwargs["position_embeddings"])
            scores = F.max_pool1d(weights.mean(dim=-2), kernel_size=self.kernel_size,
                                  padding=self.kernel_size // 2, stride=1)
            scores = scores.view(batch, kv_heads, groups, length - self.window_size).mean(2)
            return F.pad(scores, (0, self.window_size), value=scores.max().item() + 1)  # the window stays

    return MaxPooledSnapKVPress(window_size=window, kernel_size=kernel)


def make_press(name: str | None, aware: bool, question_tokens: int, window: int = 64, chunk: int = 512):
    """The kvpress press for a peer configuration and its settings as recorded; (None, {}) =
    no compression (HF full cache). ``window``: SnapKV's window without the question;
    ``chunk``: Finch's chunk (memstep's c, the chunked mode it is closest to)."""
    if name is None:
        return None, {}
    import kvpress

    observe = question_tokens if aware else window
    if name == "snapkv":
        return kvpress.SnapKVPress(window_size=observe, kernel_size=SNAPKV_KERNEL), {
            "press": "SnapKVPress", "window": observe, "window_is": "the question" if aware else "the context's end",
            "pooling": f"mean over the window's queries, avg_pool1d kernel {SNAPKV_KERNEL}"}
    if name == "snapkv-max15":
        return max_pooled_snapkv(kvpress, observe, SNAPKV_MAX_KERNEL), {
            "press": "SnapKVPress, max-pooled", "window": observe,
            "window_is": "the question" if aware else "the context's end",
            "pooling": f"mean over the window's queries, max_pool1d kernel {SNAPKV_MAX_KERNEL}"}
    if name == "chunkkv":
        inner = kvpress.SnapKVPress(window_size=observe, kernel_size=SNAPKV_KERNEL)
        return kvpress.ChunkKVPress(press=inner, chunk_length=CHUNKKV_CHUNK), {
            "press": "ChunkKVPress(SnapKVPress)", "window": observe,
            "window_is": "the question" if aware else "the context's end", "chunk_length": CHUNKKV_CHUNK,
            "pooling": f"SnapKV mean + avg_pool1d kernel {SNAPKV_KERNEL}, then the mean over each chunk"}
    if name in FINCH:
        if not aware:
            raise SystemExit("finch reads the question: run it question-aware")
        # kvpress's registry: FinchPress() (chunk_length None, rerotate_keys True). Chunked, each chunk keeps
        # its share; the last, short chunk then keeps fewer entries than the question has (measured).
        chunk_length = chunk if name == "finch-chunked" else None
        rerotate = name != "finch-unrotated"
        return kvpress.FinchPress(chunk_length=chunk_length, normalize_scores=True, rerotate_keys=rerotate), {
            "press": "FinchPress", "window": question_tokens, "window_is": "the question (after a delimiter)",
            "chunk_length": chunk_length or "none (one top-k over the context)", "rerotate_keys": rerotate,
            "pooling": "mean over the window's queries, normalized"}
    if name == "keydiff":
        return kvpress.BlockPress(press=kvpress.KeyDiffPress(), block_size=KEYDIFF_BLOCK), {
            "press": "BlockPress(KeyDiffPress)", "block_size": KEYDIFF_BLOCK, "window": None,
            "pooling": "none (cosine to the mean key)"}
    simple = {"knorm": kvpress.KnormPress, "streaming-llm": kvpress.StreamingLLMPress,
              "observed-attention": kvpress.ObservedAttentionPress}
    if name not in simple:
        raise SystemExit(f"unknown press '{name}'")
    return simple[name](), {"press": simple[name].__name__, "window": None}


def set_ratio(press, context_tokens: int, keep: int, chunk_of: int | None = None) -> None:
    """kvpress keeps int(tokens * (1 - ratio)) entries; pick the ratio that keeps exactly
    ``keep`` (a chunk press: the nearest whole number of chunks of ``chunk_of``)."""
    if keep >= context_tokens:
        press.compression_ratio = 0.0
        return
    if chunk_of:  # ChunkKV keeps int(chunks * (1 - ratio)) chunks
        chunks = -(-context_tokens // chunk_of)
        want = max(1, round(keep / chunk_of))
        press.compression_ratio = max(0.0, 1.0 - (want + 0.5) / chunks)
        return
    press.compression_ratio = max(0.0, 1.0 - (keep + 0.5) / context_tokens)


def sliding_layers(model) -> set[int]:
    """The layers of a hybrid model (Gemma 3) that attend within a sliding window."""
    text = model.config.get_text_config(decoder=True)
    return {i for i, kind in enumerate(getattr(text, "layer_types", None) or [])
            if kind in ("sliding_attention", "chunked_attention")}


def make_cache(model):
    """An empty cache for the context. A hybrid model gets its sliding layers as plain growing
    layers that still say they are sliding: they keep every entry at its document position
    (so the question and the answer can be cut off them like any layer) and the model's masks
    still apply the window."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    sliding = sliding_layers(model)
    if not sliding:
        return DynamicCache()

    class WholeSlidingLayer(DynamicLayer):
        is_sliding = True

    cache = DynamicCache(config=model.config)
    cache.layers = [WholeSlidingLayer() if i in sliding else layer for i, layer in enumerate(cache.layers)]
    return cache


class KeptIndex:
    """Which context positions each layer's press kept, per KV head. Presses gather the rows
    of the layer's keys, so the kept keys are matched back to the full ones (RoPE makes
    every position's key distinct; values are not: the first layer's values depend on the
    token alone). Finch re-rotates the keys it keeps, so there the indices are read where it
    hands them to the re-rotation."""

    def __init__(self, press, rerotated: bool, skip: set[int] = frozenset()):
        self.kept: dict[int, torch.Tensor] = {}
        # one wrapper per press, whatever the number of cases: wrap the press's own method
        compress = press.__dict__.setdefault("_unwrapped_compress", press.compress)
        if rerotated:
            from kvpress.presses.key_rerotation_press import KeyRerotationPress

            rerotate = KeyRerotationPress.__dict__.get("_unwrapped", KeyRerotationPress.rerotate_keys)
            KeyRerotationPress._unwrapped = staticmethod(rerotate)

            def spy(module, indices, keys):
                self.kept[module.layer_idx] = indices[0].clone()
                return rerotate(module, indices, keys)

            KeyRerotationPress.rerotate_keys = staticmethod(spy)

        def tracked(module, hidden_states, keys, values, attentions, kwargs):
            if module.layer_idx in skip:  # a sliding layer holds its window: kvpress's rule for Gemma 3
                return keys, values
            new_keys, new_values = compress(module, hidden_states, keys, values, attentions, kwargs)
            if not rerotated:
                self.kept[module.layer_idx] = self.match(keys[0], new_keys[0])
            return new_keys, new_values

        press.compress = tracked

    @staticmethod
    def match(full: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
        """(heads, kept) positions in ``full`` (heads, tokens, dim) of the rows of ``kept``."""
        probe = torch.randn(full.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        a, b = full.double() @ probe, kept.double() @ probe
        order = a.argsort(dim=-1)
        found = torch.searchsorted(a.gather(-1, order), b).clamp(max=a.shape[-1] - 1)
        return order.gather(-1, found)

    def positions(self) -> dict[int, torch.Tensor]:
        """{layer: (heads, kept) context positions} of the layers the press compressed."""
        return dict(sorted(self.kept.items()))


def hybrid_masks(model, cache, position: int, count: int) -> dict | None:
    """The attention masks of ``count`` new tokens at ``position`` on a hybrid model, one per
    layer kind (None otherwise). transformers derives both from one cache length, but after a
    press the global layers hold fewer entries than the sliding ones (which keep every entry
    at its document position), so each kind gets its own: a global layer sees all it kept and
    the new tokens causally; a sliding layer sees the positions within its window."""
    sliding = sliding_layers(model)
    if not sliding:
        return None
    text = model.config.get_text_config(decoder=True)
    pressed = next(i for i in range(len(cache.layers)) if i not in sliding)
    held = cache.layers[pressed].keys.shape[2]
    new = torch.ones(count, count, dtype=torch.bool, device=model.device).tril()
    full = torch.cat([torch.ones(count, held, dtype=torch.bool, device=model.device), new], dim=1)
    whole = cache.layers[min(sliding)].keys.shape[2]  # == position: entries at their document positions
    keys = torch.arange(whole + count, device=model.device)[None]
    queries = position + torch.arange(count, device=model.device)[:, None]
    window = (keys <= queries) & (keys > queries - text.sliding_window)
    return {"full_attention": full[None, None], "sliding_attention": window[None, None]}


def extend(model, cache, ids: list[int], position: int, last_only: bool) -> torch.Tensor:
    """Append tokens after the cache at ``position`` on; logits (tokens or last, vocab)."""
    positions = torch.arange(position, position + len(ids), device=model.device)[None]
    masks = hybrid_masks(model, cache, position, len(ids))
    out = model(input_ids=torch.tensor([ids], device=model.device), past_key_values=cache,
                position_ids=positions, use_cache=True, logits_to_keep=1 if last_only else 0,
                **({"attention_mask": masks} if masks else {}))
    return out.logits[0].float()


def crop(cache, entries: list[int]) -> None:
    for layer, length in zip(cache.layers, entries):
        layer.keys, layer.values = layer.keys[:, :, :length], layer.values[:, :, :length]


def drop_positions(cache, kept: dict[int, torch.Tensor], start: int) -> bool:
    """Remove the entries of context positions >= ``start`` (the question) from every layer. A
    press that keeps the question whole in every head (its scores are the window's maximum)
    leaves each head as many document entries; one that lets some of its tokens go in some
    heads (SnapKV's pooled window scores can) leaves heads with unequal counts, which one
    cache cannot hold: then nothing is removed and False says the continuation cannot be scored.
    A layer the press left whole holds its positions in order: its first ``start`` entries are
    the document."""
    rows = {index: [torch.nonzero(head < start).squeeze(-1) for head in positions]
            for index, positions in kept.items()}
    if any(len({len(row) for row in heads}) > 1 for heads in rows.values()):
        return False
    for index, layer in enumerate(cache.layers):
        if index not in kept:
            layer.keys, layer.values = layer.keys[:, :, :start], layer.values[:, :, :start]
            continue
        gather = torch.stack(rows[index])[None, :, :, None].expand(1, -1, -1, layer.keys.shape[-1])
        layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
    return True


def question_kept(kept: dict[int, torch.Tensor], start: int) -> int:
    """The fewest question entries (context positions >= ``start``) any compressed head kept:
    the question's own tokens, which a question-aware press should keep whole."""
    return min(int((head >= start).sum()) for positions in kept.values() for head in positions)


def retention(kept: dict[int, torch.Tensor], positions: range) -> tuple[list[float], float]:
    """Per compressed layer the share of (KV head, answer token) pairs kept, and the share of
    (layer, head) slots that keep every answer token (as memstep's worker reports them; on a
    hybrid model the sliding layers, left whole, are not counted)."""
    wanted = torch.tensor(list(positions))
    per_layer, whole = [], []
    for layer in kept.values():
        hits = torch.isin(layer, wanted).sum(dim=-1)  # (heads,)
        per_layer.append(round(float(hits.sum()) / (layer.shape[0] * len(wanted)), 4))
        whole += (hits == len(wanted)).tolist()
    return per_layer, round(sum(whole) / len(whole), 4)


def run_case(model, tokenizer, press, settings: dict, case: dict, reference: dict | None = None) -> dict:
    from memstep.evaluation.divergence import save_reference, score_against

    name = settings.get("press_name")
    aware = bool(settings.get("question_aware"))
    question = case["question_ids"]
    document = case["head_ids"] + case["document_ids"]
    delimiter = [settings["delimiter_id"]] if name in FINCH else []
    context = document + delimiter + (question if aware else [])
    seen = len(context) - len(delimiter)  # the tokens the layers see (Finch's hook drops the delimiter)
    keep = settings["budget"] + settings["sinks"] + (len(question) if aware else 0) if settings.get("budget") \
        else seen
    rerotated = bool(getattr(press, "rerotate_keys", False))
    sliding = sliding_layers(model)
    index = KeptIndex(press, rerotated, sliding) if press is not None else None
    cache = make_cache(model)
    vocab = settings["vocab"]
    began = time.perf_counter()
    with torch.inference_mode():
        if press is not None:
            set_ratio(press, seen, keep, CHUNKKV_CHUNK if name == "chunkkv" else None)
            with press(model):
                hidden = model.model(input_ids=torch.tensor([context], device=model.device),
                                     past_key_values=cache, use_cache=True).last_hidden_state
        else:
            hidden = model.model(input_ids=torch.tensor([context], device=model.device),
                                 past_key_values=cache, use_cache=True).last_hidden_state
        prefill_seconds = time.perf_counter() - began
        entries = [layer.keys.shape[2] for layer in cache.layers]  # (a plain cache makes its layers as they fill)
        pressed = [i for i in range(len(entries)) if i not in sliding]  # the layers a budget applies to
        kept_entries = max(entries[i] for i in pressed)
        kept = index.positions() if index is not None and index.kept else None
        last = model.get_output_embeddings()(hidden[:, -1]).float()[:, :vocab]
        eos = model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos]) | {tokenizer.eos_token_id}
        # positions as kvpress's pipeline sets them: true ones, or the cache length after re-rotation
        position = kept_entries if rerotated else seen
        if aware:  # the question is in the cache already
            logits = last
        else:
            logits = extend(model, cache, question, position, True)[:, :vocab]
            position += len(question)
        out: list[int] = []
        for _ in range(settings["max_new_tokens"]):
            token = int(logits[-1].argmax())
            if token in eos:
                break
            out.append(token)
            if settings.get("one_line") and "\n" in tokenizer.decode(out, skip_special_tokens=True).strip():
                break  # a base model asked in completion form runs on past its answer line (as memstep's)
            logits = extend(model, cache, [token], position, True)[:, :vocab]
            position += 1
        crop(cache, entries)
        # the continuation follows the document's memory: the question's entries go first
        dropped = True
        if aware:
            if kept is None:  # no compression: the document's entries are the first ones
                crop(cache, [len(document)] * len(entries))
            else:
                dropped = drop_positions(cache, kept, len(document))
        memory = max(cache.layers[i].keys.shape[2] for i in pressed) if dropped else \
            max(int((head < len(document)).sum()) for positions in kept.values() for head in positions)
        continuation = case["continuation_ids"]
        nll, divergence = None, {}
        if continuation and dropped:
            # the first row: the document's last token read over the whole context before the cut (as
            # memstep's last chunk reads its memory before its cut); the rest over the compressed memory
            first = model.get_output_embeddings()(hidden[:, len(document) - 1]).float()[:, :vocab]
            start = memory if rerotated else len(document)
            rest = extend(model, cache, continuation[:-1], start, False)[:, :vocab] if len(continuation) > 1 \
                else first[:0]
            rows = torch.cat([first, rest])
            target = torch.tensor(continuation, device=rows.device)
            nll = float(torch.nn.functional.cross_entropy(rows, target))
            reference = reference or {}
            if reference.get("write"):
                save_reference(reference["write"], rows.cpu().numpy())
            divergence = score_against(reference.get("read") or reference.get("write"), rows.cpu().numpy())
    answer = tokenizer.decode(out, skip_special_tokens=True).strip()
    result = {"answer": answer.split("\n")[0].strip() if settings.get("one_line") else answer,
              "continuation_nll": nll, "prefill_seconds": prefill_seconds, "seconds": time.perf_counter() - began,
              "memory_entries": memory, "context_entries": kept_entries, "retention": None,
              "settings": {**settings["press_settings"], "kept_entries": kept_entries, "document_entries": memory,
                           "compression_ratio": round(float(getattr(press, "compression_ratio", 0.0)), 4)
                           if press is not None else None, **hybrid_settings(sliding, len(entries), press),
                           **({"question_entries_kept": question_kept(kept, len(document)), "question_tokens": len(question)}
                              if aware and kept else {}),
                           **({} if dropped else {"continuation": "not scored: the press kept unequal numbers of "
                                                                  "document entries per KV head"})},
              **divergence}
    if kept is not None:
        offset = len(case["head_ids"])
        start, end = case["passkey_tokens"]
        result["retention"], result["needle_whole"] = retention(kept, range(offset + start, offset + end))
        result["retention_layers"] = "global" if sliding else "all"
    return result


def hybrid_settings(sliding: set[int], layers: int, press) -> dict:
    """On a hybrid model: which layers the press compressed (recorded with every cell)."""
    if not sliding or press is None:
        return {}
    return {"layers_pressed": f"the {layers - len(sliding)} global layers; the {len(sliding)} sliding layers keep "
                              "their window (kvpress's own rule for Gemma 3)"}


def observed_window(press) -> int | None:
    """The observation window a built press will use (read off the press object itself)."""
    inner = getattr(press, "press", press)
    return getattr(inner, "window_size", None)


def describe(job: dict) -> int:
    """Each case's press as built for this job, without a model: what the press object holds
    and the settings recorded with its cells (``--describe JOB``)."""
    config = job["config"]
    for item in job["cases"]:
        aware = bool(config.get("question_aware"))
        press, settings = make_press(config.get("scorer"), aware, len(item["case"]["question_ids"]),
                                     job["settings"].get("peer_window", 64), job["settings"].get("chunk", 512))
        emit("press", key=item["key"], question_tokens=len(item["case"]["question_ids"]),
             press_class=type(press).__name__ if press is not None else None,
             window_size=observed_window(press), **settings)
    return 0


def press_family(config: dict) -> str:
    """What a press leaves changed in the model it ran on: Finch adds its delimiter token to the
    vocabulary, ObservedAttention switches to eager attention. A served peer (--serve) keeps its
    model for the jobs of one family and loads it afresh for another."""
    scorer = config.get("scorer")
    return "finch" if scorer in FINCH else "eager" if scorer == "observed-attention" else "plain"


def load(job: dict):
    from memstep.models import load_model

    lm = load_model(job.get("model") or "embedded", device=job.get("device", "cpu"), dtype=job.get("dtype", "float32"))
    lm.vocab = lm.model.get_output_embeddings().weight.shape[0]  # before Finch adds its delimiter
    return lm


def prepare(lm, job: dict):
    """The press of the job's configuration on ``lm``, as run_case(case, reference) for serve_cases."""
    config, settings = job["config"], dict(job["settings"])
    settings["budget"] = config.get("budget")
    settings["question_aware"] = config.get("question_aware")
    settings["press_name"] = config.get("scorer")
    settings["vocab"] = lm.vocab
    settings["one_line"] = job.get("prompt_form") == "completion"
    question_tokens = len(job["cases"][0]["case"]["question_ids"]) if job["cases"] else 0
    press, settings["press_settings"] = make_press(config.get("scorer"), bool(config.get("question_aware")),
                                                   question_tokens, settings.get("peer_window", 64),
                                                   settings.get("chunk", 512))
    if config.get("scorer") in FINCH:  # the authors' way: a delimiter token between context and question
        press.update_model_and_tokenizer(lm.model, lm.tokenizer)  # (once per model: the token stays)
        settings["delimiter_id"] = press.delimiter_token_id
    if config.get("scorer") == "observed-attention":  # needs the attention weights
        lm.model.set_attn_implementation("eager")

    def one(case, reference):
        if press is not None and config.get("question_aware") and len(case["question_ids"]) != question_tokens:
            # the window follows each case's question (and its settings are recorded with this case alone)
            fresh, recorded = make_press(config.get("scorer"), True, len(case["question_ids"]),
                                         settings.get("peer_window", 64), settings.get("chunk", 512))
            if config.get("scorer") in FINCH:
                fresh.delimiter_token_id, fresh.delimiter_token = press.delimiter_token_id, press.delimiter_token
            return run_case(lm.model, lm.tokenizer, fresh, {**settings, "press_settings": recorded}, case, reference)
        return run_case(lm.model, lm.tokenizer, press, settings, case, reference)

    return one


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--describe":
        return describe(load_job(argv[1]))
    if argv and argv[0] == "--serve":  # jobs on stdin (a Ray worker's peer): the model kept per press family
        return serve_jobs(load, prepare, lambda job: (*model_identity(job), press_family(job["config"])))
    job = load_job(argv[0])
    torch.set_num_threads(job.get("threads", 2))
    began = time.perf_counter()
    lm = load(job)
    return serve_cases(lm, job, prepare(lm, job), began)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
