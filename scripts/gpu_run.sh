#!/usr/bin/env bash
# The GPU check as one short run, on a GPU machine, from the folder scripts/gpu_bundle made (copied
# there as run.sh):
#   bash gpu-bundle/run.sh [--sanitize] [--bench] [--torch PATH/gpu_torch.py]
#  1. every gpu test binary (cli_gpu_test in shards), 4 at a time, each with a limit of 120 s: one
#     summary line each (PASSED with its case and skip counts, FAILED with the first failures,
#     TIMEOUT);
#  2. --sanitize: compute-sanitizer's memcheck over every binary (children included), racecheck and
#     synccheck over the kernel tests, with COHORT_GPU_TEST_UNDER_SANITIZER=1 (the smaller
#     workloads the emulated device runs, no death tests) and COHORT_TEST_TIMEOUT_SCALE=4 and a limit of 200 s each, several at a time: one summary line each;
#  3. --bench: bench/gpu_compare.sh: Cohort against PyTorch (--torch, default gpu_torch.py beside
#     the bundle) on the same work, one table with ratios, bf16 first; then bench/gpu_profile.sh:
#     where one GPT-2 bf16 step's GPU time goes (nsys or ncu: the largest kernels and their share);
#     then GPU Hogwild with 1, 2 and 4 processes on GPU 0 (and 4 under cohortrun --mps).
#     The tests and the sanitizers stop in time to leave the benchmarks their reserve
#     (BENCH_SECONDS, default 300): a hung test cannot eat it.
# Everything is logged under a folder packed at the end into gpu-logs.tar.gz in $OUT (the device
# tool's folder) or gpu-bundle-results/, beside summary.txt (the lines printed here) and, with
# --bench, gpu_compare.md (the table). Planned to end within 8 minutes on an H100/H200; each phase
# is skipped with a line saying so when the run's deadline (RUN_SECONDS, default 470) is near.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${OUT:-$here/../gpu-bundle-results}
mkdir -p "$results"
scratch=$(mktemp -d)
logs=$scratch/gpu-logs
mkdir -p "$logs"
sanitize=false bench=false torch_script="$here/gpu_torch.py"
while [ $# -gt 0 ]; do
  case "$1" in
    --sanitize) sanitize=true ;;
    --bench) bench=true ;;
    --torch) torch_script=$2; shift ;;
    *) echo "run.sh: unknown argument $1 (--sanitize, --bench, --torch PATH)" >&2; exit 2 ;;
  esac
  shift
done
start=$SECONDS
deadline=$((start + ${RUN_SECONDS:-470}))
left() { echo $((deadline - SECONDS)); }

# CUDA libraries: a Python environment's nvidia/*/lib (PyTorch's wheels), then the toolkit.
nvidia=$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib:${nvidia}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TEST_SRCDIR="$here/runfiles"
export PATH="$PATH:/usr/local/cuda/bin"
cohort="$here/runfiles/cohort/cli/cohort"
cohortrun="$here/runfiles/cohort/launcher/cohortrun"
summary="$logs/summary.txt"
say() { echo "$*" | tee -a "$summary"; }

finish() {
  say "total: $((SECONDS - start)) s"
  cp "$summary" "$results/summary.txt"
  tar -C "$(dirname "$logs")" -czf "$results/gpu-logs.tar.gz" gpu-logs
}
trap finish EXIT

"$cohort" devices > "$logs/devices.txt" 2>&1
say "$(grep -m2 -E 'cuda:0|CUDA devices' "$logs/devices.txt" | tr '\n' ' ')"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$logs/nvidia-smi.txt" 2>&1

# One job per line: NAME LIMIT [VAR=VALUE...] PROGRAM ARGS... (words without blanks; run through env,
# with a TEST_TMPDIR of its own).
jobs_file="$logs/jobs.txt"
: > "$jobs_file"
add_job() { echo "$*" >> "$jobs_file"; }

