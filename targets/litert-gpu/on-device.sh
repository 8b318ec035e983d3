#!/usr/bin/env bash
# On the GPU machine (no internet): install what prepare.sh carried into a fresh venv (pe-export
# without its optional runtimes, ai-edge-litert, numpy, click: no TensorFlow), make sure a Vulkan
# loader and the GPU's driver are found, then run check.sh on the carried files.
#
#   targets/litert-gpu/on-device.sh PREPARED_DIR RESULTS_DIR
#
# PYTHON (default python3) makes the venv: the Python version prepare.sh fetched wheels for.
set -uo pipefail
prepared=$(realpath "${1:?usage: on-device.sh PREPARED_DIR RESULTS_DIR}")
results=$(realpath -m "${2:?usage: on-device.sh PREPARED_DIR RESULTS_DIR}")
here=$(cd "$(dirname "$0")" && pwd)
# The loader only (the driver comes with the GPU's); LD_LIBRARY_PATH counts, as for the runtime.
if ! python3 -c "import ctypes; ctypes.CDLL('libvulkan.so.1')" 2>/dev/null; then
  for deb in "$prepared"/debs/*.deb; do dpkg -x "$deb" /; done
  ldconfig
fi
nvidia_icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "${VK_ICD_FILENAMES:-}${VK_DRIVER_FILES:-}" ] && [ -f "$nvidia_icd" ]; then
  export VK_DRIVER_FILES=$nvidia_icd
fi
venv=$(mktemp -d)/venv
"${PYTHON:-python3}" -m venv "$venv" || exit 2
"$venv/bin/pip" install -q --no-index --find-links "$prepared/wheels" ai-edge-litert numpy click || exit 2
"$venv/bin/pip" install -q --no-index --no-deps "$prepared"/wheels/pe_export-*.whl || exit 2
mkdir -p "$results"
models=()  # MODEL:GOLDEN per line, as prepare.sh wrote them
while IFS=: read -r model golden; do models+=("$prepared/$model:$prepared/$golden"); done < "$prepared/models.txt"
PATH="$venv/bin:$PATH" "$here/check.sh" "$prepared/golden" "$results" "${models[@]}"
