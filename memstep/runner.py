"""One document run: prompt framing, schedule, engine, then question and continuation.

The CLI, the app and the evaluation all go through ``DocumentRun`` so they agree on how a
document is framed and what a run reports.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import numpy as np

from memstep.engine import ChunkedPrefill
from memstep.errors import MemstepError
from memstep.generate import (answer, answer_from_prefill, continuation_nll, crop_memory, memory_mark, prompt_form,
                              prompt_parts)
from memstep.models import LoadedModel
from memstep.presets import Fidelity, resolve_rope
from memstep.question_pool import QUESTION_POOL, SENTENCE, default_weight, named_pool, shared_below, spans_need_text
from memstep.records import RunResult, StepRecord
from memstep.schedules import check_run_settings, make_schedule
from memstep.scorers import make_scorer
from memstep.spans import DEFAULT_CAP, SpanSetting, check_span_budget, parse_span, span_table, split_notice, token_texts


QUESTION_ROOM = 64  # positions left for a question and its answer after the memory


class DocumentRun:
    """Prefill ``document_ids`` under a schedule; iterate to get one StepRecord per step.
    Settings are checked on construction, so bad ones fail before any model work."""

    def __init__(self, lm: LoadedModel, document_ids: list[int], *, schedule: str = "imdc",
                 chunk: int = 512, memory: int = 512, growth: str = "linear",
                 scorer: str = "chunk-attention", sinks: int = 4, seed: int = 0, window: int = 32,
                 question: str | None = None, max_new_tokens: int = 32, continuation_tokens: int = 0,
                 notices: list[str] | None = None, attention: str = "sdpa", rope: str = "compact",  # or auto
                 kernel: int = 5, question_aware: bool = False, question_weight: float | None = None,
                 fidelity: Fidelity | None = None, review: tuple[str, int, int] | None = None,
                 question_pool: str = QUESTION_POOL, span: str | None = None):
        if sinks < 0:
            raise MemstepError(f"sinks must be 0 or more (got {sinks})")
        if max_new_tokens < 1:
            raise MemstepError(f"max new tokens must be at least 1 (got {max_new_tokens})")
        if continuation_tokens < 0 or continuation_tokens >= len(document_ids):
            raise MemstepError(f"continuation tokens must be between 0 and {len(document_ids) - 1} "
                               f"for this {len(document_ids)}-token document (got {continuation_tokens})")
        self.lm = lm
        self.question = question.strip() if question and question.strip() else None
        self.max_new_tokens = max_new_tokens
        self.fidelity = fidelity or Fidelity()
        # the reference's way: the question ends the prompt, prefilled and compressed with the document
        self.in_prompt = self.fidelity.question_place == "prompt" and self.question is not None
        if self.in_prompt and continuation_tokens:
            raise MemstepError("with the question inside the prompt the prefill ends with the question, so no "
                               "held-out continuation can follow the document: score it without a question, or "
                               "with question place 'after'")
        if self.in_prompt and question_aware:
            raise MemstepError("question-aware compression reads the question after every chunk; with the question "
                               "inside the prompt it is prefilled once, at the end: choose one (question place 'after')")
        self.head = prompt_parts(lm.tokenizer).head
        # one int64 array, not a list of Python ints: the engine slices it chunk by chunk, and a
        # whole novel (155k tokens) would otherwise be copied once more as 155k list entries
        document = np.asarray(document_ids, dtype=np.int64).reshape(-1)
        kept = document[: len(document) - continuation_tokens]
        self.held_out = document[len(kept):].tolist()
        tail = prompt_parts(lm.tokenizer, self.question).tail if self.in_prompt else []
        self.input_ids = np.concatenate([np.asarray(self.head, dtype=np.int64), kept,
                                         np.asarray(tail, dtype=np.int64)])
        tokens = len(self.input_ids)
        check_run_settings(schedule, tokens, chunk, memory, sinks)
        limit = getattr(lm.model.config, "max_position_embeddings", None)
        question_pool = named_pool(question_pool)  # 'tuned': the recipe it names
        if question_weight is None:  # the pool's own: the tuned recipe's, else the default's
            question_weight = default_weight(question_pool)
        rope = resolve_rope(rope, schedule=schedule, memory=memory, question_aware=bool(question_aware),
                            ntk=self.fidelity.ntk, within_context=not limit or tokens + QUESTION_ROOM <= limit,
                            shared_below=shared_below(question_pool))
        self.schedule = make_schedule(schedule, tokens, chunk, memory, growth,
                                      layers=lm.model.config.num_hidden_layers,
                                      rounding=self.fidelity.growth_rounding, review=review)
        self.span = parse_span(span)
        if self.schedule.name != "full":
            check_span_budget(self.span, memory)
        self.engine = ChunkedPrefill(lm.model, make_scorer(scorer, seed, window, kernel), sinks, attention,
                                     rope=rope, question_ids=self._question_ids(question_aware),
                                     question_weight=question_weight, fidelity=self.fidelity,
                                     question_pool=question_pool, span=self.span)
        notices = list(notices or []) + self._positions_notice(lm.model.config, rope)
        # +spans:Kxsentence (question-aware only): the sentence breaks, as --span sentence finds them
        sentences = bool(self.engine.question_ids.numel()) and spans_need_text(question_pool)
        texts = token_texts(lm.tokenizer, self.input_ids) if self.span is not None or sentences else None
        if sentences:
            self.engine.sentence_table = span_table(SpanSetting(SENTENCE, DEFAULT_CAP), texts, sinks)
        if self.span is not None:
            self.engine.span_table = span_table(self.span, texts, sinks)
            cuts = [a - sinks for (b, a), c in zip(self.schedule.cache_lengths(sinks), self.schedule.chunk_sizes)
                    if b + c > a]  # the steps that evict
            smallest = min(cuts, default=memory)
            notices += [line for line in [split_notice(self.span, smallest)] if line]
        self.result = RunResult(
            model=lm.name, tokens=tokens, prefix_tokens=len(self.head), schedule=self.schedule.to_dict(),
            scorer=scorer, sinks=sinks, device=lm.device, dtype=lm.dtype, question=self.question,
            continuation_tokens=continuation_tokens, notices=notices, rope=rope,
            attention=attention, question_aware=bool(question_aware),
            question_weight=question_weight if question_aware else None,
            question_pool=question_pool if question_aware else None,
            fidelity=dict(self.fidelity.__dict__), prompt_question_tokens=len(tail),
            prompt_form=prompt_form(lm.tokenizer), layers=self.engine.kinds.to_dict())

    def span_report(self) -> dict | None:
        """Span-preserving runs: the setting and, per (layer, KV head), the spans the memory holds
        whole and in part."""
        if self.span is None or not self.result.steps:
            return None
        from memstep.spans import kept_whole

        last = self.result.steps[-1]
        return {"setting": self.span.name, **kept_whole(last.kept_positions, self.engine.span_table,
                                                          self.engine.sinks)}

    def _question_ids(self, question_aware: bool) -> list[int] | None:
        """The tokens that follow the document when the question is asked (the chat template's
        tail with the question): what a question-aware prefill reads after every chunk."""
        if not question_aware:
            return None
        if not self.question:
            raise MemstepError("question-aware compression needs a question: type one, or untick question-aware")
        ids = prompt_parts(self.lm.tokenizer, self.question).tail
        limit = getattr(self.lm.model.config, "max_position_embeddings", None)
        if limit and len(ids) >= limit // 2:
            raise MemstepError(f"the question has {len(ids)} tokens: question-aware compression reads it with every "
                               f"chunk, so it must stay under half the model's {limit}-token context")
        return ids

    def _positions_notice(self, config, rope: str) -> list[str]:
        """A warning when the run will put tokens at positions the model was not trained on
        (with room for a question and its answer after the memory)."""
        limit = getattr(config, "max_position_embeddings", None)
        used = self.schedule.tokens
        if rope != "document" and self.schedule.name != "full":
            steps = list(zip(self.schedule.cache_lengths(self.engine.sinks), self.schedule.chunk_sizes))
            if rope == "compact":
                used = max(before + chunk for (before, _), chunk in steps)
            else:  # shared: at most every layer and head holding different tokens
                heads = self.engine.shape.kv_heads * len(self.engine.decoder.layers)
                used = min(used, max(heads * before + chunk for (before, _), chunk in steps))
        if not limit or used + QUESTION_ROOM <= limit:
            return []
        if self.fidelity.ntk == "dynamic":
            return [f"{rope} RoPE positions reach {used}, beyond the model's {limit} trained positions: dynamic NTK "
                    "scales RoPE's base in the steps that pass them."]
        reach = "can reach" if rope == "shared" else "reach"  # shared: a bound, heads often keep the same tokens
        return [f"{rope} RoPE positions {reach} {used}, beyond the model's {limit} trained positions: "
                "answers may degrade" + (" (compact positions would stop at sinks + M + c)" if rope == "document"
                                         and self.schedule.name != "full" else "") + "."]

    def __iter__(self) -> Iterator[StepRecord]:
        began = time.perf_counter()
        for record in self.engine.run(self.input_ids, self.schedule):
            self.result.steps.append(record)
            yield record
        self.result.seconds = time.perf_counter() - began
        self._mark = memory_mark(self.engine)
        if self.held_out:
            self.result.continuation_nll = continuation_nll(self.engine, self.held_out)
            self._restore()
        if self.in_prompt:
            try:
                self.result.answer = answer_from_prefill(self.engine, self.lm.tokenizer, self.max_new_tokens)
            finally:
                self._restore()
        elif self.question:
            self.result.answer = self.ask(self.question)

    def run(self) -> RunResult:
        for _ in self:
            pass
        return self.result

    def ask(self, question: str, max_new_tokens: int | None = None) -> str:
        """Answer from the compressed memory; the memory is left as the prefill made it."""
        if not self.result.steps or len(self.result.steps) < self.schedule.steps:
            raise MemstepError("run the prefill before asking a question")
        if not question or not question.strip():
            raise MemstepError("the question is empty: type a question about the document")
        if self.in_prompt:
            if question.strip() == self.question and self.result.answer is not None:
                return self.result.answer
            raise MemstepError("this run prefilled its question inside the prompt: another question needs another "
                               "run (or question place 'after')")
        try:
            return answer(self.engine, self.lm.tokenizer, question.strip(), max_new_tokens or self.max_new_tokens)
        finally:
            self._restore()

    def _restore(self) -> None:
        crop_memory(self.engine, self._mark)
