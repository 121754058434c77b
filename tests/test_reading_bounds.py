"""Reading a document is bounded by work and stoppable (issues 31, 61): the PDF and HTML bombs are
refused with one line naming the limit, the work a read may do follows the text it yields,
extraction stops at the text a run can use, the reading process ends at its CPU limit or at a
Stop, and an upload whose visitor left frees its slot."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import psutil
import pytest

from memstep import reading
from memstep.cancel import CancelFlag, cancel_scope
from memstep.documents import ReadLimits, chars_for_tokens, read_document_bytes
from memstep.reading import read_document
from memstep.errors import MemstepError
from tests.hostile_documents import (angles_html, attributes_html, empty_text_pdf, entities_html, nested_forms_pdf,
                                     nested_html, paragraphs_html, shared_stream_pdf, slow_pdf, text_pdf)

NO_WORK_LIMIT = dict(work_base=10**12)  # a slow document under the work limit: its CPU is what stops it


def reading_children() -> list[psutil.Process]:
    return [p for p in psutil.Process().children(recursive=True)
            if "memstep.reading" in " ".join(p.cmdline() if p.is_running() else [])]


def one_line(err: MemstepError, *words: str) -> None:
    message = str(err)
    assert "\n" not in message, message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.parametrize("pages", [1, 4])
def test_shared_stream_pdf_is_refused_by_its_decompressed_content(pages):
    data = shared_stream_pdf(pages)
    assert len(data) < 16_000
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "bomb.pdf")
    one_line(err.value, "bomb.pdf", "page 1", "4.6 MB", "decompressed-content limit")


def test_pdf_content_is_counted_over_all_pages():
    data = shared_stream_pdf(4, content_bytes=30_000)  # each page under the page limit, not their sum
    limits = ReadLimits(max_page_content_bytes=40_000, max_content_bytes=100_000, max_chars=None)
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "shared.pdf", limits=limits)
    one_line(err.value, "over 0.1 MB", "decompressed-content limit")


@pytest.mark.parametrize("pages", [3, 4])
def test_a_pdf_of_exactly_the_page_limit_is_read(pages):
    data = text_pdf([f"Line {i}." for i in range(pages)], per_page=1)
    limits = ReadLimits(max_pages=3)
    if pages == 3:
        assert read_document_bytes(data, "three.pdf", limits=limits).split() == ["Line", "0.", "Line", "1.", "Line", "2."]
        return
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "four.pdf", limits=limits)
    one_line(err.value, "over 3 pages", "page limit")


def test_pdf_reading_stops_at_the_text_a_run_can_use():
    data = shared_stream_pdf(50, content_bytes=3_300)  # 100 'x' a page
    text = read_document_bytes(data, "long.pdf", limits=ReadLimits(max_chars=250))
    assert 250 <= len(text.replace("\n", "")) < 500  # three pages read of fifty


def test_empty_text_objects_stop_at_the_work_any_document_may_do():
    """200 pages of ``BT () Tj ET``: operators that yield nothing. The read stops at the work any
    document may do (its base), not at a CPU or page limit; with a larger base it reads on, to the
    end of its pages (and then has no text)."""
    data = empty_text_pdf()
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "empty.pdf")
    one_line(err.value, "empty.pdf", "over 200,000 parsing steps", "content-stream operators", "0 characters",
             "work limit per document")
    with pytest.raises(MemstepError) as err:
        read_document_bytes(empty_text_pdf(pages=3, content_bytes=100_000), "short.pdf",
                            limits=ReadLimits(**NO_WORK_LIMIT))
    one_line(err.value, "short.pdf has no extractable text")


def test_the_work_a_pdf_may_do_grows_with_its_text():
    """Two PDFs of the same operators, one showing a letter where the other shows nothing: the one
    that yields text reads to its end under a base that stops the other."""
    lines = [f"Line {i} of the text." for i in range(2_000)]
    limits = ReadLimits(work_base=2_000)
    assert len(read_document_bytes(text_pdf(lines), "text.pdf", limits=limits)) > 8_000
    with pytest.raises(MemstepError) as err:
        read_document_bytes(text_pdf([""] * 2_000), "blank.pdf", limits=limits)
    one_line(err.value, "over 2,000 parsing steps", "work limit")


def test_nested_forms_are_charged_every_draw():
    """A form drawn 100 times that draws a form 100 times: every draw is charged its form's content
    (pypdf alone parses for about a minute), and past the draws a document may make it is refused."""
    data = nested_forms_pdf()
    assert len(data) < 2_000
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "forms.pdf")
    one_line(err.value, "forms.pdf", "XObject draws and their bytes", "work limit")
    with pytest.raises(MemstepError) as err:
        read_document_bytes(nested_forms_pdf(leaf_objects=0), "draws.pdf",
                            limits=ReadLimits(max_draws=500, **NO_WORK_LIMIT))
    one_line(err.value, "draws.pdf", "over 500 XObject draws", "draw limit")


def test_a_form_too_big_to_parse_is_charged_at_its_draw():
    """A form of 280,000 tokens drawn 50 times: pypdf's parser stops each draw at the budget and pypdf
    swallows that error per form, so no operator of it is ever visited; the draw itself is charged
    the form's bytes, and the first one is over the work limit."""
    data = nested_forms_pdf(levels=1, fanout=50, leaf_objects=40_000)
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "big-form.pdf")
    one_line(err.value, "big-form.pdf", "XObject draws and their bytes", "0 characters", "work limit")


