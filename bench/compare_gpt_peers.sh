#!/usr/bin/env bash
# Side by side, in one run: GPT training throughput (tokens/s) of `cohort train --model gpt:...`
# against PyTorch (bench/gpt_torch.py: the same architecture, AdamW, batch and context; Debian's
# PyTorch 1.13 with OpenBLAS, OpenMP build, via LD_LIBRARY_PATH) on the demo corpus
# (scripts/demo-corpus), REPS interleaved repetitions, medians and ratios:
#   1 thread, one process;  2 workers × 1 thread (Cohort --mode allreduce under cohortrun: one
#   shared copy, and replicas; PyTorch DistributedDataParallel over gloo).
# The batch is per worker (2 workers: twice the tokens per step). Cohort's figure is its RESULT
# line's tokens_per_s (training steps only: the test set is a 1 KB file, so evaluation is short and
# not counted); PyTorch's is timed over --steps after 3 warm-up steps. Also prints Cohort's GEMM
# FLOP/s against the machine's 1-thread SGEMM rate (1024³, `cohort bench train`'s first line).
#
#   bench/compare_gpt_peers.sh                       # REPS=3, gpt:layers=4,heads=4,dim=128,ctx=64, batch 32
#   REPS=1 STEPS=20 bench/compare_gpt_peers.sh
#
# Needs: python3-torch libopenblas0-openmp fortunes (Debian), `bazel build //cli:cohort //launcher:cohortrun`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
STEPS=${STEPS:-30}
LAYERS=${LAYERS:-4} HEADS=${HEADS:-4} DIM=${DIM:-128} CTX=${CTX:-64} BATCH=${BATCH:-32}
OPENMP_BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
corpus=$(scripts/demo-corpus)
head -c 1000 "$corpus" >"$work/tiny.txt"
cohort=bazel-bin/cli/cohort
cohortrun=bazel-bin/launcher/cohortrun
[ -x "$cohort" ] && [ -x "$cohortrun" ] || bazel build //cli:cohort //launcher:cohortrun
spec="gpt:layers=$LAYERS,heads=$HEADS,dim=$DIM,ctx=$CTX"
train=("$cohort" train --data "text:$corpus" --test-data "text:$work/tiny.txt" --model "$spec" --optimizer adamw
       --lr 0.003 --batch-size "$BATCH" --max-steps "$STEPS" --epochs 1 --threads 1 --progress-every 0)
tokens() { sed -nE 's/^(\[rank 0\] )?RESULT .*tokens_per_s=([0-9]+).*/\2/p'; }

echo "# $spec batch $BATCH per worker, $STEPS steps; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "# $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  echo "cohort-1t $("${train[@]}" | tokens)" >>"$work/raw"
  echo "pytorch-1t $(OMP_NUM_THREADS=1 LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 bench/gpt_torch.py --data "$corpus" \
      --layers "$LAYERS" --heads "$HEADS" --dim "$DIM" --ctx "$CTX" --batch "$BATCH" --steps "$STEPS" |
      sed -nE 's/.*tokens_per_s=([0-9]+).*/\1/p')" >>"$work/raw"
  echo "cohort-2w-shared $(COHORT_SHM_DIR=/dev/shm "$cohortrun" --nproc-per-node 2 -- "${train[@]}" --mode allreduce | tokens)" >>"$work/raw"
  echo "cohort-2w-replicas $("$cohortrun" --nproc-per-node 2 -- "${train[@]}" --mode allreduce --replicas | tokens)" >>"$work/raw"
  echo "pytorch-2w $(OMP_NUM_THREADS=1 LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 bench/gpt_torch.py --data "$corpus" \
      --layers "$LAYERS" --heads "$HEADS" --dim "$DIM" --ctx "$CTX" --batch "$BATCH" --steps "$STEPS" --workers 2 |
      sed -nE 's/.*tokens_per_s=([0-9]+).*/\1/p')" >>"$work/raw"
done
gemm=$("$cohort" bench train --threads 1 --repeats 1 --samples 640 | sed -nE 's/^RESULT bench=sgemm shape=1024x1024x1024 .*gflops=([0-9.]+).*/\1/p' | head -1)
/usr/bin/python3 - "$work/raw" "$LAYERS" "$DIM" "$CTX" "${gemm:-0}" <<'PY'
import statistics, sys
raw, layers, dim, ctx, gemm = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
runs = {}
for line in open(raw):
    name, *value = line.split()
    runs.setdefault(name, []).append(float(value[0]) if value else float("nan"))
med = {k: statistics.median(v) for k, v in runs.items()}
for k, v in runs.items():
    print(f"{k:20s} tokens/s median {med[k]:9.0f}   runs {' '.join(f'{x:.0f}' for x in v)}")
print(f"1 thread:  cohort / pytorch = {med['cohort-1t'] / med['pytorch-1t']:.2f}")
print(f"2 workers: cohort shared / pytorch DDP = {med['cohort-2w-shared'] / med['pytorch-2w']:.2f}, "
      f"replicas / pytorch DDP = {med['cohort-2w-replicas'] / med['pytorch-2w']:.2f}")
# Training FLOPs per token: 6 per weight of the GEMMs (12·D² per block, the tied head V·D), plus
# attention's two T×T products, forward 4·T·D per block, three times that with backward.
flops = 6 * (12 * dim * dim * layers + 256 * dim) + 3 * 4 * ctx * dim * layers
achieved = med["cohort-1t"] * flops / 1e9
line = f"cohort 1 thread: {achieved:.1f} GFLOP/s of training work"
if gemm > 0:
    line += f", {100 * achieved / gemm:.0f}% of this machine's 1-thread SGEMM rate ({gemm:.1f} GFLOP/s, 1024^3)"
print(line)
PY
