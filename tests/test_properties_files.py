"""Property tests of `memstep compress laco`, `memstep compress sparse` and of file names given to
any command: every generated call ends with exit 2 and one line on stderr, never a traceback, and
leaves the folder it ran in exactly as it was (nothing created, nothing removed). No model is
ever loaded: the loader is replaced by one that refuses, so a call whose every setting passes
ends at that refusal, also one line. The suite runs 25 examples of each; MEMSTEP_FULL_SCANS=1
(benchmarks/bench_tests.py --scans) 150."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

import pytest
from conftest import scan_size
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from memstep.cli import main
from memstep.errors import MemstepError

pytestmark = pytest.mark.scan  # sampled here; whole with MEMSTEP_FULL_SCANS=1

RUNS = settings(max_examples=scan_size(150, 25), deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])
NUMBERS = st.one_of(st.integers(-3, 3), st.integers(-10**6, 10**6), st.sampled_from([2**31, 10**30, -10**30]),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(["", "x", "1e9", "0x10", "nan",
                                                                                     "2:4", "-", "1,2"]))
# File names from the edges: empty, long, NUL, newlines, control characters, paths through files,
# '..', '~', other scripts and emoji, names of things that exist (the folder itself, a file in it).
NAMES = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
    st.sampled_from(["", ".", "..", "~", "/", "x" * 300, "x" * 5000, "a\nb", "nul\0x", "tab\tx", "\x1b[31mred",
                     "existing", "existing/keep", "afile", "afile/inside", "missing/out", "~/" + "y" * 300,
                     "/proc/self/mem", "/dev/null", "dir with spaces/out", "résumé.txt", "😀/out"]),
    st.builds(lambda a, b: f"{a}/{b}", st.sampled_from(["existing", "afile", "missing", "..", "/tmp"]),
              st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=20)),
)
LACO_OPTIONS = ["--C", "--L", "--H", "--I", "--T", "--sentences", "--calibration-tokens", "--perplexity-windows",
                "--passkey-cases", "--passkey-tokens", "--prefill-tokens", "--repeats", "--guard"]
SPARSE_OPTIONS = ["--sparsity", "--samples", "--seq-len", "--held-out-samples", "--lr", "--epochs", "--steps",
                  "--batch-size", "--self-texts", "--damp", "--block-columns", "--seed"]
SPARSE_CHOICES = {"--method": ["magnitude", "wanda", "sparsegpt", "x", ""],
                  "--reconstruct": ["none", "lr", "br", "br+gp", "br+gp+cr", "cr"],
                  "--calibration": ["text", "self", "both", "file.txt"], "--nm": ["2:4", "4:8", "3:2", "0:4", "x"],
                  "--optimizer": ["adam", "sgd", "adamw", "lbfgs"]}


def refuse_to_load(*args, **kwargs):
    raise MemstepError("no model is loaded in this test")


@pytest.fixture
def playground(tmp_path):
    """A folder with a non-empty subfolder, a file and a calibration file, as the cwd."""
    (tmp_path / "existing").mkdir()
    (tmp_path / "existing" / "keep").write_text("mine")
    (tmp_path / "afile").write_bytes(b"\x00\x01 not a folder")
    paragraph = "A calibration paragraph of plain prose, long enough to count. " * 4
    (tmp_path / "calib.txt").write_text((paragraph + "\n") * 8)
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 8)
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.is_dir(), p.read_bytes() if p.is_file() else None)
            for p in sorted(folder.rglob("*"))}


_TOKENIZERS: dict[str, object] = {}
_load_tokenizer = AutoTokenizer.from_pretrained


def tokenizer_once(*args, **kwargs):
    """The real tokenizer, read from disk once per test session instead of once per example."""
    key = repr((args, sorted(kwargs.items())))
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = _load_tokenizer(*args, **kwargs)
    return _TOKENIZERS[key]


def call(argv) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err), mock.patch("memstep.models.load_model", refuse_to_load), \
            mock.patch.object(AutoTokenizer, "from_pretrained", tokenizer_once), \
            mock.patch("sys.stdin", io.TextIOWrapper(io.BytesIO(b"stdin text"))):
        code = main([str(a) for a in argv])
    return code, err.getvalue()


def check(code, err, folder, before):
    lines = [line for line in err.strip().splitlines() if not line.startswith("memstep: warning:")]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("memstep: error:"), (code, err)
    assert len(lines[0]) <= 1100
    assert snapshot(folder) == before  # nothing created, nothing removed


def options(names, values):
    return st.lists(st.tuples(st.sampled_from(names), values), max_size=4).map(
        lambda pairs: [str(part) for pair in pairs for part in pair])


@RUNS
@given(args=options(LACO_OPTIONS, NUMBERS), output=st.one_of(st.none(), NAMES),
       calibration=st.one_of(st.none(), NAMES, st.sampled_from(["calib.txt", "binary.txt"])),
       force=st.booleans(), variant=st.sampled_from([None, "paper", "notebook", "x"]))
def test_compress_laco_property(playground, args, output, calibration, force, variant):
    before = snapshot(playground)
    argv = ["compress", "laco", *args]
    argv += ["--output", output] if output is not None else []
    argv += ["--calibration", calibration] if calibration is not None else []
    argv += ["--force"] if force else []
    argv += ["--variant", variant] if variant else []
    check(*call(argv), playground, before)


@RUNS
@given(args=options(SPARSE_OPTIONS, NUMBERS),
       choices=st.lists(st.sampled_from(sorted(SPARSE_CHOICES)).flatmap(
           lambda k: st.tuples(st.just(k), st.sampled_from(SPARSE_CHOICES[k]))), max_size=3),
       output=st.one_of(st.none(), NAMES), force=st.booleans())
def test_compress_sparse_property(playground, args, choices, output, force):
    before = snapshot(playground)
    argv = ["compress", "sparse", *args, *[part for pair in choices for part in pair]]
    argv += ["--output", output] if output is not None else []
    argv += ["--force"] if force else []
    check(*call(argv), playground, before)


@RUNS
@given(document=st.one_of(NAMES, st.sampled_from(["calib.txt", "binary.txt", "-"])),
       output=st.one_of(st.none(), NAMES), verb=st.sampled_from(["run", "eval-output"]))
def test_file_names_property(playground, document, output, verb):
    """Any document name for `memstep run`, any --output file for `run` and `eval`: one line."""
    before = snapshot(playground)
    if verb == "run":
        argv = ["run", document] + (["--output", output] if output is not None else [])
    else:
        argv = ["eval", "--lengths", "64", "--output", document]
    check(*call(argv), playground, before)
