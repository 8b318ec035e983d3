#!/usr/bin/env bash
# GPU check for a machine with an NVIDIA GPU: parity and bench of an ONNX export with the
# TensorRT and CUDA execution providers, one JSON report (report.json) with each step's exit code.
# Providers are strict: one that onnxruntime cannot start is exit 3, never a silent CPU run.
# Float32 files are checked in float32 math; PE_EXPORT_TF32=1 allows TF32 (parity and bench).
# Provider sets with TensorRT run once per TRT_MODES entry (default "fp32 fp16": the float32 engine, then one
# that may build float16 layers, judged by the fp16 tolerance; "int8" for a static int8 Q/DQ file). Engines and
# timing data are kept in OUT_DIR/trt-cache, so parity's engine serves bench (TRT_CACHE sets another folder).
# Needs pe-export with the device extra and onnxruntime-gpu (docker/cuda.Dockerfile has both).
#
#   targets/desktop-cuda/check.sh encoder.onnx golden/ [out-dir]
#   PROVIDER_SETS="cuda" BENCH_RUNS=50 BENCH_SEQ_LEN=64 targets/desktop-cuda/check.sh encoder.onnx golden/
#
# A parity step that fails (exit 1) on a bundle written with --layers is followed by a layers step naming the
# first layer over tolerance (report.json: layers-<providers>).
#
# Exit code: 0 when every step passed, else the first failing step's (1 parity, 2 bad input,
# 3 provider unavailable).
set -uo pipefail
usage="usage: check.sh MODEL.onnx GOLDEN_DIR [OUT_DIR]"
model=${1:?$usage}
golden=${2:?$usage}
out=${3:-gpu-check}
provider_sets=${PROVIDER_SETS:-tensorrt,cuda cuda}
trt_modes=${TRT_MODES:-fp32 fp16}
runs=${BENCH_RUNS:-200}
tf32=()
[ "${PE_EXPORT_TF32:-0}" = 1 ] && tf32=(--tf32)
seq_len=()
[ -n "${BENCH_SEQ_LEN:-}" ] && seq_len=(--seq-len "$BENCH_SEQ_LEN")
mkdir -p "$out" || exit 2
trt_cache=${TRT_CACHE:-${out%/}/trt-cache}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 \
  || echo "no nvidia-smi" > "$out/gpu.txt"
: > "$out/steps.tsv"
status=0
. "$(dirname "$0")/../steps.sh"  # step, finish_report
for providers in $provider_sets; do
  modes=fp32
  [[ ,$providers, == *,tensorrt,* ]] && modes=$trt_modes
  for mode in $modes; do
    tag=${providers//,/-}
    trt=()
    if [[ ,$providers, == *,tensorrt,* ]]; then
      trt=(--trt-cache "$trt_cache")
      [ "$mode" = fp32 ] || { tag=$tag-$mode; trt+=("--trt-$mode"); }
    fi
    # TensorRT builds its engine on the first call: minutes for a large model, hence the timeout.
    step "parity-$tag" pe-export parity "$model" "$golden" --providers "$providers" "${tf32[@]}" "${trt[@]}" \
      --timeout 1800 --json "$out/parity-$tag.json"
    # A failed check on a bundle with layers (golden --layers): the first layer over tolerance on this GPU, from
    # files cut at a layer (TensorRT and CUDA keep no intermediate as they run): about log2(layers) engine builds.
    if [ "$last_code" -eq 1 ] && python3 -c 'import json, sys; sys.exit(not json.load(open(sys.argv[1])).get("layers"))' \
      "$golden/manifest.json" 2>/dev/null; then
      step "layers-$tag" pe-export parity "$model" "$golden" --providers "$providers" "${tf32[@]}" "${trt[@]}" \
        --layers --timeout 1800 --json "$out/layers-$tag.json"
    fi
    step "bench-$tag" pe-export bench "$model" --providers "$providers" "${tf32[@]}" "${trt[@]}" \
      "${seq_len[@]}" --runs "$runs" --warmup 20 --json "$out/bench-$tag.json"
  done
done
finish_report
exit $status