# run_one NAME LIMIT COMMAND...: one summary line for one binary (or shard, or sanitizer run).
run_one() {
  local name=$1 limit=$2 log="$logs/$1.log" t0=$SECONDS rc ok skipped phase_left
  shift 2
  # A job never runs past its phase's end (PHASE_END, seconds since the epoch).
  phase_left=$((PHASE_END - $(date +%s)))
  [ "$phase_left" -lt "$limit" ] && limit=$phase_left
  if [ "$limit" -lt 10 ]; then echo "SKIPPED $name: its phase's time ran out"; return; fi
  mkdir -p "$logs/tmp/$name"
  timeout -k 10 "$limit" env TEST_TMPDIR="$logs/tmp/$name" "$@" > "$log" 2>&1
  rc=$?
  ok=$(grep -c '^\[       OK \]' "$log")
  skipped=$(grep -c '^\[  SKIPPED \] [^ ]*\.[^ ]* (' "$log")
  if [ "$rc" -eq 0 ]; then
    echo "PASSED $name ($ok cases, $skipped skipped, $((SECONDS - t0)) s)$(grep -m1 -E '^========= ERROR SUMMARY' "$log" | sed 's/^=*/;/')"
  elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    echo "TIMEOUT $name after $limit s ($ok cases passed; last: $(grep -E '^\[ RUN' "$log" | tail -n1 | cut -c14-))"
  else
    echo "FAILED $name (exit $rc, $ok cases passed, $((SECONDS - t0)) s)"
    grep -E '^\[  FAILED|Failure|rror|CHECK failed|========= (Invalid|Race|Barrier|Uninit|Program hit|Target application)' "$log" |
      head -n 12 | sed 's/^/    /'
  fi
}
export -f run_one
export logs

# run_jobs PARALLEL SECONDS: the jobs in jobs_file, PARALLEL at a time, none running past SECONDS
# from now; their lines go to the summary as they end.
run_jobs() {
  PHASE_END=$(($(date +%s) + $2)) xargs -P "$1" -L 1 bash -c 'run_one "$@"' _ < "$jobs_file" | tee -a "$summary"
  : > "$jobs_file"
}

