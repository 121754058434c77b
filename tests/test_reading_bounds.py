"""Reading a document is bounded by work and stoppable (issue 31): the PDF and HTML bombs are
refused with one line naming the limit, extraction stops at the text a run can use, the reading
process ends at its CPU limit or at a Stop, and an upload whose visitor left frees its slot."""

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
from tests.hostile_documents import nested_html, paragraphs_html, shared_stream_pdf, slow_pdf


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


def test_pdf_pages_are_capped():
    with pytest.raises(MemstepError) as err:
        read_document_bytes(shared_stream_pdf(3, content_bytes=2_000), "many.pdf", limits=ReadLimits(max_pages=2))
    one_line(err.value, "over 2 pages", "page limit")


def test_pdf_reading_stops_at_the_text_a_run_can_use():
    data = shared_stream_pdf(50, content_bytes=3_300)  # 100 'x' a page
    text = read_document_bytes(data, "long.pdf", limits=ReadLimits(max_chars=250))
    assert 250 <= len(text.replace("\n", "")) < 500  # three pages read of fifty


@pytest.mark.parametrize("make", [paragraphs_html, nested_html], ids=["1 MB of <p>x</p>", "1 MB of nested <b>"])
def test_html_bombs_are_refused_by_their_tags(make):
    with pytest.raises(MemstepError) as err:
        read_document_bytes(make(), "bomb.html")
    one_line(err.value, "bomb.html", "100,000 HTML tags", "tag limit")


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


def test_the_reading_process_ends_at_its_cpu_limit():
    data = slow_pdf()  # under every cap: a minute of parsing
    with pytest.raises(MemstepError) as err:
        reading.read_isolated(data, "slow.pdf", limits=ReadLimits(cpu_seconds=1))
    one_line(err.value, "slow.pdf", "over 1 CPU seconds", "reading limit")
    assert not reading_children()  # the limit ended the child, and it is gone


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
            reading.read_isolated(data, "slow.pdf", limits=ReadLimits(cpu_seconds=60), should_stop=should_stop)
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

    from ui import documents

    event = SimpleNamespace(_id="event-1", alive=True)
    blocks = SimpleNamespace(_queue=SimpleNamespace(active_jobs=[[event]]))
    path = tmp_path / "slow.pdf"
    path.write_bytes(slow_pdf())
    monkeypatch.setattr(documents, "READ_CPU_SECONDS", 60)
    outcome = []

    def upload():
        LocalContext.blocks.set(blocks)  # what Gradio sets for the event this thread serves
        LocalContext.event_id.set("event-1")
        try:
            documents.read_upload(path)
        except MemstepError as err:
            outcome.append(str(err))

    free = documents._reading._value
    worker = threading.Thread(target=upload)
    worker.start()
    while not reading_children():
        time.sleep(0.05)
    assert documents._reading._value == free - 1
    event.alive = False  # the page closed: Gradio marks its event
    worker.join(10)
    assert outcome == ["reading slow.pdf was stopped"]
    assert not reading_children() and documents._reading._value == free  # the worker gone, the slot free
