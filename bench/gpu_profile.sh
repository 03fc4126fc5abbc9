#!/usr/bin/env bash
# Where one training step's GPU time goes: GPT-2 124M bf16 (batch 8, context 1024, vocabulary 50304)
# under a profiler, its timed steps only (`cohort bench train --profile` brackets them with
# cudaProfilerStart/Stop), then the kernels with the largest share of the time.
#   bench/gpu_profile.sh [OUT_DIR]
# COHORT names the cohort binary (default: the bundle's, else bazel-bin/cli/cohort); MODEL, BATCH and
# PRECISION override the case; PROFILER (nsys or ncu) picks the profiler, by default nsys when it is
# installed (its cuda_gpu_kern_sum report over 3 steps), otherwise ncu (gpu__time_duration of every
# kernel of one step, each replayed alone, so the shares are of kernel time, without the gaps between
# kernels). Prints
#   profile: TOOL, N steps, K kernel launches a step, T ms of kernel time a step
#   | share | ms a step | launches a step | kernel |
# for the 15 largest, and writes the profiler's own report to OUT_DIR.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$(mktemp -d)}
mkdir -p "$out"
cohort=${COHORT:-}
if [ -z "$cohort" ]; then
  for c in "$here/runfiles/cohort/cli/cohort" "$here/../bazel-bin/cli/cohort"; do [ -x "$c" ] && { cohort=$c; break; }; done
fi
[ -x "$cohort" ] || { echo "gpu_profile: no cohort binary (set COHORT)" >&2; exit 2; }
model=${MODEL:-gpt:layers=12,heads=12,dim=768,ctx=1024,vocab=50304}
batch=${BATCH:-8}
precision=${PRECISION:-bf16}
bench() {  # bench STEPS: the bench's arguments for STEPS timed steps
  echo bench train --device cuda --model "$model" --batch-size "$batch" --samples $(($1 * batch)) --repeats 1 \
    --precision "$precision" --profile
}
profiler=${PROFILER:-}
if [ -z "$profiler" ]; then
  if command -v nsys > /dev/null; then profiler=nsys; elif command -v ncu > /dev/null; then profiler=ncu; fi
fi
if [ "$profiler" = nsys ]; then
  steps=3
  # shellcheck disable=SC2046  # the arguments are words
  nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda --force-overwrite=true \
    --output="$out/step" "$cohort" $(bench $steps) > "$out/profile.log" 2>&1 || { tail -n 20 "$out/profile.log"; exit 1; }
  nsys stats --report cuda_gpu_kern_sum --format csv --output - "$out/step.nsys-rep" > "$out/kernels.csv" 2>> "$out/profile.log"
  tool=nsys
elif [ "$profiler" = ncu ]; then
  steps=1
  # shellcheck disable=SC2046
  ncu --profile-from-start off --metrics gpu__time_duration.sum --csv --page raw --log-file "$out/kernels.csv" \
    "$cohort" $(bench $steps) > "$out/profile.log" 2>&1 || { tail -n 20 "$out/profile.log"; exit 1; }
  tool=ncu
else
  echo "gpu_profile: neither nsys nor ncu is installed (or PROFILER names neither): no profile"
  exit 2
fi
grep -m1 '^RESULT' "$out/profile.log"
python3 - "$tool" "$steps" "$out/kernels.csv" <<'PY'
import csv, sys
from collections import defaultdict
tool, steps, path = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = [l for l in open(path, encoding="utf-8", errors="replace") if l.startswith('"')]
rows = list(csv.DictReader(lines))
total, launches = defaultdict(float), defaultdict(int)
for r in rows:
    if tool == "nsys":
        name, ns, n = r.get("Name", ""), float(r.get("Total Time (ns)", 0) or 0), int(float(r.get("Instances", 0) or 0))
    else:
        name, n = r.get("Kernel Name", ""), 1
        try:
            ns = float(r.get("gpu__time_duration.sum", "").replace(",", ""))
        except ValueError:
            continue  # the units row
        unit = rows[0].get("gpu__time_duration.sum", "nsecond")
        ns *= {"usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1)
    short = name.split("(")[0][:90]
    total[short] += ns
    launches[short] += n
whole = sum(total.values())
if whole <= 0:
    sys.exit("gpu_profile: the profiler recorded no kernel (see profile.log)")
print(f"profile: {tool}, {steps} steps, {sum(launches.values()) / steps:.0f} kernel launches a step, "
      f"{whole / steps / 1e6:.2f} ms of kernel time a step")
print("| share | ms a step | launches a step | kernel |")
print("|---:|---:|---:|---|")
for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:15]:
    print(f"| {100 * ns / whole:.1f}% | {ns / steps / 1e6:.3f} | {launches[name] / steps:.0f} | `{name}` |")
PY
