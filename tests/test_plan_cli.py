"""`memstep plan`: JSON and text output, presets, and bad input ending in exit code 2."""

from __future__ import annotations

import json

import pytest

from memstep.cli import main


def run(capsys, *argv):
    code = main(["plan", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_has_steps_peak_seconds_fit_and_comparisons(capsys):
    code, out, err = run(capsys, "--model", "llama-3.1-8b", "--gpu", "a100-80gb", "--tokens", "65536",
                         "--chunk", "2048", "--memory", "2048", "--schedule", "imdc", "--growth", "sqrt",
                         "--attention", "eager", "--dtype", "fp16", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    assert {"steps", "peak_bytes", "seconds", "fits", "vs_fm", "vs_full", "longest_context"} <= set(data)
    assert len(data["steps"]) == 32 and data["schedule"]["growth"] == "sqrt"
    for step in data["steps"]:
        assert {"kv_bytes", "peak_bytes", "flops", "seconds"} <= set(step)
        assert step["peak_bytes"] > step["kv_bytes"] > 0 and step["flops"] > 0 and step["seconds"] > 0
    assert data["fits"] is True and data["dtype"] == "fp16" and data["attention"] == "eager"
    assert data["vs_full"]["peak_bytes"] < 1 and data["longest_context"]["unlimited"] is True


def test_text_output_summarises_long_schedules(capsys):
    code, out, _ = run(capsys, "--model", "qwen2.5-7b", "--gpu", "l4", "--tokens", "200000", "--schedule", "fm")
    assert code == 0
    assert "Qwen2.5-7B (bf16) on L4: FM" in out and "196 steps" in out
    assert "more steps; --all-steps prints them" in out
    assert "fits in" in out and "vs FM: 1.000x peak memory" in out and "longest context that fits" in out


def test_full_prefill_that_does_not_fit_says_so_and_warns(capsys):
    code, out, err = run(capsys, "--model", "llama-3.1-8b", "--gpu", "t4", "--dtype", "fp16", "--tokens",
                         "200000", "--schedule", "full", "--output", "/dev/null")
    assert code == 0
    assert "DOES NOT FIT" in out and "nothing fits" in out
    assert "200000 tokens go beyond Llama-3.1-8B's 131072 trained positions" in err and "does not fit" in err


def test_config_json_custom_gpu_and_keep_maps(tmp_path, capsys):
    config = {"hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 22,
              "num_attention_heads": 32, "num_key_value_heads": 4, "vocab_size": 32000,
              "max_position_embeddings": 2048}
    path = tmp_path / "tinyllama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(config))
    code, out, _ = run(capsys, "--model", str(path), "--gpu", "custom", "--tflops", "100", "--bandwidth", "900",
                       "--gpu-memory", "24", "--tokens", "8192", "--attention", "padded", "--keep-maps", "--json")
    assert code == 0
    data = json.loads(out)
    assert data["model"]["name"] == "tinyllama" and data["model"]["kv_bytes_per_token"] == 2 * 22 * 4 * 64 * 2
    assert data["gpu"]["memory_bytes"] == 24 << 30 and data["keep_maps"] and data["evict_per_layer"] is False
    # IMDC at c = M = 1024 with compact positions stays within the 2048 trained positions; document ones do not
    assert any("2048 trained positions, but with compact RoPE positions" in n for n in data["notices"])
    assert data["rope"] == "compact" and data["largest_position"] <= 2048
    code, out, _ = run(capsys, "--model", str(path), "--gpu", "a100", "--tokens", "8192", "--rope", "document",
                       "--json")
    assert any("document positions: 8192 tokens go beyond tinyllama's 2048" in n for n in json.loads(out)["notices"])


def test_output_file_and_list(tmp_path, capsys):
    target = tmp_path / "plan.json"
    code, out, _ = run(capsys, "--tokens", "4096", "--output", str(target))
    assert code == 0 and json.loads(target.read_text())["schedule"]["tokens"] == 4096
    code, out, _ = run(capsys, "--list")
    assert code == 0 and "llama-2-7b" in out and "512 KiB/token" in out and "h200-141gb" in out


@pytest.mark.parametrize("argv, message", [
    (["--tokens", "0"], "tokens must be"),
    (["--tokens", "-10"], "tokens must be"),
    (["--tokens", "1000", "--chunk", "0"], "chunk must be"),
    (["--tokens", "1000", "--memory", "-4"], "memory must be"),
    (["--tokens", "1000", "--model", "missing/config.json"], "model config not found"),
    (["--tokens", "1000", "--model", "gpt-9"], "unknown model"),
    (["--tokens", "1000", "--gpu", "v100"], "unknown GPU"),
    (["--tokens", "1000", "--gpu", "custom"], "custom GPU needs"),
    (["--tokens", "1000", "--tflops", "-1"], "positive"),
    (["--tokens", "1000", "--efficiency", "2"], "efficiency"),
    (["--tokens", "1000", "--keep-maps"], "--attention padded"),
    (["--tokens", "100000", "--memory", "4096"], "IMDC"),
    (["--chunk", "512"], "--tokens is required"),
    (["--tokens", "ten"], "invalid int value"),
    (["--tokens", "10", "--schedule", "custom"], "invalid choice"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and out == ""
    assert err.startswith("memstep: error:") and message in err and err.count("\n") == 1


def test_malformed_config_exits_2(tmp_path, capsys):
    path = tmp_path / "config.json"
    path.write_text('{"hidden_size": 4096,')
    code, _, err = run(capsys, "--model", str(path), "--tokens", "100")
    assert code == 2 and "not a valid config.json" in err and err.count("\n") == 1
