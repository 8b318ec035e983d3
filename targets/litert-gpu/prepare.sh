#!/usr/bin/env bash
# Make what a GPU machine without internet needs for targets/litert-gpu/check.sh, in one folder
# (under 64 MiB: one device call carries it): the demo encoder and a MiniLM-shaped encoder exported at fixed
# shapes (.tflite, float32: the accelerator runs every op of both, at fp16 and at fp32 arithmetic) with a golden
# bundle each, wheels of pe-export, ai-edge-litert and their dependencies for the device's Python, and the
# Vulkan loader (libvulkan1) for machines that lack one. Run it here, where TensorFlow and keras-hub are
# installed. The MiniLM-shaped encoder (targets/kit_encoders.sh) has all-MiniLM-L6-v2's ops at 1/5 of its bytes,
# so that the kit fits.
#
#   targets/litert-gpu/prepare.sh [OUT_DIR] [DEVICE_PYTHON_VERSION]     (defaults: .device/litert-gpu 3.12)
#
# Then, on the device, from the repository root:  targets/litert-gpu/on-device.sh OUT_DIR RESULTS_DIR
set -euo pipefail
out=$(realpath -m "${1:-.device/litert-gpu}")
pyver=${2:-3.12}
repo=$(cd -P "$(dirname "$0")/../.." && pwd)  # -P: the checkout itself, through a linked targets/
seq_len=32
rm -rf "$out" && mkdir -p "$out/wheels" "$out/debs"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
. "$(dirname "$0")/../kit_encoders.sh"
kit_encoders "$work"
pe-export tflite "$work/encoder" --batch 1 --seq-len $seq_len -o "$out/encoder.fp32.tflite"
pe-export golden "$work/encoder" --batch 1 --seq-len $seq_len -o "$out/golden"
pe-export tflite "$work/minilm-shaped" --batch 1 --seq-len $seq_len -o "$out/minilm-shaped.tflite"
pe-export golden "$work/minilm-shaped" --batch 1 --seq-len $seq_len --samples 8 -o "$out/minilm-shaped.golden"
printf '%s\n' encoder.fp32.tflite:golden minilm-shaped.tflite:minilm-shaped.golden > "$out/models.txt"
python3 -m pip wheel -q --no-deps -w "$out/wheels" "$repo"
python3 -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  -d "$out/wheels" "ai-edge-litert>=2.3" numpy click  # 2.3: the first with CompiledModel on the GPU
(cd "$out/debs" && apt-get download -o APT::Sandbox::User=root libvulkan1 > /dev/null)
echo "prepared $out: $(du -sh "$out" | cut -f1)"
