#!/usr/bin/env bash
# On the GPU machine (in the CUDA image, from the repository root): check.sh on every file prepare.sh made, each
# against its bundle, and one report.json over all of them (each file's steps under its name; the exit code is
# the first failing file's).
#
#   targets/desktop-cuda/run-kit.sh PREPARED_DIR RESULTS_DIR
#   PROVIDER_SETS="cuda" BENCH_RUNS=50 targets/desktop-cuda/run-kit.sh .device/desktop-cuda gpu-results/
set -uo pipefail
usage="usage: run-kit.sh PREPARED_DIR RESULTS_DIR"
prepared=$(realpath "${1:?$usage}")
results=$(realpath -m "${2:?$usage}")
here=$(cd "$(dirname "$0")" && pwd)
[ -f "$prepared/models.txt" ] || { echo "error: $prepared has no models.txt; make it with prepare.sh" >&2; exit 2; }
mkdir -p "$results" || exit 2
status=0
while IFS=: read -r model golden modes seq_len; do
  name=${model%.onnx}
  TRT_MODES=$modes TRT_CACHE=$results/trt-cache BENCH_SEQ_LEN=$seq_len "$here/check.sh" "$prepared/$model" "$prepared/$golden" \
    "$results/$name" < /dev/null
  code=$?
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then status=$code; fi
done < "$prepared/models.txt"
python3 - "$prepared/models.txt" "$results" "$status" <<'PY'
import json, os, pathlib, sys
models, results, status = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2]), int(sys.argv[3])
reports = {}
for line in models.read_text().splitlines():
    name = line.split(":", 1)[0].removesuffix(".onnx")
    path = results / name / "report.json"
    reports[name] = json.loads(path.read_text()) if path.exists() else None
report = {"passed": status == 0, "exit_code": status, "models": reports}
partial = results / "report.json.partial"
partial.write_text(json.dumps(report, indent=2))
os.replace(partial, results / "report.json")
print(f"wrote {results / 'report.json'}: " + ", ".join(f"{n} {r and r['exit_code']}" for n, r in reports.items()))
PY
exit $status
