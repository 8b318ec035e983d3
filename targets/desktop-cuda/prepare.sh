#!/usr/bin/env bash
# Make the files targets/desktop-cuda/run-kit.sh checks on an NVIDIA GPU, in one folder: the demo encoder and a
# MiniLM-shaped encoder (targets/kit_encoders.sh) as ONNX in float32 and in float16 (a float16 graph, float32
# islands where float16 loses it), the MiniLM-shaped one in static int8 QDQ too, each with a golden bundle that keeps every layer's activations (a failed check
# then names its first layer over tolerance). Run it here, where TensorFlow and keras-hub are installed; on the GPU machine run the CUDA
# image (docker/cuda.Dockerfile: pe-export, onnxruntime-gpu, TensorRT) with the folder mounted.
#
#   targets/desktop-cuda/prepare.sh [OUT_DIR]          (default: .device/desktop-cuda)
#
# models.txt lists MODEL:GOLDEN:TRT_MODES:SEQ_LEN per line (SEQ_LEN: the bundle's, which bench times): float32
# files are built by TensorRT as fp32 and as fp16 engines; a float16 file is built as it is typed (no --trt-fp16
# asked: its float32 islands are not handed to fp16); the MiniLM-shaped encoder's static int8 QDQ file
# (--quantize int8, at the bundle's fixed length) is built as an int8 engine from its own Q/DQ scales (--trt-int8).
set -euo pipefail
out=$(realpath -m "${1:-.device/desktop-cuda}")
seq_len=32
rm -rf "$out" && mkdir -p "$out"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/../kit_encoders.sh"
kit_encoders "$work"
: > "$out/models.txt"
for name in encoder minilm-shaped; do
  pe-export golden "$work/$name" --seq-len $seq_len --samples 8 --layers all -o "$out/$name.golden"
  pe-export onnx "$work/$name" -o "$out/$name.fp32.onnx"
  pe-export onnx "$work/$name" --quantize float16 -o "$out/$name.float16.onnx"
  printf '%s\n' "$name.fp32.onnx:$name.golden:fp32 fp16:$seq_len" "$name.float16.onnx:$name.golden:fp32:$seq_len" \
    >> "$out/models.txt"
done
# at the bundle's length: static ranges hold at the lengths they were calibrated at (calibrated over 512 positions,
# this file missed the int8 tolerance on the bundle's 32: worst pooled cosine 0.989)
pe-export onnx "$work/minilm-shaped" --quantize int8 --seq-len $seq_len -o "$out/minilm-shaped.int8.onnx"
printf '%s\n' "minilm-shaped.int8.onnx:minilm-shaped.golden:int8:$seq_len" >> "$out/models.txt"
echo "prepared $out: $(du -sh "$out" | cut -f1)"
