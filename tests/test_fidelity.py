"""memstep's ``--preset reference`` against a port of the reference code itself.

The port below is written from the Collie source of "Memorize Step by Step" (ZhiYuanZeng/Collie,
newest commit "code for emnlp 2024"), not from memstep: ``collie/models/mem_perceiver/utils.py``
(MemSizeScheduler, ChunkSizeScheduler), ``collie/models/mem_perceiver/pruner.py`` (TovaPruner's
forward and read_and_write_memory, ConvPruner.get_indices) and ``collie/models/llama/model.py``
(LlamaLayer._forward: keys cached before RoPE, queries zero-padded to memory + chunk, RoPE at
positions 0..n-1 with dynamic NTK, eager attention with a top-left causal mask). It shares
nothing with memstep but the Hugging Face model whose weights it reads; it follows the
reference's tensor layouts (batch, tokens, heads, dim) and its order of operations. Two
liberties, both needed to run a Hugging Face checkpoint: RoPE rotates the two halves of a
head (Collie rotates interleaved pairs of its own checkpoint layout: the same rotation), and
it runs in float32 (the reference runs bf16).

The tests: the port and ``--preset reference`` keep the same entries at every step, layer and
KV head (FM, IMDC linear/square/sqrt, layer-wise IM, on a tiny random model; IMDC on the
embedded model, the acceptance command itself); switching any single reference switch back to
memstep's value makes them disagree; the growth formulas agree with the reference's code on
thousands of random settings.
"""

from __future__ import annotations

import io
import json
import math
import random
from contextlib import redirect_stdout
from dataclasses import replace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import ASSETS, make_tiny_model, scan_size

from memstep.models import LoadedModel
from memstep.presets import REFERENCE, SWITCHES, preset_settings
from memstep.runner import DocumentRun
from memstep.schedules import make_schedule

NUM_SINK_TOKENS = 4


# ---- collie/models/mem_perceiver/utils.py -------------------------------------------------------
class MemSizeScheduler:
    """Collie's MemSizeScheduler (incremental types spelled as Collie spells them)."""

    LAYERWISE = ("square_sqrt", "double_inverse")

    def __init__(self, chunk_size, max_mem_size, incremental_type=None, num_layers=None):
        self.chunk_size = chunk_size
        self.max_mem_size = max_mem_size
        self.incremental_type = incremental_type
        self.num_layers = num_layers

    def _get_num_chunks(self, seq_len):
        if seq_len % self.chunk_size == 0:
            return seq_len // self.chunk_size
        return seq_len // self.chunk_size + 1

    def get_incremental_memsize(self, step, seq_len, incremental_type=None):
        if incremental_type is None:
            incremental_type = self.incremental_type
        num_chunks = self._get_num_chunks(seq_len=seq_len)
        if step >= (num_chunks - 1):
            return self.max_mem_size
        avg = self.max_mem_size // num_chunks
        if incremental_type == "linear":
            incremental_len = avg * (step + 1)
        elif incremental_type == "square":
            incremental_len = (step ** 2) * ((self.max_mem_size - avg) / (num_chunks - 1) ** 2) + avg
        elif incremental_type == "sqrt":
            incremental_len = (step ** 0.5) * ((self.max_mem_size - avg) / (num_chunks - 1) ** 0.5) + avg
        elif incremental_type == "inverse_convex":
            incremental_len = self.max_mem_size / (num_chunks - step)
        elif incremental_type == "inverse_concave":
            incremental_len = self.max_mem_size + avg - self.max_mem_size / (step + 1)
        else:
            raise NotImplementedError(incremental_type)
        return int(incremental_len)

    def get_layerwise_incremental_memsize(self, step, seq_len, layer_idx):
        num_chunks = self._get_num_chunks(seq_len=seq_len)
        if step + 1 == num_chunks:
            return self.max_mem_size
        assert self.num_layers is not None and layer_idx < self.num_layers
        lower, upper = {"square_sqrt": ("square", "sqrt"),
                        "double_inverse": ("inverse_convex", "inverse_concave")}[self.incremental_type]
        curve = lower if layer_idx < self.num_layers // 2 else upper
        return self.get_incremental_memsize(step, seq_len, incremental_type=curve)

    def get_memsize(self, step=None, seq_len=None, layer_idx=None):
        if self.incremental_type is None:
            return self.max_mem_size
        if self.incremental_type in self.LAYERWISE:
            return self.get_layerwise_incremental_memsize(step, seq_len, layer_idx)
        return self.get_incremental_memsize(step, seq_len)