def test_a_form_drawn_is_counted_with_the_content():
    data = nested_forms_pdf(levels=1, fanout=30, leaf_objects=1_000)  # 30 draws of a 22 KB form
    with pytest.raises(MemstepError) as err:
        read_document_bytes(data, "drawn.pdf", limits=ReadLimits(max_content_bytes=300_000, **NO_WORK_LIMIT))
    one_line(err.value, "over 0.3 MB, pages and form draws together", "decompressed-content limit")


@pytest.mark.parametrize("make, words", [
    (nested_html, ["parsing steps", "HTML tags, attributes, entities", "work limit"]),
    (angles_html, ["parsing steps", "0 characters", "work limit"]),
    (attributes_html, ["a tag or comment is still open", "tag-length limit"]),
], ids=["1 MB of nested <b>", "5 MB of <", "one tag, 500,000 attributes"])
def test_html_bombs_are_refused_naming_the_limit(make, words):
    with pytest.raises(MemstepError) as err:
        read_document_bytes(make(), "bomb.html")
    one_line(err.value, "bomb.html", *words)


def test_the_work_an_html_page_may_do_grows_with_its_text():
    """Tags that show a letter each read on (1 MB of <p>x</p>: 393,214 characters); the same tags
    showing nothing stop at the base; attributes count."""
    assert read_document_bytes(paragraphs_html(), "text.html").startswith("x\n\nx")
    with pytest.raises(MemstepError) as err:
        read_document_bytes(b"<b></b>" * 120_000, "empty.html")
    one_line(err.value, "over 200,000 parsing steps", "work limit")
    attributes = b"<p a=1 b=2 c=3 d=4>x</p>" * 2_000  # 4 attributes a tag: 20,000 steps for 6,000 characters
    assert read_document_bytes(attributes, "ok.html", limits=ReadLimits(work_base=20_000)).startswith("x")
    with pytest.raises(MemstepError):
        read_document_bytes(attributes.replace(b">x<", b"><"), "attrs.html", limits=ReadLimits(work_base=20_000))
    assert read_document_bytes(entities_html(), "amp.html") == "&" * 1_000_000  # each entity yields a character


