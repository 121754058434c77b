"""The command line: `memstep schedule`, `memstep run`, bad input (exit 2, one line on stderr)
and `python -m memstep`. Mostly in-process through memstep.cli.main; a few subprocesses check
the console script and the module entry point for real."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ASSETS, ROOT
from test_models import tiny_lm_folder  # noqa: F401  (fixture)

from memstep.cli import main

EXAMPLE = str(ASSETS / "pride_and_prejudice_ch1-12.txt")
STEP_KEYS = {"step", "chunk_start", "chunk_size", "memory_before", "memory_budget", "memory_after", "seconds",
             "bytes_measured", "bytes_modeled"}
RUN_KEYS = {"model", "tokens", "steps", "kept_fraction", "answer", "continuation_nll", "seconds",
            "peak_bytes_measured", "peak_bytes_modeled"}


def cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *words):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("memstep: error:") and not lines[0].startswith("memstep: error: memstep")
    for word in words:
        assert word in lines[0], (word, lines[0])


# ---- memstep schedule ----------------------------------------------------------------------
def test_schedule_json(capsys):
    code, out, _ = cli(capsys, "schedule", "--tokens", 1000, "--chunk", 300, "--memory", 200, "--schedule", "imdc")
    assert code == 0
    assert "step" in out.splitlines()[0] and len(out.splitlines()) == 6  # header, 4 steps, summary
    code, out, _ = cli(capsys, "schedule", "--tokens", 1000, "--chunk", 300, "--memory", 200, "--schedule", "imdc",
                       "--json")
    data = json.loads(out)
    assert code == 0
    assert {"chunk_sizes", "memory_sizes", "schedule", "growth", "tokens", "steps"} <= set(data)
    assert data["chunk_sizes"] == [250, 300, 250, 200] and data["memory_sizes"] == [50, 100, 150, 200]


def test_schedule_growth_and_full(capsys):
    code, out, _ = cli(capsys, "schedule", "--tokens", 2048, "--chunk", 512, "--memory", 512, "--schedule", "im",
                       "--growth", "square", "--json")
    assert code == 0 and json.loads(out)["memory_sizes"] == [128, 170, 298, 512]  # tests/test_schedules.py
    code, out, _ = cli(capsys, "schedule", "--tokens", 1000, "--chunk", 200, "--memory", 300, "--schedule", "imdc",
                       "--growth", "double-inverse", "--layers", 3, "--json")
    data = json.loads(out)
    assert code == 0 and data["layer_memory_sizes"][1] == [75, 210, 210] and data["chunk_sizes"][1] == 307
    code, out, _ = cli(capsys, "schedule", "--tokens", 700, "--schedule", "full", "--json")
    assert code == 0 and json.loads(out)["chunk_sizes"] == [700]


@pytest.mark.parametrize("argv,words", [
    (["--tokens", 100, "--chunk", 0], ["chunk size must be at least 1"]),
    (["--tokens", 0], ["at least 1"]),
    (["--tokens", 100, "--schedule", "xl"], ["invalid choice: 'xl'"]),
    (["--tokens", 100, "--growth", "cubic"], ["invalid choice: 'cubic'"]),
    (["--tokens", "many"], ["invalid int value"]),
    (["--chunk", 10], ["--tokens"]),
    (["--tokens", 6000, "--chunk", 500, "--memory", 1500, "--growth", "square"], ["IMDC", "at most"]),
    (["--tokens", 1000, "--growth", "square-sqrt"], ["layer-wise", "number of layers"]),
    (["--tokens", 1000, "--schedule", "fm", "--growth", "double-inverse", "--layers", 30], ["layer-wise", "FM"]),
])
def test_schedule_bad_input(capsys, argv, words):
    assert_one_line_error(*cli(capsys, "schedule", *argv)[::2], *words)


def test_no_command_and_unknown_command(capsys):
    assert_one_line_error(*cli(capsys)[::2], "required")
    assert_one_line_error(*cli(capsys, "fly")[::2], "invalid choice")


def test_usage_errors_name_the_subcommand_once(capsys):
    """argparse's messages say "memstep" once, and which subcommand refused the value."""
    code, _, err = cli(capsys, "run", EXAMPLE, "--budget", 128)
    assert code == 2 and err.strip() == "memstep: error: unrecognized arguments: --budget 128"
    code, _, err = cli(capsys, "schedule", "--tokens", "many")
    assert code == 2 and err.strip() == "memstep: error: schedule: argument --tokens: invalid int value: 'many'"


