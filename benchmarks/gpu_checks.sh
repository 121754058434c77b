#!/usr/bin/env bash
# The GPU measurements, in one short run on a CUDA machine that reaches no hub (the device machine):
# the models are built there with random weights (benchmarks/random_model.py: time and bytes follow
# the shapes), from the embedded model's tokenizer.
#   .device/wheels/   transformers at the project's pin (the machine's own python3 holds torch)
#   .device/smollm2/  the embedded model's config and tokenizer files
# STEPS picks what runs (default: all): cost (the question pools' time and bytes above the model),
# engine (bench_engine at 4k and 8k), paper (the paper's setting: Llama-2-7B, 32k tokens,
# chunk = memory = 1024, and the planner against it), profile (where the chunked prefill's time goes
# beside a plain forward, 8k tokens). Writes JSON to $OUT (default
# benchmarks/results/gpu); each file is rendered afterwards by its script's --from-json / --render.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-benchmarks/results/gpu}
STEPS=${STEPS:-cost engine paper profile}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .device/wheels ]; then
  python3 -m pip install -q --no-deps --target /tmp/pins .device/wheels/*.whl
  export PYTHONPATH=/tmp/pins:$PWD
fi
run() { "$@" || echo "FAILED ($?): $*"; }  # each measurement stands alone: one failing leaves the rest
step() { [[ " $STEPS " == *" $1 "* ]]; }
nvidia-smi -L
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
LLAMA=/tmp/llama-2-7b-random
step cost && run python3 benchmarks/random_model.py smollm2-135m --tokenizer .device/smollm2 --output /tmp/smollm2-135m-random --device cuda
run python3 benchmarks/random_model.py llama-2-7b --tokenizer .device/smollm2 --output $LLAMA --device cuda
POOLS="max:15,follow:15+fade:0.7@256/8+heads@256+lend:0.75+last<256"
POOLS="$POOLS,follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:6x20<256+last<256"
POOLS="$POOLS,follow:15+fade:0.7@256/8+heads@256+lend:0.75+spans:3xsentence<256+last<256"
if step cost; then  # the question-aware default's time and bytes above the model against the first question-aware FM
  run python3 benchmarks/span_cost.py --device cuda --dtype bfloat16 --model /tmp/smollm2-135m-random --budget 128 \
    --pools "$POOLS" --spans "" --repeat 5 --output "$OUT/span_cost_cuda_128.json"
  run python3 benchmarks/span_cost.py --device cuda --dtype bfloat16 --model $LLAMA --budget 512 \
    --pools "$POOLS" --spans "" --repeat 5 --output "$OUT/span_cost_cuda_512_llama.json"
fi
if step engine; then
  run python3 benchmarks/bench_engine.py --device cuda --dtype bfloat16 --model $LLAMA \
    --tokens 4096 8192 --sizes 512 1024 --padded-tokens 4096 --repeats 3 --output "$OUT/bench_engine_cuda.json"
fi
if step paper; then  # the whole novel: 32k tokens
  BOOK=assets/pride_and_prejudice.txt
  run python3 benchmarks/bench_engine.py --device cuda --dtype bfloat16 --model $LLAMA --document $BOOK \
    --tokens 32768 --sizes 1024 --schedules fm imdc --padded-tokens 32768 --repeats 3 --output "$OUT/bench_engine_cuda_32k.json"
  run python3 benchmarks/validate_planner.py --device cuda --dtype bfloat16 --model $LLAMA --document $BOOK \
    --tokens 32768 --chunk 1024 --memory 1024 --output "$OUT/validate_planner_cuda_32k.json"
fi
if step profile; then
  run python3 benchmarks/profile_engine.py --device cuda --dtype bfloat16 --model $LLAMA --tokens 8192 --chunk 1024 \
    --output "$OUT/profile_engine_cuda.json"
fi
