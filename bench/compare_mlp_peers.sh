#!/usr/bin/env bash
# Side by side, in one run: Cohort's `cohort bench train` against LibTorch C++ and PyTorch python on
# the same MLP workload (784-512-256-10, batch 64, SGD lr 0.05 momentum 0.9, synthetic data, one
# epoch), 1 and 2 threads, REPS interleaved repetitions, medians and ratios. The peer programs are
# the ones in ../shared/bench-peers (run from there, not copied); the peers use Debian's OpenBLAS
# (OpenMP build) via LD_LIBRARY_PATH, the fair peer for a framework with an optimised GEMM.
#
#   bench/compare_mlp_peers.sh                 # REPS=3, threads 1 and 2
#   REPS=5 THREADS="1" bench/compare_mlp_peers.sh
#
# Needs: python3-torch libtorch-dev libopenblas0-openmp (Debian), and `bazel build //cli:cohort`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
THREADS=${THREADS:-"1 2"}
PEERS=${PEERS:-../shared/bench-peers}
OPENMP_BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cohort=bazel-bin/cli/cohort
[ -x "$cohort" ] || bazel build //cli:cohort
libtorch="$work/mlp_libtorch"
g++ -O2 -std=c++17 -o "$libtorch" "$PEERS/mlp_libtorch.cpp" \
    -I/usr/include/torch/csrc/api/include -ltorch -ltorch_cpu -lc10

echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    v=$("$cohort" bench train --threads "$t" --repeats 1 | sed -nE 's/.*bench=train.* samples_per_s=([0-9.]+).*/\1/p')
    echo "cohort t$t $v" >>"$work/raw"
    v=$(OMP_NUM_THREADS=$t LD_LIBRARY_PATH=$OPENMP_BLAS "$libtorch" --threads "$t" |
        sed -nE 's/.*samples_per_s value=([0-9.]+).*/\1/p')
    echo "libtorch t$t $v" >>"$work/raw"
    v=$(LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 "$PEERS/mlp_torch.py" --mode single --threads "$t" |
        sed -nE 's/.*samples_per_s value=([0-9.]+).*/\1/p')
    echo "pytorch t$t $v" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" "$THREADS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for peer in ("cohort", "libtorch", "pytorch"):
    for t in sys.argv[2].split():
        vals = [float(v) for p, tt, v in rows if p == peer and tt == "t" + t]
        med[peer, t] = statistics.median(vals)
        print(f"{peer:9s} threads={t} samples_per_s median={med[peer, t]:8.0f}  runs={' '.join(f'{v:.0f}' for v in vals)}")
for t in sys.argv[2].split():
    print(f"RESULT compare=mlp threads={t} cohort={med['cohort', t]:.0f} libtorch={med['libtorch', t]:.0f} "
          f"pytorch={med['pytorch', t]:.0f} cohort_over_libtorch={med['cohort', t] / med['libtorch', t]:.2f} "
          f"cohort_over_pytorch={med['cohort', t] / med['pytorch', t]:.2f}")
PY