class ChunkSizeScheduler:
    def __init__(self, ref_chunk_size):
        self.ref_chunk_size = ref_chunk_size

    def get_std_chunk_sizes(self, seq_len):
        num = (seq_len + self.ref_chunk_size - 1) // self.ref_chunk_size
        sizes = [self.ref_chunk_size] * num
        if seq_len % self.ref_chunk_size != 0:
            sizes[-1] = seq_len % self.ref_chunk_size
        return sizes

    def get_decremental_chunk_sizes(self, seq_len, mem_size_scheduler):
        num_chunks = mem_size_scheduler._get_num_chunks(seq_len)
        avg_chunk_size = seq_len // num_chunks
        if num_chunks == 1:
            return [avg_chunk_size]
        mem_sizes = [mem_size_scheduler.get_memsize(i, seq_len) for i in range(num_chunks)]
        avg_mem_size = sum(mem_sizes[:-1]) // (len(mem_sizes) - 1)
        sizes = [avg_chunk_size] + [avg_chunk_size + avg_mem_size - mem_sizes[i - 1] for i in range(1, num_chunks)]
        sizes[-1] = seq_len - sum(sizes[:-1])
        return sizes


# ---- collie/models/llama/model.py: one Llama layer -----------------------------------------------
def rms_normalize(hidden, norm):
    variance = hidden.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return norm.weight * (hidden * torch.rsqrt(variance + norm.variance_epsilon))


