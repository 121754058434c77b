"""The kvpress peer's own logic (peers/kvpress_peer.py run_case), in the main environment, with a
stand-in press wired as kvpress wires its presses: a forward hook on every attention module
hands the layer's cache to ``compress()`` during the prefill and writes back what it returns.
The stand-in keeps the first 4 positions and the latest ones (StreamingLLM's rule), the same in
every layer and head, so one forward of the plain model with a mask is the reference: the peer
must set the ratio to keep exactly the budget, find which positions were kept, drop the
question's entries before the continuation, and score the continuation at the right positions.
The real kvpress runs behind the ``kvpress`` marker (it needs .venv-kvpress)."""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
from conftest import make_tiny_model

from memstep.evaluation import runner

SINKS, BUDGET = 4, 24


@pytest.fixture(scope="module")
def peer():
    spec = importlib.util.spec_from_file_location("kvpress_peer_fake_press", runner.PEER_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # kvpress itself is imported only when a press is made by name
    return module


class KeepEnds:
    """A press as kvpress builds one: ``compression_ratio``, ``compress()`` and ``press(model)``."""

    def __init__(self):
        self.compression_ratio = 0.0
        self.kept: torch.Tensor | None = None  # context positions kept (every layer and head alike)

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        n = keys.shape[2]
        kept = max(1, int(n * (1 - self.compression_ratio)))  # kvpress's number kept
        self.kept = torch.cat([torch.arange(SINKS), torch.arange(n - kept + SINKS, n)])
        return keys[:, :, self.kept], values[:, :, self.kept]

    @contextlib.contextmanager
    def __call__(self, model):
        def hook(module, args, kwargs, output):
            cache = kwargs.get("cache", kwargs.get("past_key_values"))  # transformers 5.x renamed it
            layer = cache.layers[module.layer_idx]
            if kwargs["hidden_states"].shape[1] != layer.keys.shape[2]:
                return  # not the prefill: kvpress presses the context only
            layer.keys, layer.values = self.compress(module, kwargs["hidden_states"], layer.keys, layer.values,
                                                     None, kwargs)

        handles = [layer.self_attn.register_forward_hook(hook, with_kwargs=True) for layer in model.model.layers]
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


class Tokens:
    eos_token_id = None

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def a_case(seed=0):
    ids = torch.randint(5, 128, (90,), generator=torch.Generator().manual_seed(seed)).tolist()
    # head 2 tokens, document 70 (needle at document tokens 44-49), question 6, continuation 12
    return {"head_ids": ids[:2], "document_ids": ids[2:72], "question_ids": ids[72:78],
            "continuation_ids": ids[78:90], "passkey_tokens": [44, 50]}


def reference_nll(model, case, kept_document: list[int]) -> float:
    """The continuation's loss from one forward of document + continuation: the document reads
    causally (as the one-pass prefill did); each continuation token sees the kept document
    positions and the continuation up to itself; the first token is predicted from the
    document's last row."""
    document = case["head_ids"] + case["document_ids"]
    tokens = document + case["continuation_ids"]
    n, d = len(tokens), len(document)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    dropped = torch.ones(d, dtype=torch.bool)
    dropped[kept_document] = False
    mask[d:, :d] &= ~dropped
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([tokens]), attention_mask=mask[None, None]).logits[0].float()
    rows = logits[d - 1:n - 1]
    return float(torch.nn.functional.cross_entropy(rows, torch.tensor(case["continuation_ids"])))


@pytest.mark.parametrize("aware", [False, True])
def test_the_peer_keeps_the_budget_and_scores_the_continuation_over_it(peer, aware):
    model = make_tiny_model(layers=2, seed=6)
    case, press = a_case(), KeepEnds()
    settings = {"press_name": "streaming-llm", "question_aware": aware, "budget": BUDGET, "sinks": SINKS,
                "vocab": 128, "max_new_tokens": 3, "one_line": False, "press_settings": {"press": "KeepEnds"}}
    result = peer.run_case(model, Tokens(), press, settings, case)
    document = len(case["head_ids"]) + len(case["document_ids"])
    question = len(case["question_ids"]) if aware else 0
    # the ratio keeps exactly the budget, the sinks and (question-aware) the question
    assert result["context_entries"] == BUDGET + SINKS + question == len(press.kept)
    assert result["memory_entries"] == BUDGET + SINKS  # the question's entries are gone
    kept_document = [p for p in press.kept.tolist() if p < document]
    assert len(kept_document) == BUDGET + SINKS and kept_document[:SINKS] == list(range(SINKS))
    if aware:
        assert result["settings"]["question_entries_kept"] == question
    # the needle (document tokens 44-49, context positions 46-51): the press kept 48 on
    needle = range(46, 52)
    share = sum(p in kept_document for p in needle) / len(needle)
    assert result["retention"] == [round(share, 4)] * 2 and result["needle_whole"] == float(share == 1)
    assert share == 4 / 6
    assert result["continuation_nll"] == pytest.approx(reference_nll(model, case, kept_document), abs=1e-4)
    assert len(result["answer"].split()) == 3  # three greedy tokens (no end token in a random model)