def test_the_cli_and_the_app_refuse_a_page_at_the_same_place():
    """One set of limits: the app's reads differ from the command line's only in the text a run can
    use, so a document is refused at the same point by both."""
    import dataclasses

    from ui.documents import upload_limits

    app, cli = upload_limits(), ReadLimits(max_chars=chars_for_tokens(None))
    assert dataclasses.replace(app, max_chars=None) == cli
    for make, name in ((nested_html, "nested.html"), (empty_text_pdf, "empty.pdf")):
        messages = []
        for limits in (app, cli):
            with pytest.raises(MemstepError) as err:
                read_document_bytes(make(), name, limits=limits)
            messages.append(str(err.value))
        assert messages[0] == messages[1]


def test_html_reading_stops_at_the_text_a_run_can_use():
    text = read_document_bytes(paragraphs_html(), "long.html", limits=ReadLimits(max_chars=chars_for_tokens(100)))
    assert text.startswith("x\n\nx") and len(text) < chars_for_tokens(100) + 70_000  # one feed piece past it


def test_html_keeps_the_pages_text_layout():
    html = ("<html><head><title>T</title><style>p {}</style></head><body><div>a <b>bold</b>\n  word</div>"
            "<p>one<br>two</p><pre>keep   these\n  spaces</pre><script>hidden()</script><p>last &amp; end</p>")
    text = "T\n\na bold word\none\ntwo\n\nkeep   these\nspaces\n\nlast & end"  # (each line is stripped)
    assert read_document_bytes(html.encode(), "page.html") == text


def test_text_is_decoded_only_as_far_as_the_run_can_use():
    data = ("Straße " * 200_000).encode("utf-8")  # 1.6 MB; a cut may fall inside the two-byte ß
    for chars in (1000, 1001, 1003):
        text = read_document_bytes(data, "long.txt", limits=ReadLimits(max_chars=chars))
        assert text.startswith("Straße Straße") and len(text) <= 4 * chars


@pytest.mark.parametrize("encoding", ["utf-8", "utf-8-sig", "utf-16", "utf-16-be", "utf-32", "utf-32-be"])
@pytest.mark.parametrize("char", ["a", "ß", "€", "😀"], ids=["1 byte", "2 bytes", "3 bytes", "4 bytes"])
def test_multibyte_text_yields_at_least_max_chars(encoding, char):
    """The prefix decoded for ``max_chars`` characters holds at least that many, whatever the width
    of each (and a byte order mark ahead of them); cut at a character's bounds."""
    text = char * 5_000
    data = text.encode(encoding)
    if encoding in ("utf-16-be", "utf-32-be"):  # with their byte order marks, as editors save them
        data = {"utf-16-be": "\ufeff", "utf-32-be": "\ufeff"}[encoding].encode(encoding) + data
    for chars in (1, 2, 3, 1000, 1001):
        got = read_document_bytes(data, "wide.txt", limits=ReadLimits(max_chars=chars))
        assert len(got) >= chars and set(got) == {char}, (encoding, chars, len(got))


