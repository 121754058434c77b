"""A PDF's text, read with pypdf a page at a time under a WorkBudget (memstep.read_budget).

pypdf's own limits do the bounding where it has them: its content-stream parser stops after a
given number of tokens (``stream_parsing_work_maximum_count``, set before each page to what the
budget has left), its decoders after a given output, its page tree after a given size, its form
recursion after a given number of draws. What pypdf does not count is charged here: every
operator extraction visits (``visitor_operand_before``: one step for the operator and one for
each operand), and every XObject draw its form's decompressed bytes (the forms reachable from a
page are measured once, before the page is read: a small form drawn a thousand times costs a
thousand times its content, and forms inside forms multiply). Text yielded raises the budget.
"""

from __future__ import annotations

import io
import logging

from memstep.cancel import checkpoint
from memstep.errors import MemstepError
from memstep.read_budget import OverBudget, ReadLimits, WorkBudget

DRAW_STEPS = 64          # what one draw costs beyond its form's content (a form's fonts and resources)
BYTES_PER_STEP = 2       # a content stream's bytes per token, at most ("q Q" is 2 tokens in 4 bytes)
CPU_CHECK_STEPS = 4096   # steps between two looks at the CPU clock


def pdf_text(data: bytes, filename: str, limits: ReadLimits, budget: WorkBudget) -> str:
    """The text of a PDF's pages, read one page at a time until the text holds ``max_chars``."""
    import pypdf
    from pypdf.errors import LimitReachedError

    if not data.lstrip()[:5] == b"%PDF-":
        raise MemstepError(f"{filename} is not a PDF file (no %PDF header). "
                           "Check the file, or rename it to its real type.")
    pypdf_log = logging.getLogger("pypdf")
    level = pypdf_log.level
    pypdf_log.setLevel(logging.ERROR)  # we report problems ourselves; keep stderr clean
    reader = _Reader(filename, limits, budget)
    configuration = dict(zlib_maximum_output_length=limits.max_content_bytes,
                         lzw_maximum_output_length=limits.max_content_bytes,
                         run_length_maximum_output_length=limits.max_content_bytes,
                         brotli_maximum_output_length=limits.max_content_bytes,
                         page_tree_maximum_entries=4 * limits.max_pages + 1024,
                         page_tree_maximum_page_entries=16 * limits.max_pages + 4096,
                         xform_maximum_invocations_per_extraction=limits.max_draws + 1)
    try:
        with pypdf.apply_configuration(**configuration):
            pdf = pypdf.PdfReader(io.BytesIO(data))
            if pdf.is_encrypted and not pdf.decrypt(""):
                raise MemstepError(f"{filename} is password-protected. Remove the password first.")
            for number, page in enumerate(pdf.pages, start=1):
                checkpoint()
                if limits.max_chars is not None and budget.chars >= limits.max_chars:
                    break  # the run cannot use more
                if number > limits.max_pages:
                    raise MemstepError(f"{filename}: over {limits.max_pages:,} pages before its text ends (the page "
                                       "limit per document): upload an excerpt or a .txt version")
                reader.read(page, number)
    except OverBudget:
        raise
    except MemstepError:
        raise
    except LimitReachedError as err:  # one of pypdf's limits, set from ours above
        if budget.left() == 0 or "tokens" in str(err):
            raise OverBudget(budget.work_message()) from None
        raise MemstepError(f"{filename}: {str(err).rstrip('.')} (pypdf's limit, set from the decompressed-content "
                           "and page limits per document): upload an excerpt or a .txt version") from None
    except Exception as err:  # pypdf raises many types (PdfReadError, KeyError...) on bad files
        raise MemstepError(f"Cannot read the PDF {filename}: it may be corrupt ({err}). "
                           "Re-export it or convert it to .txt.") from None
    finally:
        pypdf_log.setLevel(level)
    text = "\n\n".join(reader.pages)
    if not text.strip():
        raise MemstepError(f"{filename} has no extractable text; it may be a scanned image. "
                           "Run OCR on it or upload a .txt version.")
    return text