def rotate_half(x):
    """Hugging Face checkpoints rotate the two halves of a head (Collie: interleaved pairs)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def collie_rotary(query, key, seq_len, positions, base, head_dim, max_length, ntk=True):
    """RotaryPositionEmbedding.forward with pe_config ntk_option 'dynamic' (build_llm_from_name_or_path
    sets it for Llama: max_length = max_position_embeddings, base = rope_theta). ``ntk=False``: the
    base as is (what the port uses to show the switch matters)."""
    t = positions.reshape(1, -1, 1, 1).float()
    factor = max(2 ** math.ceil(math.log(seq_len / max_length, 2) + 1) - 1, 1) if ntk else 1
    alpha = base * factor ** (head_dim / (head_dim - 2))
    theta = 1.0 / (alpha ** (torch.arange(0, head_dim, 2) / head_dim)).float()
    theta = torch.cat([theta, theta], dim=-1)[None, None, None, :]  # halves, as the checkpoint's layout
    theta = theta * t
    sin, cos = torch.sin(theta), torch.cos(theta)
    q, k = query.float(), key.float()
    return (q * cos + rotate_half(q) * sin).type(query.dtype), (k * cos + rotate_half(k) * sin).type(query.dtype)


def llama_layer_forward(layer, config, hidden_states, layer_past, ntk=True):
    """LlamaLayer._forward (use_flash False): returns hidden states, the new (key, value) cache
    before RoPE, (batch, tokens, kv_heads, head_dim), and the attention (batch, heads, n, n)."""
    attn = layer.self_attn
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.head_dim
    groups = heads // kv_heads
    batch_size, seq_len, _ = hidden_states.shape
    normed = rms_normalize(hidden_states, layer.input_layernorm)
    query = attn.q_proj(normed).view(batch_size, seq_len, heads, head_dim)
    key = attn.k_proj(normed).view(batch_size, seq_len, kv_heads, head_dim)
    value = attn.v_proj(normed).view(batch_size, seq_len, kv_heads, head_dim)
    start_pos = layer_past[0].shape[1] if layer_past is not None else 0
    if layer_past is not None:
        key = torch.cat([layer_past[0], key], dim=1)
        value = torch.cat([layer_past[1], value], dim=1)
    new_layer_past = (key, value)
    if groups > 1:
        key = torch.repeat_interleave(key, dim=2, repeats=groups)
        value = torch.repeat_interleave(value, dim=2, repeats=groups)
    if layer_past is not None:
        query = F.pad(query, (0, 0, 0, 0, start_pos, 0))  # zero rows for the memory
    positions = torch.arange(query.shape[1])
    query, key = collie_rotary(query, key, positions[-1].item(), positions, config.rope_parameters["rope_theta"],
                               head_dim, config.max_position_embeddings, ntk)
    query, key, value = query.permute(0, 2, 1, 3), key.permute(0, 2, 1, 3), value.permute(0, 2, 1, 3)
    attention_score = torch.matmul(query, key.transpose(2, 3)) / math.sqrt(head_dim)
    if seq_len + start_pos > 1:
        mask = torch.triu(torch.full((1, 1, seq_len + start_pos, seq_len + start_pos), float("-inf")), diagonal=1)
        attention_score = attention_score + mask
    key_padding_mask = (1.0 - torch.ones(1, 1, 1, seq_len + start_pos)) * torch.finfo(attention_score.dtype).min
    attention_score = F.softmax(attention_score + key_padding_mask, dim=-1).type_as(value)
    output = torch.matmul(attention_score, value).transpose(1, 2).contiguous().view(batch_size, seq_len + start_pos, -1)
    output = output[:, start_pos:, :]
    hidden_states = hidden_states + attn.o_proj(output)
    normed = rms_normalize(hidden_states, layer.post_attention_layernorm)
    mlp = layer.mlp
    hidden_states = hidden_states + mlp.down_proj(F.silu(mlp.gate_proj(normed)) * mlp.up_proj(normed))
    return hidden_states, new_layer_past, attention_score


# ---- collie/models/mem_perceiver/pruner.py: ConvPruner over TovaPruner -------------------------------
class ConvPrunerPort:
    """TovaPruner.forward / compress / read_and_write_memory / compress_layer with ConvPruner's
    get_indices, memory types FM (CHUNK_STREAMING) and IM (DYNAMIC_INCREMENTAL), decremental_chunk
    for IMDC. Besides the cache it carries each entry's document position (for the comparison).

    ``variant`` names a single place where the port behaves as memstep instead (one at a time), to
    show that the comparison sees each switch."""

    def __init__(self, model, chunk_size, memory_size_limit, memory_type, incremental_type=None,
                 decremental_chunk=False, kernel_size=5, variant=None):
        self.model, self.config = model, model.config
        self.chunk_size, self.memory_size_limit = chunk_size, memory_size_limit
        self.memory_type, self.decremental_chunk = memory_type, decremental_chunk
        self.kernel_size, self.variant = kernel_size, variant
        self.num_sink_tokens = NUM_SINK_TOKENS
        self.num_layers = self.config.num_hidden_layers
        self.chunksize_scheduler = ChunkSizeScheduler(chunk_size)
        self.memsize_scheduler = MemSizeScheduler(chunk_size, memory_size_limit, incremental_type, self.num_layers)

    def get_indices(self, attention, target_len):
        chunk_size = min(self.chunk_size, attention.shape[-1])
        new_attention_scores = attention[:, :, -self.chunk_size:, :]
        accum = new_attention_scores.sum(dim=2)
        accum = F.avg_pool1d(accum, kernel_size=self.kernel_size, stride=1, padding=self.kernel_size // 2)
        normalization_scores = torch.ones(attention.shape[-1]) * chunk_size
        normalization_scores[-chunk_size:] = chunk_size - torch.arange(chunk_size)
        important_scores = accum / normalization_scores.view(1, 1, -1).expand_as(accum)
        important_indices = torch.topk(important_scores, dim=-1, k=target_len).indices
        return torch.sort(important_indices, dim=-1).values

    def compress_layer(self, key, value, positions, attention, target_len):
        if key.shape[1] <= target_len:
            return key, value, positions
        bsz, seq_len, num_heads, head_dim = key.shape
        if attention.shape[1] != num_heads:  # support gqa
            num_groups = attention.shape[1] // num_heads
            attention = attention.view(bsz, num_groups, num_heads, attention.shape[-2], attention.shape[-1]).sum(dim=1)
        topk_indices = self.get_indices(attention, target_len)
        positions = torch.gather(positions, index=topk_indices[0], dim=-1)
        topk_indices = topk_indices.unsqueeze(-1).expand(bsz, num_heads, target_len, head_dim).transpose(1, 2)
        return torch.gather(key, index=topk_indices, dim=1), torch.gather(value, index=topk_indices, dim=1), positions

    def read_and_write_memory(self, key, value, positions, attention, chunk_step, layer_idx):
        s = self.num_sink_tokens
        sink_key, sink_value, sink_positions = key[:, :s], value[:, :s], positions[:, :s]
        key, value, positions = key[:, s:], value[:, s:], positions[:, s:]
        attention = attention[:, :, :, s:]
        if self.memory_type == "FM":
            target_len = self.memsize_scheduler.max_mem_size
            key, value, positions = self.compress_layer(key, value, positions, attention, target_len)
        else:  # "IM"
            target_len = self.memsize_scheduler.get_memsize(chunk_step, self.prefill_len, layer_idx)
            if key.shape[1] > target_len:
                key, value, positions = self.compress_layer(key, value, positions, attention, target_len)
        return (torch.cat([sink_key, key], dim=1), torch.cat([sink_value, value], dim=1),
                torch.cat([sink_positions, positions], dim=1))

    def forward(self, input_ids):
        """Prefill; returns the last chunk's logits and, per step, each layer's positions
        (kv_heads, entries) after the step."""
        seq_len = input_ids.shape[1]
        if self.decremental_chunk and self.memory_type == "IM":
            chunk_sizes = self.chunksize_scheduler.get_decremental_chunk_sizes(seq_len, self.memsize_scheduler)
        else:
            chunk_sizes = self.chunksize_scheduler.get_std_chunk_sizes(seq_len)
        self.prefill_len = seq_len
        cache = [None] * self.num_layers
        positions = [torch.zeros(self.config.num_key_value_heads, 0, dtype=torch.long)] * self.num_layers
        kept, start = [], 0
        for step, chunk in enumerate(torch.split(input_ids, chunk_sizes, dim=1)):
            logits, attentions = self.model_forward(chunk, cache)
            chunk_positions = torch.arange(start, start + chunk.shape[1]).expand(self.config.num_key_value_heads, -1)
            start += chunk.shape[1]
            for i in range(self.num_layers):
                key, value = cache[i]
                cache[i] = self.read_and_write_memory(key, value, torch.cat([positions[i], chunk_positions], 1),
                                                      attentions[i], step, i)
                positions[i] = cache[i][2]
                cache[i] = cache[i][:2]
            kept.append([p.clone() for p in positions])
        self.cache = cache
        return logits, kept

    def model_forward(self, input_ids, cache):
        model = self.model.model
        hidden = model.embed_tokens(input_ids)
        attentions = []
        for i, layer in enumerate(model.layers):
            hidden, cache[i], attention = self._layer(layer, hidden, cache[i])
            attentions.append(attention)
        hidden = rms_normalize(hidden, model.norm)
        return self.model.lm_head(hidden), attentions

    def _layer(self, layer, hidden, past):
        hidden, new_past, attention = llama_layer_forward(layer, self.config, hidden, past, self.variant != "ntk")
        if self.variant == "gqa_grouping":  # memstep's grouping: the heads that attend through a KV head
            kv, groups = self.config.num_key_value_heads, self.config.num_attention_heads // self.config.num_key_value_heads
            attention = attention.view(1, kv, groups, *attention.shape[-2:]).transpose(1, 2).reshape(attention.shape)
        return hidden, new_past, attention

    def generate(self, input_ids, max_new_tokens):
        """Greedy: the first token from the prefill's last chunk, then decoding over the cache."""
        logits, kept = self.forward(input_ids)
        out = [int(logits[0, -1].argmax())]
        for _ in range(max_new_tokens - 1):
            logits, _ = self.model_forward(torch.tensor([[out[-1]]]), self.cache)
            self.cache = [c[:2] for c in self.cache]
            out.append(int(logits[0, -1].argmax()))
        return out, kept


