# Shared by the GPU check scripts (sourced, not run): each step's exit code is recorded and the first
# failure kept; finish_report writes report.json (atomically) from the steps and their JSON results.
# Needs $out (the results folder) and status=0 set by the caller.

step() {  # step NAME COMMAND...: run it, record its exit code (also in $last_code), keep the first failure's
  local name=$1 code
  shift
  rm -f "$out/$name.json"  # a result left by an earlier run must not stand in for this one
  "$@"
  code=$?
  last_code=$code
  printf '%s\t%s\t%s\n' "$name" "$code" "$*" >> "$out/steps.tsv"
  if [ "$code" -ne 0 ] && [ "$status" -eq 0 ]; then status=$code; fi
}

finish_report() {  # report.json: every step, its exit code and result; the runtimes; gpu.txt if written
  python3 - "$out" "$status" <<'PY'
import json, os, pathlib, sys
out, status = pathlib.Path(sys.argv[1]), int(sys.argv[2])
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, code, command = line.split("\t", 2)
    result = out / f"{name}.json"
    steps.append({"step": name, "exit_code": int(code), "command": command,
                  "result": json.loads(result.read_text()) if result.exists() else None})
report = {"passed": status == 0, "exit_code": status, "steps": steps,
          "runtimes": sorted({s["result"]["runtime"] for s in steps if s["result"]})}
if (out / "gpu.txt").exists():
    report["gpu"] = (out / "gpu.txt").read_text().strip()
partial = out / "report.json.partial"
partial.write_text(json.dumps(report, indent=2))
os.replace(partial, out / "report.json")
print(f"wrote {out / 'report.json'}: " + ", ".join(f"{s['step']} {s['exit_code']}" for s in steps))
PY
}
