"""RoPE positions "auto", memstep's default: shared positions for a question-aware memory on a
document within the model's context, compact ones elsewhere (the tuned recipe, --question-pool tuned:
shared below 256 entries per KV head only).

- the rule against a table written by hand;
- a run (the tiny model, SmolLM2's tokenizer, 8,192 trained positions) records the mode it picked,
  a document longer than the context reads at compact positions, and `memstep run` says which;
- the evaluation stores auto as the mode it picks (its cells are that mode's cells), and pairs the
  presses with the row at the default's positions;
- the app's settings keep the choice, label the run by the mode it used, and let auto read books.
"""

from __future__ import annotations

import pytest
from conftest import ASSETS
from test_cli import cli
from test_models import tiny_lm, tiny_lm_folder  # noqa: F401  (fixtures)

from memstep.errors import MemstepError
from memstep.evaluation.grid import make_grid
from memstep.evaluation.metrics import anchor_of
from memstep.presets import resolve_rope

EXAMPLE = str(ASSETS / "pride_and_prejudice_ch1-12.txt")


@pytest.mark.parametrize("asked, schedule, memory, aware, ntk, within, picked", [
    ("auto", "fm", 128, True, "none", True, "shared"),
    ("auto", "imdc", 255, True, "none", True, "shared"),
    ("auto", "fm", 256, True, "none", True, "shared"),
    ("auto", "fm", 4096, True, "none", True, "shared"),
    ("auto", "fm", 128, False, "none", True, "compact"),  # without the question: compact
    ("auto", "full", 128, True, "none", True, "compact"),  # nothing evicted
    ("auto", "fm", 128, True, "dynamic", True, "compact"),  # dynamic NTK rescales compact positions only
    ("auto", "fm", 128, True, "none", False, "compact"),  # longer than the context: never past sinks + M + c
    ("document", "fm", 128, True, "none", True, "document"),  # a mode asked by name is kept
    ("compact", "fm", 128, True, "none", True, "compact"),
    ("shared", "fm", 512, False, "none", False, "shared"),
])
def test_the_rule_by_hand(asked, schedule, memory, aware, ntk, within, picked):
    assert resolve_rope(asked, schedule=schedule, memory=memory, question_aware=aware, ntk=ntk,
                        within_context=within) == picked


@pytest.mark.parametrize("memory, picked", [(128, "shared"), (255, "shared"), (256, "compact"), (512, "compact")])
def test_the_tuned_recipe_keeps_its_own_rule(memory, picked):
    from memstep.question_pool import TUNED, TUNED_POOL, shared_below

    assert shared_below(TUNED) == shared_below(TUNED_POOL) == 256 and shared_below(None) is None
    assert resolve_rope("auto", schedule="fm", memory=memory, question_aware=True,
                        shared_below=shared_below(TUNED)) == picked


def test_a_run_records_the_mode_auto_picked(tiny_lm):
    """Picked when the run is set up (no prefill needed): by the question, the budget and whether the
    document (here 600 and 8,400 tokens) fits the model's 8,192 trained positions."""
    from memstep.runner import DocumentRun

    def picked(tokens: int, memory: int, aware: bool = True, rope: str = "auto") -> str:
        run = DocumentRun(tiny_lm, list(range(100, 100 + tokens)), schedule="fm", chunk=256, memory=memory,
                          question="Who rents Netherfield?", question_aware=aware, rope=rope)
        assert run.engine.rope == run.result.rope  # the engine reads at the recorded positions
        return run.result.rope

    assert picked(600, 64) == "shared" and picked(600, 256) == "shared"
    assert picked(600, 64, aware=False) == "compact"
    assert picked(600, 64, rope="compact") == "compact"
    assert picked(8400, 64) == "compact"  # longer than the context: never past sinks + M + c