COLLIE_GROWTH = {"linear": "linear", "square": "square", "sqrt": "sqrt", "square-sqrt": "square_sqrt"}


def port_for(model, schedule: str, growth: str, chunk: int, memory: int, variant=None) -> ConvPrunerPort:
    if schedule == "fm":
        return ConvPrunerPort(model, chunk, memory, "FM", variant=variant)
    return ConvPrunerPort(model, chunk, memory, "IM", COLLIE_GROWTH[growth], schedule == "imdc", variant=variant)


# ---- memstep's side: the preset, as the CLI applies it ------------------------------------------------
def memstep_run(lm, document_ids, schedule, growth, chunk, memory, question=None, **changes):
    """``--preset reference``, with ``changes`` (switch=value, attention=...) on top."""
    settings = preset_settings("reference")
    fidelity = replace(REFERENCE, **{k: v for k, v in changes.items() if k in SWITCHES})
    run = DocumentRun(lm, document_ids, schedule=schedule, chunk=chunk, memory=memory, growth=growth,
                      scorer=settings["scorer"], sinks=settings["sinks"], kernel=settings["kernel"],
                      rope=settings["rope"], attention=changes.get("attention", settings["attention"]),
                      question=question, max_new_tokens=4, fidelity=fidelity)
    result = run.run()
    return run, result


