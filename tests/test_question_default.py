"""memstep's default question-aware memory, one component at a time against cases worked by hand:
rank each key by the question's attention alone (weight 1), max-pooled over its 15 centred neighbours,
and read the kept tokens at shared positions. The recipe it replaced stays by name (--question-pool tuned)."""

from __future__ import annotations

import json

import torch
from conftest import ASSETS
from test_cli import cli
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep.engine import ChunkedPrefill, question_mix, question_share
from memstep.presets import resolve_rope
from memstep.question_pool import QUESTION_POOL, QUESTION_WEIGHT, TUNED, TUNED_POOL, named_pool
from memstep.shared_positions import held_tokens, shared_positions

EXAMPLE = str(ASSETS / "pride_and_prejudice_ch1-12.txt")


def _question() -> torch.Tensor:
    """20 keys, 4 sinks: the question looks at key 8 (1.0) and key 17 (0.5), and at a sink (50)."""
    question = torch.zeros(1, 20)
    question[0, 8], question[0, 17], question[0, 2] = 1.0, 0.5, 50.0
    return question


def test_the_pool_takes_the_strongest_of_seven_neighbours_on_each_side():
    """max:15 centred: key k takes max(q[k-7 .. k+7]) over the non-sink keys. Keys 4..15 see key 8 (1.0:
    key 15 is 7 after it, key 1 would be 7 before); keys 16..19 see only key 17 (0.5). The pooled
    question sums to 12 x 1.0 + 4 x 0.5 = 14; the sink's 50 is taken out first and spills on nothing."""
    assert QUESTION_POOL == "max:15"
    share = question_share(_question(), torch.arange(20)[None], sinks=4)
    expected = torch.zeros(20)
    expected[4:16] = 1.0 / 14
    expected[16:20] = 0.5 / 14
    assert torch.allclose(share[0], expected)


def test_the_question_alone_ranks_the_keys():
    """Weight 1: the scorer's vote takes no part, whatever it is; at 0.75 (the tuned recipe's) it takes a quarter."""
    assert QUESTION_WEIGHT == 1.0
    positions = torch.arange(20)[None]
    share = question_share(_question(), positions, sinks=4)
    for base in (torch.ones(1, 20), torch.rand(1, 20, generator=torch.Generator().manual_seed(0))):
        mixed = question_mix(base, _question(), positions, sinks=4, weight=QUESTION_WEIGHT)
        assert torch.allclose(mixed, share)
    flat = question_mix(torch.ones(1, 20), _question(), positions, sinks=4, weight=0.75)
    assert torch.allclose(flat[0, 4:16], torch.full((12,), 0.25 / 16 + 0.75 / 14))


def test_kept_tokens_read_at_shared_positions():
    """Auto positions for a question-aware memory within the context are shared at every budget: two heads
    keeping document positions {4, 9, 30} and {9, 17, 30} read them at their ranks among {4, 9, 17, 30}
    (0, 1, 3 and 1, 2, 3): a token has one position in both heads, neighbours one apart; the chunk after."""
    for memory in (64, 128, 256, 512, 2048):
        assert resolve_rope("auto", schedule="fm", memory=memory, question_aware=True) == "shared"
    kept = torch.tensor([[4, 9, 30], [9, 17, 30]])
    held = held_tokens([kept])
    assert held.tolist() == [4, 9, 17, 30]
    assert shared_positions(held, kept, later=2).tolist() == [[0, 1, 3, 4, 5], [1, 2, 3, 4, 5]]


def test_the_engine_and_the_cli_run_the_default_and_the_tuned_recipe_by_name(tiny_lm, capsys, tiny_lm_folder):
    engine = ChunkedPrefill(tiny_lm.model, question_ids=[5, 6])
    assert (engine.question_pool, engine.question_weight) == ("max:15", 1.0)
    tuned = ChunkedPrefill(tiny_lm.model, question_ids=[5, 6], question_pool=TUNED)
    assert (tuned.question_pool, tuned.question_weight) == (TUNED_POOL, 0.75)
    assert named_pool(None) == QUESTION_POOL and named_pool(" tuned ") == TUNED_POOL
    from memstep.cli import build_parser

    args = build_parser().parse_args(["run", "doc.txt", "--question-aware"])
    assert (args.question_pool, args.question_weight) == ("max:15", None)  # None: the pool's own weight
    for pool, picked in ((None, ("max:15", 1.0, "shared")), (TUNED, (TUNED_POOL, 0.75, "compact"))):
        code, out, err = cli(capsys, "run", EXAMPLE, "--model", tiny_lm_folder, "--schedule", "fm", "--chunk", 128,
                             "--memory", 300, "--max-tokens", 600, "--question", "Who?", "--question-aware",
                             *(["--question-pool", pool] if pool else []), "--max-new-tokens", 1, "--quiet", "--json")
        assert code == 0, err
        result = json.loads(out)
        # the tuned recipe keeps its own rule: compact positions from 256 entries per head
        assert (result["question_pool"], result["question_weight"], result["rope"]) == picked