binaries=("$here"/bin/*)
# Seconds kept for the benchmarks at the end: no test or sanitizer job runs into them.
reserve=0
$bench && reserve=${BENCH_SECONDS:-300}
# 1. The tests.
say "== gpu tests ($((SECONDS - start)) s)"
for t in "${binaries[@]}"; do
  name=$(basename "$t")
  if [ "$name" = cli_gpu_test ]; then  # its cases train whole jobs: three shards run side by side
    for s in 0 1 2; do add_job "$name.shard$s" 120 GTEST_TOTAL_SHARDS=3 GTEST_SHARD_INDEX=$s "$t"; done
  else
    add_job "$name" 120 "$t"
  fi
done
run_jobs 4 $(( $(left) - reserve - 30 ))

# 2. The sanitizers.
if $sanitize; then
  say "== compute-sanitizer ($((SECONDS - start)) s)"
  if ! command -v compute-sanitizer > /dev/null; then
    say "SKIPPED sanitizers: compute-sanitizer not found"
  elif [ "$(left)" -lt $((reserve + 60)) ]; then
    say "SKIPPED sanitizers: $(left) s left of the run"
  else
    # memcheck checks memory accesses; API errors are left to the code, which checks every call, and
    # some are deliberate (the out-of-memory tests) or NCCL's own probing (cudaFuncGetAttributes).
    cs="COHORT_GPU_TEST_UNDER_SANITIZER=1 COHORT_TEST_TIMEOUT_SCALE=4 compute-sanitizer --error-exitcode 99 --print-limit 20"
    # The slowest first: cli_gpu_test's cases train whole jobs in cohort processes, each instrumented
    # too (about a minute each): one shard per case.
    for s in 0 1 2 3 4 5 6 7 8 9; do
      add_job "memcheck.cli_gpu_test.shard$s" 200 GTEST_TOTAL_SHARDS=10 GTEST_SHARD_INDEX=$s $cs --tool memcheck \
        --report-api-errors no --target-processes all "$here/bin/cli_gpu_test"
    done
    for t in "${binaries[@]}"; do
      [ "$(basename "$t")" = cli_gpu_test ] || add_job "memcheck.$(basename "$t")" 200 $cs --tool memcheck \
        --report-api-errors no "$t"
    done
    for t in "${binaries[@]}"; do
      case "$(basename "$t")" in
        kernels_test|elementwise_test|gpu_layers_test|gpu_norm_test|gpu_embedding_test|gpu_modules_test|gpu_attention_test|reduce_kernels_test)
          add_job "racecheck.$(basename "$t")" 200 $cs --tool racecheck "$t"
          add_job "synccheck.$(basename "$t")" 200 $cs --tool synccheck "$t" ;;
      esac
    done
    run_jobs 8 $(( $(left) - reserve ))
  fi
fi

# 3. The benchmarks.
if $bench; then
  say "== benchmarks ($((SECONDS - start)) s)"
  if [ "$(left)" -lt 120 ]; then
    say "SKIPPED benchmarks: $(left) s left of the run"
  else
    if [ -f "$torch_script" ]; then
      COHORT="$cohort" timeout $(( $(left) - 100 > 60 ? $(left) - 100 : 60 )) bash "$here/gpu_compare.sh" "$torch_script" "$logs/bench" "$scratch" > "$logs/gpu_compare.log" 2>&1
      sed -n '/^| case/,$p' "$logs/gpu_compare.log" | tee "$results/gpu_compare.md" | tee -a "$summary"
    else
      say "SKIPPED gpu_compare: no PyTorch script at $torch_script (copy bench-peers' gpu_torch.py beside the bundle)"
    fi
    if [ "$(left)" -lt 60 ]; then
      say "SKIPPED gpu_profile: $(left) s left of the run"
    else
      COHORT="$cohort" timeout $(( $(left) - 40 )) bash "$here/gpu_profile.sh" "$logs/profile" > "$logs/gpu_profile.log" 2>&1
      sed -n '/^profile:/,$p' "$logs/gpu_profile.log" | tee "$results/gpu_profile.md" | tee -a "$summary"
      grep -q '^profile:' "$logs/gpu_profile.log" || say "gpu_profile failed: $(tail -n 3 "$logs/gpu_profile.log" | tr '\n' ' ')"
    fi

    if [ "$(left)" -lt 100 ]; then
      say "SKIPPED hogwild: $(left) s left of the run"
    else
      job=(train --device cuda:0 --data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9)
      hogwild() {  # hogwild LABEL N [cohortrun flags]: one line with the job's RESULT figures
        local label=$1 n=$2 r
        shift 2
        if [ "$n" -eq 1 ]; then r=$(timeout 60 "$cohort" "${job[@]}" --mode local 2>> "$logs/hogwild.err" | grep RESULT)
        else r=$(timeout 60 "$cohortrun" --nproc-per-node "$n" "$@" -- "$cohort" "${job[@]}" --mode hogwild 2>> "$logs/hogwild.err" | grep RESULT)
        fi
        r=$(sed -nE 's/.*(test_acc=[^ ]+).*(samples_per_s=[^ ]+).*/\2 \1/p' <<<"$r" | head -n1)
        say "hogwild $label: ${r:-failed (hogwild.err)}"
      }
      hogwild "1 process" 1
      hogwild "2 processes" 2
      hogwild "4 processes" 4
      hogwild "4 processes, --mps" 4 --mps
      say "after --mps: $(ls -d "${TMPDIR:-/tmp}"/cohortrun-* 2>/dev/null | wc -l) job folders left, $(pgrep -c -f nvidia-cuda-mps) MPS processes left"
      pgrep -a -f nvidia-cuda-mps >> "$logs/hogwild.err"
    fi
  fi
fi