def kept_sets(result) -> list[list[np.ndarray]]:
    return [[layer[:, :n] for layer, n in zip(r.kept_positions, r.layer_entries)] for r in result.steps]


def agreement(ours, theirs) -> tuple[int, int]:
    """(identical (step, layer, KV head) sets, all of them); unequal step counts agree nowhere."""
    total = sum(len(layer) for step in theirs for layer in step)
    if len(ours) != len(theirs):
        return 0, total
    same = 0
    for step_ours, step_theirs in zip(ours, theirs):
        for a, b in zip(step_ours, step_theirs):
            b = b.numpy()
            same += sum(len(x) == len(y) and np.array_equal(x, y) for x, y in zip(a, b))
    return same, total


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from memstep.errors import MemstepError
    from memstep.models import embedded_model_folder

    try:
        return AutoTokenizer.from_pretrained(str(embedded_model_folder()))
    except MemstepError as err:
        pytest.skip(str(err))


@pytest.fixture(scope="module")
def tiny(tokenizer) -> LoadedModel:
    """3 layers, 4 query heads on 2 KV heads, 80 trained positions (so dynamic NTK acts)."""
    model = make_tiny_model("llama", layers=3, seed=11, vocab_size=len(tokenizer), max_position_embeddings=80)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, "tiny", "cpu", "float32")


