"""Write a model folder of a planner preset's shape with random weights, for the benchmarks on a
machine that cannot fetch the real weights (the device machine reaches no hub, and the embedded
model's package is larger than what travels there). A prefill's time and bytes follow the
shapes, not the weights' values; its answers mean nothing, so no quality figure comes from it.

    python benchmarks/random_model.py llama-2-7b --tokenizer ~/.cache/memstep/smollm2-135m-instruct-tf5.24.0 \\
        --device cuda --output /tmp/llama-2-7b-random

The vocabulary is the larger of the preset's and the tokenizer's (a token id must have a row);
the folder's RANDOM_WEIGHTS.json says which preset, vocabulary and dtype it holds.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def llama_config(preset: str, vocabulary: int, dtype: str):
    """A Llama config of ``preset``'s fields (the planner's catalogue); hybrid presets are refused:
    their sliding layers need their own architecture."""
    from transformers import LlamaConfig

    from memstep.errors import MemstepError
    from memstep.planner.catalogue import MODEL_PRESETS

    if preset not in MODEL_PRESETS:
        raise MemstepError(f"unknown preset '{preset}': choose from {', '.join(MODEL_PRESETS)}")
    fields = dict(MODEL_PRESETS[preset])
    if "sliding_window" in fields:
        raise MemstepError(f"'{preset}' has sliding-window layers: only plain Llama-shaped presets are built")
    fields["vocab_size"] = max(fields["vocab_size"], vocabulary)
    return LlamaConfig(**fields, dtype=dtype)


def main(argv=None) -> int:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from memstep.errors import MemstepError

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("preset", help="a model preset of the planner's catalogue, e.g. llama-2-7b")
    p.add_argument("--tokenizer", required=True, help="a folder holding the tokenizer to pair with it")
    p.add_argument("--output", required=True, type=Path)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--device", default="cpu", help="where the weights are drawn (cuda: seconds for 7B)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
        config = llama_config(args.preset, len(tokenizer), args.dtype)
    except (MemstepError, OSError) as err:
        print(f"random_model: error: {err}", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, args.dtype))
    model.save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    params = sum(t.numel() for t in model.parameters())
    (args.output / "RANDOM_WEIGHTS.json").write_text(json.dumps(
        {"preset": args.preset, "vocab_size": config.vocab_size, "dtype": args.dtype, "seed": args.seed,
         "parameters": params, "note": "random weights: for time and memory only"}, indent=1))
    print(f"wrote {args.output}: {args.preset} shape, {params / 1e9:.2f}B parameters, {args.dtype}, random weights")
    return 0


if __name__ == "__main__":
    sys.exit(main())