# ---- memstep run: bad input fails before any model is loaded --------------------------------
@pytest.fixture
def bad_files(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "blank.md").write_text("  \n\n ")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 8)
    (tmp_path / "notes.docx").write_text("text in a format memstep does not read")
    return tmp_path


@pytest.mark.parametrize("name,words", [
    ("empty.txt", ["empty.txt"]),
    ("blank.md", ["no text"]),
    ("binary.txt", ["binary.txt"]),
    ("missing.txt", ["not found"]),
    ("notes.docx", [".docx"]),
])
def test_run_bad_documents(capsys, bad_files, name, words):
    assert_one_line_error(*cli(capsys, "run", bad_files / name)[::2], *words)


def test_run_directory_instead_of_file(capsys, tmp_path):
    assert_one_line_error(*cli(capsys, "run", tmp_path)[::2], "not a file")


@pytest.mark.parametrize("argv,words", [
    (["--chunk", 0], ["--chunk", "at least 1"]),
    (["--chunk", -5], ["--chunk"]),
    (["--memory", 2], ["--memory 2", "--sinks 4"]),
    (["--memory", 8, "--sinks", 16], ["--memory 8", "--sinks 16"]),
    (["--scorer", "h2o"], ["unknown scorer 'h2o'", "chunk-attention"]),
    (["--schedule", "dynamic"], ["invalid choice: 'dynamic'"]),
    (["--growth", "cubic"], ["invalid choice: 'cubic'"]),
    (["--max-tokens", 0], ["--max-tokens"]),
    (["--device", "tpu"], ["unknown device 'tpu'"]),
    (["--dtype", "int4"], ["unknown dtype 'int4'"]),
    (["--model", "/no/such/model"], ["model folder not found"]),
    (["--rope", "absolute"], ["invalid choice: 'absolute'"]),
    (["--preset", "paper"], ["invalid choice: 'paper'"]),
    (["--scorer", "conv", "--kernel", 4], ["conv kernel", "odd"]),
])
def test_run_bad_parameters(capsys, argv, words):
    assert_one_line_error(*cli(capsys, "run", EXAMPLE, *argv)[::2], *words)


# ---- memstep run on a tiny local model ------------------------------------------------------
def test_run_json_output_and_file(capsys, tiny_lm_folder, tmp_path):
    output = tmp_path / "run.json"
    code, out, err = cli(capsys, "run", EXAMPLE, "--model", tiny_lm_folder, "--max-tokens", 400, "--schedule", "imdc",
                         "--chunk", 128, "--memory", 64, "--question", "Who is Mr. Bingley?", "--max-new-tokens", 4,
                         "--continuation-tokens", 16, "--json", "--output", output)
    assert code == 0
    data = json.loads(out)
    assert RUN_KEYS <= set(data)
    assert data == json.loads(output.read_text())
    assert data["model"] == str(tiny_lm_folder)
    assert data["tokens"] == data["prefix_tokens"] + 400 - 16
    assert len(data["kept_fraction"]) == data["tokens"]
    assert data["question"] == "Who is Mr. Bingley?" and isinstance(data["answer"], str)
    assert data["continuation_nll"] > 0 and data["peak_bytes_measured"] is None
    assert data["peak_bytes_modeled"] == max(s["bytes_modeled"] for s in data["steps"])
    for step in data["steps"]:
        assert STEP_KEYS <= set(step)
    assert [s["chunk_size"] for s in data["steps"]] == data["schedule"]["chunk_sizes"]
    assert data["steps"][-1]["memory_after"] == 64 + 4
    assert "Document truncated" in err  # the --max-tokens notice goes to stderr


def test_run_table_and_positions(capsys, tiny_lm_folder, tmp_path):
    output = tmp_path / "run.json"
    code, out, _ = cli(capsys, "run", EXAMPLE, "--model", tiny_lm_folder, "--max-tokens", 300, "--schedule", "fm",
                       "--chunk", 100, "--memory", 50, "--scorer", "recency", "--positions", "--output", output,
                       "--quiet")
    assert code == 0
    lines = out.splitlines()
    assert "schedule fm, scorer recency, compact RoPE positions" in lines[0]
    assert lines[1].split()[:3] == ["step", "start", "chunk"]
    assert lines[-1].startswith("total ") and "no device counter on CPU" in lines[-1]
    data = json.loads(output.read_text())
    kept = data["steps"][-1]["kept_positions"]  # (layers, kv_heads, entries)
    tokens = data["tokens"]
    assert kept[0][0] == [0, 1, 2, 3] + list(range(tokens - 50, tokens))