class _Reader:
    """Reads pages, charging the budget for each operator extraction visits and each draw."""

    def __init__(self, filename: str, limits: ReadLimits, budget: WorkBudget):
        self.filename, self.limits, self.budget = filename, limits, budget
        self.pages: list[str] = []
        self.content = self.draws = 0
        self.form_bytes: dict = {}  # a form (by its object number) -> its decompressed bytes
        self._since_check = 0

    def read(self, page, number: int) -> None:
        import pypdf

        stream = page.get_contents()
        size = len(stream.get_data()) if stream is not None else 0
        if size > self.limits.max_page_content_bytes:
            raise MemstepError(f"{self.filename}: page {number}'s content decompresses to {size / 1e6:.1f} MB, over "
                               f"the {self.limits.max_page_content_bytes / 1e6:.1f} MB a page may hold (the "
                               "decompressed-content limit): convert it to .txt")
        self._add_content(size)
        self.names = self._forms(page)
        # the parser of each stream stops where the budget would (pypdf counts its own tokens)
        with pypdf.apply_configuration(stream_parsing_work_maximum_count=max(1, self.budget.left())):
            text = page.extract_text(visitor_operand_before=self._visit) or ""
        self.pages.append(text)
        self.budget.add_text(len(text) + 2 if text else 0)
        self.budget.check_cpu()

    def _add_content(self, size: int) -> None:
        self.content += size
        if self.content > self.limits.max_content_bytes:
            raise MemstepError(f"{self.filename}: its content decompresses to over "
                               f"{self.limits.max_content_bytes / 1e6:.1f} MB, pages and form draws together (the "
                               "decompressed-content limit per document): upload an excerpt or a .txt version")

    def _visit(self, operator, operands, cm, tm) -> None:
        steps = 1 + len(operands)
        if operator == b"Do" and operands:
            self.draws += 1
            if self.draws > self.limits.max_draws:
                raise OverBudget(f"{self.filename}: over {self.limits.max_draws:,} XObject draws before its text ends "
                                 "(the draw limit per document): upload an excerpt or a .txt version")
            size = self.names.get(str(operands[0]), 0)
            self._add_content(size)
            steps += DRAW_STEPS + size // BYTES_PER_STEP
        elif operator == b"TJ" and operands and isinstance(operands[0], list):
            steps += len(operands[0])
        self.budget.spend(steps)
        self._since_check += steps
        if self._since_check > CPU_CHECK_STEPS:
            self._since_check = 0
            self.budget.check_cpu()

    def _forms(self, page) -> dict[str, int]:
        """Name -> decompressed bytes of the form XObjects reachable from ``page`` (the largest of the
        forms that name, at any depth: the visitor sees a draw's name, not which resources hold it)."""
        names: dict[str, int] = {}
        pending, seen = [page.get("/Resources")], set()
        while pending:
            resources = pending.pop()
            resources = resources.get_object() if resources is not None else None
            xobjects = resources.get("/XObject") if hasattr(resources, "get") else None
            xobjects = xobjects.get_object() if xobjects is not None else None
            if not hasattr(xobjects, "items"):
                continue
            for name, ref in xobjects.items():
                key = (ref.idnum, ref.generation) if hasattr(ref, "idnum") else id(ref)
                self.budget.spend(1)
                if key in seen:
                    names[name] = max(names.get(name, 0), self.form_bytes.get(key, 0))
                    continue
                seen.add(key)
                form = ref.get_object()
                if not hasattr(form, "get") or form.get("/Subtype") != "/Form":
                    continue
                if key not in self.form_bytes:
                    self.form_bytes[key] = len(form.get_data())
                    if self.form_bytes[key] > self.limits.max_page_content_bytes:
                        raise MemstepError(f"{self.filename}: a form's content decompresses to "
                                           f"{self.form_bytes[key] / 1e6:.1f} MB, over the "
                                           f"{self.limits.max_page_content_bytes / 1e6:.1f} MB a page may hold (the "
                                           "decompressed-content limit): convert it to .txt")
                names[name] = max(names.get(name, 0), self.form_bytes[key])
                pending.append(form.get("/Resources"))
        return names
