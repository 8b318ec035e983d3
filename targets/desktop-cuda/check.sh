#!/usr/bin/env bash
# GPU check for a desktop NVIDIA machine: parity and bench of an ONNX export with the TensorRT
# and CUDA execution providers (each falling back to nothing: a missing provider is exit 3),
# one JSON report. Needs pe-export with the device extra and onnxruntime-gpu (docker/cuda.Dockerfile).
#
#   targets/desktop-cuda/check.sh encoder.onnx golden/ [out-dir]
set -uo pipefail
model=${1:?usage: check.sh MODEL.onnx GOLDEN_DIR [OUT_DIR]}
golden=${2:?usage: check.sh MODEL.onnx GOLDEN_DIR [OUT_DIR]}
out=${3:-gpu-check}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/gpu.txt" 2>&1 || echo "no nvidia-smi" > "$out/gpu.txt"
status=0
for providers in tensorrt,cuda cuda; do
  tag=${providers//,/-}
  pe-export parity "$model" "$golden" --providers "$providers" --json "$out/parity-$tag.json" || status=$?
  pe-export bench "$model" --providers "$providers" --runs 200 --warmup 20 --json "$out/bench-$tag.json" || status=$?
done
python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
report = {"gpu": (out / "gpu.txt").read_text().strip(),
          "runs": {p.stem: json.loads(p.read_text()) for p in sorted(out.glob("*.json")) if p.name != "report.json"}}
(out / "report.json").write_text(json.dumps(report, indent=2))
print(f"wrote {out / 'report.json'}")
PY
exit $status