def test_run_preset_reference_and_rope(capsys, tiny_lm_folder):
    base = ["run", EXAMPLE, "--model", tiny_lm_folder, "--max-tokens", 300, "--schedule", "imdc", "--chunk", 100,
            "--memory", 50, "--json", "--quiet"]
    code, out, _ = cli(capsys, *base, "--preset", "reference")
    data = json.loads(out)
    assert code == 0 and (data["scorer"], data["rope"], data["sinks"]) == ("conv", "compact", 4)
    # compact: every chunk starts right after the memory, never beyond sinks + M + c
    assert [s["first_position"] for s in data["steps"]] == [s["memory_before"] for s in data["steps"]]
    code, out, _ = cli(capsys, *base, "--preset", "reference", "--rope", "document", "--sinks", 2)
    data = json.loads(out)  # explicit options win over the preset
    assert (data["scorer"], data["rope"], data["sinks"]) == ("conv", "document", 2)
    assert [s["first_position"] for s in data["steps"]] == [s["chunk_start"] for s in data["steps"]]
    code, out, _ = cli(capsys, *base)
    data = json.loads(out)  # the defaults: the paper's chunk-attention score, compact positions
    assert (data["scorer"], data["rope"], data["sinks"]) == ("chunk-attention", "compact", 4)


def test_run_from_stdin(capsys, tiny_lm_folder, monkeypatch):
    text = Path(EXAMPLE).read_text()[:3000]
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    code, out, _ = cli(capsys, "run", "-", "--model", tiny_lm_folder, "--schedule", "full", "--json")
    assert code == 0
    data = json.loads(out)
    assert len(data["steps"]) == 1 and data["steps"][0]["chunk_size"] == data["tokens"]


def test_run_chunk_larger_than_document(capsys, tiny_lm_folder):
    code, _, err = cli(capsys, "run", EXAMPLE, "--model", tiny_lm_folder, "--max-tokens", 50, "--chunk", 512)
    assert code == 2
    lines = err.strip().splitlines()
    assert lines[0].startswith("Document truncated")  # the --max-tokens notice, then the error
    assert len(lines) == 2 and lines[1].startswith("memstep: error: chunk size 512 is larger than the document")


# ---- real processes --------------------------------------------------------------------------
def run_process(*argv, stdin=None):
    return subprocess.run([str(a) for a in argv], capture_output=True, text=True, input=stdin, cwd=ROOT,
                          timeout=120)


def test_python_dash_m_memstep():
    proc = run_process(sys.executable, "-m", "memstep", "schedule", "--tokens", 4096, "--chunk", 512, "--memory",
                       512, "--schedule", "fm", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["chunk_sizes"] == [512] * 8 and data["memory_sizes"] == [512] * 8


def test_console_script_bad_input_exits_2_with_one_line():
    script = Path(sys.executable).with_name("memstep")
    if not script.exists():
        pytest.skip("console script not installed")
    proc = run_process(script, "run", "no-such-file.txt")
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == ["memstep: error: File not found: no-such-file.txt. "
                                                "Check the path and try again."]


def test_process_run_streams_progress_to_stderr(tiny_lm_folder):
    text = Path(EXAMPLE).read_text()[:4000]
    proc = run_process(sys.executable, "-m", "memstep", "run", "-", "--model", tiny_lm_folder, "--schedule", "fm",
                       "--chunk", 200, "--memory", 100, "--json", stdin=text)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)  # stdout is nothing but the JSON
    assert len(data["steps"]) >= 3
    assert "fm prefill" in proc.stderr and f"{len(data['steps'])}/{len(data['steps'])}" in proc.stderr


def test_run_help_names_every_scorer(capsys):
    from memstep.scorers import SCORERS

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = capsys.readouterr().out
    assert all(name in help_text for name in SCORERS)


def test_schedule_command_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys; from memstep.cli import main; main(['schedule', '--tokens', '100', '--chunk', '10', "
            "'--memory', '10']); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
