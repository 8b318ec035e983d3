#!/usr/bin/env bash
# GPU check for TFLite files: parity and bench on LiteRT's GPU accelerator (CompiledModel, WebGPU over
# Vulkan) at both GPU precisions, one JSON report (report.json) with each step's exit code.
# fp16 is the accelerator's default arithmetic and is judged by the fp16 tolerance; fp32
# (enforce_f32) by the file's own. Ops the GPU lacks run on the CPU (--cpu-fallback) and each
# step's runtime string lists them. Needs pe-export and ai-edge-litert (no TensorFlow), fixed-shape
# files (`pe-export tflite --batch N --seq-len L`) and a golden bundle made with the same shape.
#
#   targets/litert-gpu/check.sh GOLDEN_DIR OUT_DIR MODEL.tflite [MODEL.tflite...]
#   GPU_PRECISIONS="fp32" BENCH_RUNS=50 targets/litert-gpu/check.sh golden/ out/ encoder.tflite
#
# Exit code: 0 when every step passed, else the first failing step's (1 parity, 2 bad input,
# 3 no GPU / the GPU cannot run the file).
set -uo pipefail
usage="usage: check.sh GOLDEN_DIR OUT_DIR MODEL.tflite [MODEL.tflite...]"
golden=${1:?$usage}
out=${2:?$usage}
shift 2
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
precisions=${GPU_PRECISIONS:-fp16 fp32}
runs=${BENCH_RUNS:-200}
mkdir -p "$out" || exit 2
: > "$out/steps.tsv"
status=0
. "$(dirname "$0")/../steps.sh"  # step, finish_report
for model in "$@"; do
  name=$(basename "$model" .tflite)
  for precision in $precisions; do
    step "parity-$name-$precision" pe-export parity "$model" "$golden" --runtime litert-gpu --cpu-fallback \
      --gpu-precision "$precision" --json "$out/parity-$name-$precision.json" --overwrite
    step "bench-$name-$precision" pe-export bench "$model" --runtime litert-gpu --cpu-fallback \
      --gpu-precision "$precision" --runs "$runs" --warmup 20 --json "$out/bench-$name-$precision.json" --overwrite
  done
done
finish_report
exit $status