@pytest.mark.parametrize("encoding", ["utf-32", "utf-32-le", "utf-32-be"])
def test_utf32_with_a_byte_order_mark_is_text(encoding):
    text = "Straße und Brücke, 😀 and a line\nmore."
    data = (("\ufeff" if encoding != "utf-32" else "") + text).encode(encoding)
    assert data[:4] in (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")
    assert read_document_bytes(data, "wide.txt") == text


def test_the_reading_process_ends_at_its_cpu_limit():
    """A document under the work limit whose text does not pay for its CPU: the reading process's
    watch stops it at the CPU its text allows, naming that limit."""
    data = slow_pdf()
    with pytest.raises(MemstepError) as err:
        reading.read_isolated(data, "slow.pdf", limits=ReadLimits(cpu_seconds=0.5, cpu_per_char=0, **NO_WORK_LIMIT))
    one_line(err.value, "slow.pdf", "CPU seconds", "CPU limit per document")
    assert not reading_children()  # the limit ended the child, and it is gone


def test_a_read_past_the_wall_clock_names_that_limit(monkeypatch):
    monkeypatch.setattr(reading, "WALL_FACTOR", 0)
    monkeypatch.setattr(reading, "WALL_EXTRA_SECONDS", 0.3)
    with pytest.raises(MemstepError) as err:
        reading.read_isolated(slow_pdf(), "slow.pdf", limits=ReadLimits(cpu_seconds=60, **NO_WORK_LIMIT))
    one_line(err.value, "slow.pdf", "wall-clock time", "time limit per document")
    assert "server is busy" not in str(err.value) and not reading_children()


@pytest.mark.parametrize("how", ["should_stop", "cancel flag"])
def test_a_stop_ends_the_reading_process(how):
    data = slow_pdf()
    flag, asked = CancelFlag(), []

    def should_stop():
        asked.append(1)
        return how == "should_stop" and len(asked) > 3

    threading.Timer(0.4, flag.cancel).start()
    with cancel_scope(flag if how == "cancel flag" else CancelFlag()):
        with pytest.raises(MemstepError) as err:
            reading.read_isolated(data, "slow.pdf", limits=ReadLimits(cpu_seconds=60, **NO_WORK_LIMIT),
                                  should_stop=should_stop)
    one_line(err.value, "reading slow.pdf was stopped")
    assert not reading_children()


def test_read_document_reads_in_a_child_and_says_what_stopped_it(tmp_path):
    path = tmp_path / "bomb.pdf"
    path.write_bytes(shared_stream_pdf(4))
    with pytest.raises(MemstepError) as err:
        read_document(path)
    one_line(err.value, "decompressed-content limit")
    path = tmp_path / "fine.html"
    path.write_text("<p>Hello</p><p>world</p>")
    assert read_document(path) == "Hello\n\nworld" and not reading_children()


# ---- the app: an upload whose visitor left ----------------------------------------------------------

def test_an_upload_whose_visitor_left_frees_its_slot(tmp_path, monkeypatch):
    from gradio.context import LocalContext

    from ui import documents, uploads

    event = SimpleNamespace(_id="event-1", alive=True)
    blocks = SimpleNamespace(_queue=SimpleNamespace(active_jobs=[[event]]))
    path = tmp_path / "slow.pdf"
    path.write_bytes(slow_pdf())
    monkeypatch.setattr(documents, "upload_limits", lambda: ReadLimits(cpu_seconds=60, **NO_WORK_LIMIT))
    outcome = []

    def upload():
        LocalContext.blocks.set(blocks)  # what Gradio sets for the event this thread serves
        LocalContext.event_id.set("event-1")
        try:
            documents.read_upload(path)
        except MemstepError as err:
            outcome.append(str(err))

    free = uploads._slots._value
    worker = threading.Thread(target=upload)
    worker.start()
    while not reading_children():
        time.sleep(0.05)
    assert uploads._slots._value == free - 1
    event.alive = False  # the page closed: Gradio marks its event
    worker.join(10)
    assert outcome == ["reading slow.pdf was stopped"]
    assert not reading_children() and uploads._slots._value == free  # the worker gone, the slot free


def test_the_watchdog_interrupts_a_read_that_makes_no_check_of_its_own():
    """A parser's own loop (a font's tables on every page, say) runs between the budget's checks: the
    reading process's watchdog interrupts it once the CPU is over what the text allows."""
    from memstep.read_budget import Watchdog, WorkBudget

    budget = WorkBudget("loop.pdf", ReadLimits(cpu_seconds=0.2, cpu_per_char=0), "steps")
    began = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        with Watchdog(interval=0.01) as watchdog:
            watchdog.budget = budget
            while time.monotonic() - began < 20:  # no check of its own (bounded, should the watch fail)
                sum(range(1000))
    assert "CPU limit per document" in watchdog.fired
