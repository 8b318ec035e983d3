#!/usr/bin/env bash
# CI gate: export the encoder, make the golden bundle from the float32 SavedModel, and fail
# the build when the exported file drifts from it. Exit codes are pe-export's own
# (1 parity regression, 2 bad input, 3 runtime unavailable); `set -e` passes them on.
#
#   examples/ci/export-and-check.sh SAVED_MODEL OUT_DIR [extra `pe-export parity` options]
set -euo pipefail
saved_model=$1
out=$2
shift 2
mkdir -p "$out"
pe-export tflite "$saved_model" -o "$out/encoder.tflite" --overwrite
pe-export onnx "$saved_model" -o "$out/encoder.onnx" --overwrite
pe-export golden "$saved_model" -o "$out/golden" --samples 64 --overwrite
pe-export parity "$out/encoder.tflite" "$out/golden" --json "$out/parity-tflite.json" --overwrite "$@"
pe-export parity "$out/encoder.onnx" "$out/golden" --json "$out/parity-onnx.json" --overwrite "$@"