def document(n: int, seed: int = 12) -> list[int]:
    return torch.randint(100, 20000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


QUESTION = "What is the magic number?"
SETTINGS = [("fm", "linear"), ("imdc", "linear"), ("imdc", "square"), ("imdc", "sqrt"), ("im", "square-sqrt")]


def reference_prompt(tokenizer, ids: list[int], question: str | None = None) -> torch.Tensor:
    """The prompt as the reference's passkey script builds it: one text with the question at
    its end, all of it prefilled (here in the model's chat template, as memstep frames it);
    without a question, the template's head and the document."""
    mark = "\u2063"
    body = mark + (f"\n\nQuestion: {question}" if question else "")
    text = tokenizer.apply_chat_template([{"role": "user", "content": body}], tokenize=False,
                                         add_generation_prompt=True)
    head, tail = text.split(mark)
    encode = lambda s: tokenizer(s, add_special_tokens=False)["input_ids"] if s else []  # noqa: E731
    return torch.tensor([encode(head) + ids + (encode(tail) if question else [])])


@pytest.mark.parametrize("schedule,growth", SETTINGS, ids=[f"{s}-{g}" for s, g in SETTINGS])
def test_reference_preset_keeps_the_reference_codes_sets(tiny, schedule, growth):
    """Every kept set at every step, layer and KV head equals the port's (the question inside
    the prompt, compressed with the document), and so does the greedy answer."""
    ids = document(330)
    run, result = memstep_run(tiny, ids, schedule, growth, 64, 56, question=QUESTION)
    assert result.prompt_question_tokens > 0 and run.schedule.tokens == len(run.input_ids)
    port = port_for(tiny.model, schedule, growth, 64, 56)
    with torch.inference_mode():
        tokens, theirs = port.generate(reference_prompt(tiny.tokenizer, ids, QUESTION), 4)
    ours = kept_sets(result)
    same, total = agreement(ours, theirs)
    assert same == total, f"{same}/{total} sets identical"
    assert sum(r.evicted for r in result.steps) >= 3 and len(result.steps) >= 5
    assert max(r.first_position + r.chunk_size for r in result.steps) > 81  # dynamic NTK acted
    assert result.answer == tiny.tokenizer.decode(
        tokens[:next((i for i, t in enumerate(tokens) if t == tiny.tokenizer.eos_token_id), len(tokens))],
        skip_special_tokens=True).strip()


def rounding_sensitive_length(schedule: str, growth: str, chunk: int, memory: int, extra: int) -> int:
    """A document length (prompt ``extra`` tokens added) whose schedule the two roundings tell apart."""
    for n in range(300, 800):
        a = make_schedule(schedule, n + extra, chunk, memory, growth)
        b = make_schedule(schedule, n + extra, chunk, memory, growth, rounding="multiply-first")
        if a.memory_sizes[:-1] != b.memory_sizes[:-1]:
            return n
    raise AssertionError("no length tells the roundings apart")


def other_value(switch: str) -> str:
    return next(v for v in SWITCHES[switch].choices if v != SWITCHES[switch].reference)


@pytest.fixture(scope="module")
def switch_case(tiny):
    """A document whose IMDC sqrt schedule the two roundings tell apart, and the port's sets on it."""
    frame = reference_prompt(tiny.tokenizer, [], QUESTION).shape[1]
    ids = document(rounding_sensitive_length("imdc", "sqrt", 64, 56, frame))
    with torch.inference_mode():
        _, theirs = port_for(tiny.model, "imdc", "sqrt", 64, 56).forward(reference_prompt(tiny.tokenizer, ids, QUESTION))
    return ids, theirs


@pytest.mark.parametrize("switch", [*SWITCHES, "attention"])
def test_each_switch_off_disagrees_with_the_port(tiny, switch_case, switch):
    """One switch off (its other value) and the rest as the reference: the port sees it.
    (Padded attention is not a difference of what is kept: with memstep's one-pass attention,
    the reference's zero rows added to its sums, the sets agree.)"""
    ids, theirs = switch_case
    change = {switch: "sdpa"} if switch == "attention" else {switch: other_value(switch)}
    _, result = memstep_run(tiny, ids, "imdc", "sqrt", 64, 56, question=QUESTION, **change)
    same, total = agreement(kept_sets(result), theirs)
    if switch == "attention":
        assert same == total
    else:
        assert same < total, f"{switch} {change[switch]} still agrees everywhere"


@pytest.mark.parametrize("variant", ["ntk", "gqa_grouping"])
def test_the_port_itself_sees_the_switch(tiny, variant):
    """The other direction: the port with memstep's behaviour in one place agrees with memstep's
    reference preset switched there, and not with the preset."""
    ids = document(330)
    port = port_for(tiny.model, "imdc", "square", 64, 56, variant=variant)
    _, preset = memstep_run(tiny, ids, "imdc", "square", 64, 56)
    _, switched = memstep_run(tiny, ids, "imdc", "square", 64, 56, **{variant: other_value(variant)})
    with torch.inference_mode():
        _, theirs = port.forward(reference_prompt(tiny.tokenizer, ids))
    same, total = agreement(kept_sets(switched), theirs)
    assert same == total
    assert agreement(kept_sets(preset), theirs)[0] < total


# ---- the growth formulas, scanned against the reference's code ----------------------------------------
GROWTHS = ["linear", "square", "sqrt", "inverse_convex", "inverse_concave", "square_sqrt", "double_inverse"]


@pytest.mark.scan
def test_growth_budgets_match_the_reference_code_on_random_settings():
    """3,000 seeded random (tokens, c, M) per growth (21,000 in all; the suite runs 600 of each,
    MEMSTEP_FULL_SCANS=1 all): IM budgets (every layer of the layer-wise growths) and
    IMDC chunks equal the reference's, and memstep's former multiply-first order would not (so
    the scan can fail)."""
    rng = random.Random(2024)
    mismatches = {g: 0 for g in GROWTHS}
    for growth in GROWTHS:
        name = growth.replace("_", "-")
        layers = 30 if growth in MemSizeScheduler.LAYERWISE else 1
        for _ in range(scan_size(3000, 600)):
            chunk = rng.randint(1, 4096)
            tokens = rng.randint(chunk, chunk * rng.randint(2, 64))
            memory = rng.randint(0, 8192)
            reference = MemSizeScheduler(chunk, memory, growth, layers)
            steps = reference._get_num_chunks(tokens)
            ours = make_schedule("im", tokens, chunk, memory, name, layers=layers)
            expected = [[reference.get_memsize(i, tokens, layer) for layer in range(layers)] for i in range(steps)]
            got = [list(ours.layer_budgets(i, layers)) for i in range(steps)]
            assert got == expected, (growth, tokens, chunk, memory)
            former = make_schedule("im", tokens, chunk, memory, name, layers=layers, rounding="multiply-first")
            mismatches[growth] += [list(former.layer_budgets(i, layers)) for i in range(steps)] != expected
            if growth in MemSizeScheduler.LAYERWISE:
                continue  # the reference's IMDC asks for budgets without a layer: a TypeError there
            chunks = ChunkSizeScheduler(chunk).get_decremental_chunk_sizes(tokens, reference)
            try:
                imdc = make_schedule("imdc", tokens, chunk, memory, name)
            except Exception:  # noqa: BLE001 - memstep refuses an empty chunk; the reference would run it
                assert min(chunks) < 1
                continue
            assert list(imdc.chunk_sizes) == chunks and list(imdc.memory_sizes) == expected_first(expected)
    assert mismatches["square"] > 0 and mismatches["sqrt"] > 0 and mismatches["square_sqrt"] > 0
    assert mismatches["linear"] == mismatches["inverse_convex"] == 0


def expected_first(per_layer):
    return [step[0] for step in per_layer]


def test_the_acceptance_step_three_keeps_1615():
    schedule = make_schedule("im", 12345, 1024, 3000, "sqrt")
    assert schedule.memory_sizes[3] == MemSizeScheduler(1024, 3000, "sqrt").get_memsize(3, 12345) == 1615
    assert make_schedule("im", 12345, 1024, 3000, "sqrt", rounding="multiply-first").memory_sizes[3] == 1614


# ---- the embedded model: the acceptance command itself -------------------------------------------------
@pytest.mark.slow
def test_acceptance_command_gives_the_reference_codes_kept_positions(embedded, tmp_path):
    """`memstep run doc.txt --preset reference --schedule imdc --chunk 256 --memory 256
    --positions --json` on 1,697 tokens of Pride and Prejudice, against the port on the same
    model and tokens: every (step, layer, KV head) set identical (7 x 30 x 3 = 630)."""
    from memstep.cli import main

    text = (ASSETS / "pride_and_prejudice_ch1-12.txt").read_text()
    path = tmp_path / "doc.txt"
    path.write_text(text[:6500])
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["run", str(path), "--preset", "reference", "--schedule", "imdc", "--chunk", "256", "--memory",
                     "256", "--positions", "--json", "--quiet", "--dtype", "float32", "--device", "cpu"])
    assert code == 0
    payload = json.loads(out.getvalue())
    assert payload["scorer"] == "conv" and payload["attention"] == "padded"
    assert payload["fidelity"] == dict(REFERENCE.__dict__)
    from memstep.documents import tokenize_document

    ids, _ = tokenize_document(path.read_text(), embedded.tokenizer, None)
    prompt = reference_prompt(embedded.tokenizer, ids)
    assert payload["tokens"] == prompt.shape[1]
    port = port_for(embedded.model, "imdc", "linear", 256, 256)
    with torch.inference_mode():
        _, theirs = port.forward(prompt)
    ours = [[np.asarray(layer) for layer in step["kept_positions"]] for step in payload["steps"]]
    same, total = agreement(ours, theirs)
    assert total == len(payload["steps"]) * 30 * 3 and len(payload["steps"]) >= 5
    assert same == total, f"{same}/{total} sets identical"
