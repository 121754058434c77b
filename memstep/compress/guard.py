"""The guard: a compressed model is compared, on the same probe, with the dense model and with
the simple baseline at the same size (dropping the same number of layers by block influence),
and the user is told in one line when the method did worse than the baseline. With a limit
on the perplexity ratio against the dense model, a model past it is not saved.

Plain functions of the measured rows (``quality.measure``'s dicts, ``label`` and ``layers``
set), so the CLI, the app and the tests share one rule."""

from __future__ import annotations

from memstep.errors import MemstepError


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
        verdict["message"] = (
            f"{method['label']} is worse than {baseline['label']} at the same layer count "
            f"({method['layers']} of {dense['layers']} layers): perplexity {method['perplexity']:,.2f} against "
            f"{baseline['perplexity']:,.2f} (dense {dense['perplexity']:,.2f}); keep the baseline's model instead")
    return verdict


def refusal(row: dict, dense: dict, limit: float | None) -> str | None:
    """Why ``row``'s model is not saved under ``limit``, or None when it may be."""
    if limit is None:
        return None
    ratio = row["perplexity"] / dense["perplexity"]
    if ratio <= limit:
        return None
    return (f"not saved: {row['label']}'s perplexity is x{ratio:,.2f} the dense model's "
            f"({row['perplexity']:,.2f} against {dense['perplexity']:,.2f}), past the guard's limit x{limit:g}")
