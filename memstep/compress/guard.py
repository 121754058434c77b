"""The guard: a compressed model is compared, on the same probe, with the dense model and with
the simple baseline at the same size (dropping the same number of layers by block influence).
When the check finds the model worse than that baseline, or its perplexity past a limit on the
ratio against the dense model, it is not saved unless the user asks for it by name
(``--keep-worse`` on the command line, a tick box in the app); either way one line says why,
with both perplexities.

Plain functions of the measured rows (``quality.measure``'s dicts, ``label`` and ``layers``
set), so the CLI, the app and the tests share one rule."""

from __future__ import annotations

from memstep.errors import MemstepError

KEEP_FLAG = "--keep-worse"
CHECK_WINDOWS = 4  # the check's held-out windows of 256 tokens when the full measurements are off


def check_limit(limit: float | None) -> float | None:
    """A perplexity-ratio limit must be a finite number of at least 1 (the dense model's ratio)."""
    if limit is None:
        return None
    if not (isinstance(limit, (int, float)) and limit == limit and 1 <= limit < float("inf")):
        raise MemstepError(f"the guard's limit is a perplexity ratio against the dense model, 1 or more "
                           f"(e.g. 2 refuses a model whose perplexity more than doubles), got {limit}")
    return float(limit)


def compare(method: dict, baseline: dict, dense: dict) -> dict:
    """The verdict on ``method`` against ``baseline`` (both measured on the same probe as
    ``dense``): ``worse`` when its perplexity is higher, and the line that says so."""
    worse = method["perplexity"] > baseline["perplexity"]
    verdict = {"method": method["label"], "baseline": baseline["label"], "worse": worse,
               "perplexity": method["perplexity"], "baseline_perplexity": baseline["perplexity"],
               "dense_perplexity": dense["perplexity"], "layers": method["layers"],
               "removed_layers": dense["layers"] - method["layers"], "message": None}
    if worse:
        verdict["message"] = f"{worse_text(verdict)}; keep the baseline's model instead"
    return verdict


def worse_text(verdict: dict) -> str:
    """A worse verdict in words, with both perplexities (and the dense model's)."""
    depth = verdict["layers"] + verdict["removed_layers"]
    return (f"{verdict['method']} is worse than {verdict['baseline']} at the same layer count ({verdict['layers']} of "
            f"{depth} layers): perplexity {verdict['perplexity']:,.2f} against {verdict['baseline_perplexity']:,.2f} "
            f"(dense {verdict['dense_perplexity']:,.2f})")


def past_limit(row: dict, dense: dict, limit: float | None) -> str | None:
    """What is wrong with ``row``'s perplexity under ``limit`` (a ratio against the dense
    model's), or None when it is within it."""
    if limit is None:
        return None
    ratio = row["perplexity"] / dense["perplexity"]
    if ratio <= limit:
        return None
    return (f"{row['label']}'s perplexity is x{ratio:,.2f} the dense model's ({row['perplexity']:,.2f} against "
            f"{dense['perplexity']:,.2f}), past the guard's limit x{limit:g}")


def findings(row: dict, dense: dict, verdict: dict | None, limit: float | None) -> list[str]:
    """Why the check finds ``row``'s model worse: against the baseline (``verdict`` from
    ``compare``) and against the limit; empty when it passes."""
    found = [worse_text(verdict)] if verdict and verdict["worse"] else []
    limit_text = past_limit(row, dense, limit)
    if limit_text:
        found.append(limit_text)
    return found


def refusal(found: list[str], keep_worse: bool, name: str = KEEP_FLAG) -> str | None:
    """The one line that refuses the save (None: it may be saved). ``name`` is the way to save
    it anyway (the flag on the command line, the tick box in the app)."""
    if not found or keep_worse:
        return None
    return f"not saved: {'; '.join(found)}; {name} saves it anyway"


def kept_anyway(found: list[str], name: str = KEEP_FLAG) -> str | None:
    """The one line that says a model the check finds worse was saved because it was asked for."""
    return f"saved although the check finds it worse ({name}): {'; '.join(found)}" if found else None
