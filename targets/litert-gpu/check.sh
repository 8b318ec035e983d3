#!/usr/bin/env bash
# GPU check for TFLite files: parity and bench on LiteRT's GPU accelerator (CompiledModel, WebGPU over
# Vulkan) at both GPU precisions, one JSON report (report.json) with each step's exit code.
# fp16 is the accelerator's default arithmetic and is judged by the fp16 tolerance; fp32
# (enforce_f32) by the file's own. Every op must run on the GPU (pe-export's fixed-shape exports do): an op
# it lacks is exit 3, named; CPU_FALLBACK=1 lets the CPU run those (a float16 file's DEQUANTIZEs) and each
# step's runtime string lists them. Needs pe-export and ai-edge-litert (no TensorFlow), fixed-shape
# files (`pe-export tflite --batch N --seq-len L`) and a golden bundle made with the same shape:
# GOLDEN_DIR for every model, or MODEL.tflite:GOLDEN_DIR for one.
#
#   targets/litert-gpu/check.sh GOLDEN_DIR OUT_DIR MODEL.tflite[:GOLDEN_DIR] [MODEL.tflite[:GOLDEN_DIR]...]
#   GPU_PRECISIONS="fp32" BENCH_RUNS=50 targets/litert-gpu/check.sh golden/ out/ encoder.tflite
#
# Exit code: 0 when every step passed, else the first failing step's (1 parity, 2 bad input,
# 3 no GPU / the GPU cannot run the file).
set -uo pipefail
usage="usage: check.sh GOLDEN_DIR OUT_DIR MODEL.tflite[:GOLDEN_DIR] [MODEL.tflite[:GOLDEN_DIR]...]"
default_golden=${1:?$usage}
out=${2:?$usage}
shift 2
[ $# -ge 1 ] || { echo "$usage" >&2; exit 2; }
precisions=${GPU_PRECISIONS:-fp16 fp32}
runs=${BENCH_RUNS:-200}
mkdir -p "$out" || exit 2
: > "$out/steps.tsv"
status=0
fallback=()
[ "${CPU_FALLBACK:-0}" = 1 ] && fallback=(--cpu-fallback)
. "$(dirname "$0")/../steps.sh"  # step, finish_report
for given in "$@"; do
  model=${given%%:*}
  golden=$default_golden
  [ "$given" != "$model" ] && golden=${given#*:}
  name=$(basename "$model" .tflite)
  for precision in $precisions; do
    step "parity-$name-$precision" pe-export parity "$model" "$golden" --runtime litert-gpu "${fallback[@]}" \
      --gpu-precision "$precision" --json "$out/parity-$name-$precision.json" --overwrite
    step "bench-$name-$precision" pe-export bench "$model" --runtime litert-gpu "${fallback[@]}" \
      --gpu-precision "$precision" --runs "$runs" --warmup 20 --json "$out/bench-$name-$precision.json" --overwrite
  done
done
finish_report
exit $status
