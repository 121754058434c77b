"""One LaCo run as users see it: the search (one event per candidate), then the dense model,
LaCo and the layer-removal baselines at the same number of removed layers measured on the same
probe, the guard's verdict (is LaCo worse than dropping the same number of layers by block
influence?), and the collapsed model saved when asked (unless the guard's limit refuses it).
The CLI, the app and the benchmark iterate the same events (plain dicts, ``event`` says which)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

from memstep.compress.baselines import lowest_influence, remove_layers, uniform_layers
from memstep.compress.data import save_model
from memstep.compress.guard import check_limit, compare, refusal
from memstep.compress.laco import VARIANTS, LayerCollapse
from memstep.compress.quality import Probe, measure, relative
from memstep.errors import MemstepError
from memstep.models import LoadedModel

LABELS = {"dense": "dense", "laco-paper": "LaCo (paper formula)", "laco-notebook": "LaCo (released notebook)",
          "block-influence": "block influence (ShortGPT)", "uniform": "uniform removal"}


class CollapseRun:
    """LaCo on ``lm`` for each of ``variants`` (the first one is saved to ``output``), then,
    with a ``probe``, every model measured: a variant whose collapsed model has the weights of
    one measured before (or of the dense model, when nothing was removed) reuses its row
    (``same_as``). Block influence at the same number of removed layers is always measured with
    a probe (the guard compares against it); ``baselines`` adds uniform removal. With a probe
    the model is saved after the measurements, and not at all when its perplexity ratio
    against the dense model passes ``guard`` (a limit, or None). Settings are checked on
    construction."""

    def __init__(self, lm: LoadedModel, calibration: list[str], *, variants=("paper",), probe: Probe | None = None,
                 baselines: bool = True, output: str | Path | None = None, repeats: int = 1,
                 dense: dict | None = None, guard: float | None = None, **settings):
        if not variants or any(v not in VARIANTS for v in variants):
            raise MemstepError(f"LaCo variants must be among {', '.join(VARIANTS)} (got {', '.join(variants) or 'none'})")
        self.lm, self.probe, self.baselines, self.repeats = lm, probe, baselines, repeats
        self.guard = check_limit(guard)
        if self.guard is not None and probe is None:
            raise MemstepError("the guard needs the measurements: drop --no-eval or --guard")
        self.dense = dense  # the dense model's row from an earlier run on the same probe: not measured again
        self.output = Path(output) if output else None
        self.searches = {v: LayerCollapse(lm.model, lm.tokenizer, calibration, variant=v, **settings)
                         for v in variants}
        self.report: dict = {"model": lm.name, "variants": list(variants), "searches": {}, "models": {},
                             "probe": probe.to_dict() if probe else None, "saved": None,
                             "guard": None, "refused": None, "guard_limit": self.guard}

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
            if self.probe or (self.output and search is first):
                collapsed[variant] = search.build()
            if self.output and search is first and self.probe is None:  # nothing to measure: save now
                yield self._save(collapsed[variant], variant)
        if self.probe is None:
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
        if kept is not None:
            self.report["refused"] = refusal(models[key], dense, self.guard)
            if self.report["refused"]:
                yield {"event": "refused", "message": self.report["refused"]}
            else:
                yield self._save(kept, first.settings["variant"])
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
