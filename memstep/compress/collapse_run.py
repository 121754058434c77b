"""One LaCo run as users see it: the search (one event per candidate), then the dense model,
LaCo and the layer-removal baselines at the same number of removed layers measured on the same
probe, the guard's verdict (is LaCo worse than dropping the same number of layers by block
influence?), and the collapsed model saved when asked, only once the check has passed (or the
user asked to keep a worse model by name). The CLI, the app and the benchmark iterate the same
events (plain dicts, ``event`` says which)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from memstep.compress.baselines import lowest_influence, remove_layers, uniform_layers
from memstep.compress.data import save_model
from memstep.compress.guard import KEEP_FLAG, check_limit, compare, findings, kept_anyway, refusal
from memstep.compress.laco import VARIANTS, LayerCollapse
from memstep.compress.quality import Probe, make_check_probe, measure, relative
from memstep.errors import MemstepError
from memstep.models import LoadedModel

LABELS = {"dense": "dense", "laco-paper": "LaCo (paper formula)", "laco-notebook": "LaCo (released notebook)",
          "block-influence": "block influence (ShortGPT)", "uniform": "uniform removal"}


class CollapseRun:
    """LaCo on ``lm`` for each of ``variants`` (the first one is saved to ``output``), then,
    with a ``probe``, every model measured: a variant whose collapsed model has the weights of
    one measured before (or of the dense model, when nothing was removed) reuses its row
    (``same_as``). Block influence at the same number of removed layers is always measured with
    a probe (the guard compares against it); ``baselines`` adds uniform removal (never on a
    check probe). A model to save is always checked first: without a probe, a check probe
    (quality.make_check_probe) is measured. It is not saved when it is worse than block
    influence or its perplexity ratio against the dense model passes ``guard`` (a limit, or
    None), unless ``keep_worse``; ``keep_name`` names that way to the user in the refusal's line.
    Settings are checked on construction."""

    def __init__(self, lm: LoadedModel, calibration: list[str], *, variants=("paper",), probe: Probe | None = None,
                 baselines: bool = True, output: str | Path | None = None, repeats: int = 1,
                 dense: dict | None = None, guard: float | None = None, keep_worse: bool = False,
                 keep_name: str = KEEP_FLAG, **settings):
        if not variants or any(v not in VARIANTS for v in variants):
            raise MemstepError(f"LaCo variants must be among {', '.join(VARIANTS)} (got {', '.join(variants) or 'none'})")
        self.output = Path(output) if output else None
        if probe is None and (self.output or guard is not None):  # no save, and no limit, goes unchecked
            probe = make_check_probe(lm.tokenizer)
        self.lm, self.probe, self.repeats = lm, probe, repeats
        self.baselines = baselines and not (probe and probe.check_only)
        self.guard, self.keep_worse, self.keep_name = check_limit(guard), bool(keep_worse), keep_name
        self.dense = dense  # the dense model's row from an earlier run on the same probe: not measured again
        self.searches = {v: LayerCollapse(lm.model, lm.tokenizer, calibration, variant=v, **settings)
                         for v in variants}
        self.report: dict = {"model": lm.name, "variants": list(variants), "searches": {}, "models": {},
                             "probe": probe.to_dict() if probe else None, "saved": None,
                             "guard": None, "refused": None, "kept_worse": None, "guard_limit": self.guard,
                             "keep_worse": self.keep_worse}

    def _loaded(self, model, name: str) -> LoadedModel:
        return LoadedModel(model, self.lm.tokenizer, name, self.lm.device, self.lm.dtype)

    def _measure(self, key: str, model) -> dict:
        began = time.perf_counter()
        row = measure(self._loaded(model, LABELS[key]), self.probe, self.repeats)
        row["label"], row["seconds_measuring"] = LABELS[key], time.perf_counter() - began
        self.report["models"][key] = row
        return {"event": "model", "key": key, **row}

    def _twin(self, model, groups, measured: dict) -> tuple[str, float] | None:
        """A variant measured already whose collapsed model has the same layers and weights
        within float rounding (the paper's formula and the notebook's coincide for two-layer
        merges: theta_l + (theta_{l+1} - theta_l) = theta_{l+1}); its results are reused."""
        for variant, (other, other_groups) in measured.items():
            if other_groups == groups:
                diff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), other.parameters()))
                if diff <= 1e-5:
                    return f"laco-{variant}", diff
        return None

    def _reuse(self, key: str, twin: str, difference: float) -> dict:
        """``twin``'s measurements for ``key``, whose weights equal twin's to ``difference``."""
        row = {**self.report["models"][twin], "label": LABELS[key], "same_as": twin,
               "max_weight_difference": difference, "seconds_measuring": 0.0}
        self.report["models"][key] = row
        return {"event": "model", "key": key, **row}

    def __iter__(self) -> Iterator[dict]:
        collapsed = {}
        first = None
        for variant, search in self.searches.items():
            for record in search:
                yield {**record.to_dict(), "variant": variant}
            result = search.result
            self.report["searches"][variant] = result.to_dict()
            yield {**result.to_dict(), "variant": variant}
            first = first or search
            if self.probe:
                collapsed[variant] = search.build()
        if self.probe is None:  # a search alone: nothing to save (a save always has a probe)
            return
        kept = collapsed[first.settings["variant"]] if self.output else None  # saved once measured
        if self.dense is None:
            yield self._measure("dense", self.lm.model)
        else:
            self.report["models"]["dense"] = dict(self.dense)
            yield {"event": "model", "key": "dense", **self.dense}
        measured = {}  # variant -> its collapsed model, to spot a variant whose weights are another's
        for variant, search in self.searches.items():
            model = collapsed.pop(variant)
            twin = ("dense", 0.0) if not search.result.removed else self._twin(model, search.result.groups, measured)
            key = f"laco-{variant}"
            if twin is None:
                event = self._measure(key, model)
                measured[variant] = (model, search.result.groups)
            else:
                event = self._reuse(key, *twin)
            self.report["models"][key]["removed"] = event["removed"] = list(search.result.removed)
            yield event
        removed = len(first.result.removed)
        if removed:
            scores = first.stack.block_influence()
            self.report["block_influence"] = scores
            depth = first.result.layers_before
            baselines = [("block-influence", lowest_influence(scores, removed))]
            if self.baselines:
                baselines.append(("uniform", uniform_layers(depth, removed)))
            for key, layers in baselines:
                model = remove_layers(self.lm.model, layers, info={"method": key, "removed": layers})
                event = self._measure(key, model)
                self.report["models"][key]["removed"] = event["removed"] = layers
                del model
                yield event
        dense = self.report["models"]["dense"]
        for row in self.report["models"].values():
            row.update(relative(row, dense))
        models, key = self.report["models"], f"laco-{first.settings['variant']}"
        if removed:
            self.report["guard"] = compare(models[key], models["block-influence"], dense)
            yield {"event": "guard", **self.report["guard"]}
        if kept is not None:  # the save waits for the check
            found = findings(models[key], dense, self.report["guard"], self.guard)
            self.report["refused"] = refusal(found, self.keep_worse, self.keep_name)
            if self.report["refused"]:
                yield {"event": "refused", "message": self.report["refused"]}
            else:
                self.report["kept_worse"] = kept_anyway(found, self.keep_name)
                yield {**self._save(kept, first.settings["variant"]), "kept_worse": self.report["kept_worse"]}
        yield {"event": "done", **self.report}

    def _save(self, model, variant: str) -> dict:
        self.report["saved"] = str(save_model(model, self.lm.tokenizer, self.output,
                                              info=model.config.memstep_compress))
        return {"event": "saved", "folder": self.report["saved"], "variant": variant}

    def save_baseline(self, folder: str | Path, key: str = "block-influence") -> Path:
        """Save the measured baseline ``key``'s model (rebuilt from the dense model) to ``folder``."""
        row = self.report["models"].get(key)
        if not row or "removed" not in row:
            raise MemstepError(f"no measured {LABELS.get(key, key)} model to save: run with the measurements first")
        model = remove_layers(self.lm.model, row["removed"], info={"method": key, "removed": row["removed"]})
        return save_model(model, self.lm.tokenizer, folder, info=model.config.memstep_compress)
