"""LaCo's reference model: "dense" compares every candidate with the dense model (the paper's
Algorithm 1); "current" with the model collapsed so far, so after an accepted merge the next
candidate is compared with that merged model. Each candidate's similarity is recomputed here
from full forwards of the models the records describe."""

from __future__ import annotations

import pytest
import torch
from conftest import make_tiny_model
from test_compress_laco import CALIBRATION, ByteTokenizer

from memstep.compress.laco import LayerCollapse, merge_layers
from memstep.compress.layers import final_hidden, using_layers


def similarity(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    """LaCo's: per sentence the cosine of the flattened final hidden states, averaged."""
    return sum(torch.nn.functional.cosine_similarity(x.flatten(), y.flatten(), dim=0).item()
               for x, y in zip(a, b)) / len(a)


@pytest.mark.parametrize("reference", ["dense", "current"])
def test_each_candidate_is_compared_with_its_reference_model(reference):
    model = make_tiny_model(layers=6, seed=4)
    search = LayerCollapse(model, ByteTokenizer(), CALIBRATION, C=3, L=0, I=1, T=0.05, reference=reference,
                           merge="chained")
    records = list(search)
    dense = final_hidden(model, search.batches)
    layers, groups = list(model.model.layers), [[i] for i in range(6)]
    current = dense
    checked_after_a_merge = 0
    for record in records:
        l, end = record.index, record.index + len(record.layers)  # noqa: E741
        candidate = layers[:l] + [merge_layers(layers[l:end])] + layers[end:]
        candidate_groups = groups[:l] + [[i for g in groups[l:end] for i in g]] + groups[end:]
        with using_layers(model, candidate, [g[0] for g in candidate_groups]):
            hidden = final_hidden(model, search.batches)
        want = similarity(dense if reference == "dense" else current, hidden)
        assert record.similarity == pytest.approx(want, abs=1e-5), (record.step, reference)
        if current is not dense:
            checked_after_a_merge += 1
            # the two references disagree here, so the check above tells them apart
            assert abs(similarity(dense, hidden) - similarity(current, hidden)) > 1e-3
        if record.accepted:
            layers, groups, current = candidate, candidate_groups, hidden
    assert checked_after_a_merge >= 1
