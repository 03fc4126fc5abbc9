#!/usr/bin/env bash
# Runs on a GPU machine, from the folder scripts/gpu_bundle made (copied there as run.sh): every gpu
# test binary, then with --bench the GPU benchmarks (cohort bench train on cuda for the MLP and
# cnn:rosetta, GPU Hogwild with 1, 2 and 4 processes on GPU 0, and the NCCL all-reduce sweep with
# one rank). Results go to $OUT (the device tool's folder) or gpu-bundle-results/.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
results=${OUT:-$here/../gpu-bundle-results}
mkdir -p "$results"
# CUDA libraries: a Python environment's nvidia/*/lib (PyTorch's wheels), then the toolkit.
nvidia=$(python3 -c 'import nvidia, os; print(":".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null || true)
export LD_LIBRARY_PATH="$here/lib:${nvidia}:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export TEST_SRCDIR="$here/runfiles" TEST_TMPDIR=$(mktemp -d)
cohort="$here/runfiles/cohort/cli/cohort"
cohortrun="$here/runfiles/cohort/launcher/cohortrun"
"$cohort" devices | tee "$results/devices.txt"
passed=0 failed=0
for t in "$here"/bin/*; do
  name=$(basename "$t")
  if timeout 900 "$t" > "$results/$name.log" 2>&1; then
    passed=$((passed + 1)); echo "PASSED $name ($(grep -c '^\[       OK \]' "$results/$name.log") cases, $(grep -c '^\[  SKIPPED \] [^ ]*\.[^ ]* (' "$results/$name.log") skipped)"
  else
    failed=$((failed + 1)); echo "FAILED $name"; grep -E '^\[  FAILED|Failure|error' "$results/$name.log" | head -20
  fi
done | tee "$results/summary.txt"
[ "${1:-}" = "--bench" ] || exit 0
{
  for model in mlp:784,512,256,10 cnn:rosetta; do
    "$cohort" bench train --device cuda --model "$model" --batch-size 64 --repeats 3
  done
  job=(train --device cuda:0 --data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9)
  echo "hogwild 1: $("$cohort" "${job[@]}" --mode local | grep RESULT)"
  for n in 2 4; do
    echo "hogwild $n: $("$cohortrun" --nproc-per-node "$n" -- "$cohort" "${job[@]}" --mode hogwild | grep RESULT)"
  done
  "$cohortrun" --nproc-per-node 1 -- "$cohort" bench allreduce --backend nccl --max-bytes 256M
} 2>&1 | tee "$results/bench.txt"