def test_memstep_run_defaults_to_auto_and_says_what_it_picked(capsys, tiny_lm_folder):
    code, out, err = cli(capsys, "run", EXAMPLE, "--model", tiny_lm_folder, "--schedule", "fm", "--chunk", 256,
                         "--memory", 64, "--max-tokens", 600, "--question", "Who?", "--question-aware",
                         "--max-new-tokens", 1, "--quiet")
    assert code == 0, err
    assert "shared RoPE positions" in out.splitlines()[0]


def test_an_unknown_mode_is_refused_before_the_model_loads(capsys):
    code, _, err = cli(capsys, "run", EXAMPLE, "--model", "/nonexistent", "--rope", "sideways")
    assert code == 2 and "auto" in err and len(err.strip().splitlines()) == 1


def test_the_grid_stores_auto_as_the_mode_it_picks():
    configs = make_grid(["fm"], ["chunk-attention"], [128, 256], 512, question_aware=(True, False))
    ropes = {(c.budget, c.question_aware): c.rope for c in configs}
    assert ropes == {(128, True): "shared", (256, True): "shared", (128, False): "compact",
                     (256, False): "compact"}
    tuned = make_grid(["fm"], ["chunk-attention"], [128, 256], 512, question_aware=(True,), question_pools=("tuned",))
    assert [(c.budget, c.rope, c.question_weight) for c in tuned] == [(128, "shared", 0.75), (256, "compact", 0.75)]
    both = make_grid(["fm"], ["chunk-attention"], [128], 512, ropes=("auto", "shared"), question_aware=(True,))
    assert [c.rope for c in both] == ["shared"]  # the same configuration once
    reference = make_grid(["fm"], ["chunk-attention"], [128], 512, question_aware=(True,), fidelities=("reference",))
    assert [c.rope for c in reference] == ["compact"]  # the reference's dynamic NTK
    with pytest.raises(MemstepError, match="choose from auto, compact, document, shared"):
        make_grid(["fm"], ["chunk-attention"], [128], 512, ropes=("sideways",))


def _row(rope: str, budget: int, aware: bool = True) -> dict:
    config = {"kind": "memstep", "schedule": "fm", "budget": budget, "rope": rope, "question_aware": aware}
    return {"label": f"fm M={budget} {rope} {aware}", "length": 2048, "config": config}


def test_the_presses_pair_with_the_row_at_the_default_positions():
    rows = [_row("compact", 128), _row("document", 128), _row("shared", 128), _row("compact", 256),
            _row("shared", 256), _row("compact", 128, aware=False)]
    assert anchor_of(rows, 2048, 128)["config"]["rope"] == "shared"
    assert anchor_of(rows, 2048, 256)["config"]["rope"] == "shared"
    # results without a row at the default's positions still pair with the default's settings
    assert anchor_of([_row("compact", 128), _row("compact", 128, aware=False)], 2048, 128) \
        == _row("compact", 128)


def test_the_app_keeps_the_choice_and_labels_the_mode_used():
    from memstep.records import RunResult
    from ui.runs import compact_positions, settings_from
    from ui.views import RunView

    aware = settings_from("fm", 512, 128, "linear", None, 4, question_aware=True)
    assert aware.rope == "auto" and aware.positions() == "shared" and "· shared positions" in aware.label()
    plain = settings_from("fm", 512, 128, "linear", None, 4)
    assert plain.positions() == "compact" and "positions" not in plain.label()
    assert compact_positions(aware, 8192)  # auto reads a book at compact positions past the context
    assert not compact_positions(settings_from("fm", 512, 128, "linear", None, 4, "shared"), 8192)
    # a run that picked compact (a book longer than the context) is labelled by what it used
    view = RunView(document=None, settings=aware, schedule=None, result=RunResult(
        model="m", tokens=9000, prefix_tokens=0, schedule={}, scorer="chunk-attention", sinks=4, device="cpu",
        dtype="float32", rope="compact"))
    assert "positions" not in view.label() and view.label().startswith("FM c512 M128")
    with pytest.raises(MemstepError, match="RoPE positions"):
        settings_from("fm", 512, 128, "linear", None, 4, "sideways")
