#!/usr/bin/env bash
# Side by side, in one run: Cohort's `cohort bench train --model cnn:rosetta` against PyTorch python
# (../shared/bench-peers/cnn_torch.py, run from there, not copied) on the same CNN workload: the
# rosetta CIFAR CNN of issue 6 (conv2/conv4 without padding, so `--pad24 0` for the peer), batch 64,
# SGD lr 0.01 momentum 0.9, dropout on, one epoch of 5000 synthetic CIFAR-shaped samples (docs/data.md),
# 1 and 2 threads, REPS interleaved repetitions, medians and ratios. The peer uses Debian's
# OpenBLAS (OpenMP build) through LD_LIBRARY_PATH and its own oneDNN convolutions.
#
#   bench/compare_cnn_peers.sh                 # REPS=3, threads 1 and 2
#   REPS=5 THREADS="1" bench/compare_cnn_peers.sh
#
# Needs: python3-torch libopenblas0-openmp (Debian), and `bazel build //cli:cohort`.
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

echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for t in $THREADS; do
    v=$("$cohort" bench train --model cnn:rosetta --threads "$t" --repeats 1 |
        sed -nE 's/.*bench=train.* samples_per_s=([0-9.]+).*/\1/p')
    echo "cohort t$t $v" >>"$work/raw"
    v=$(LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 "$PEERS/cnn_torch.py" --threads "$t" --pad24 0 |
        sed -nE 's/.*samples_per_s value=([0-9.]+).*/\1/p')
    echo "pytorch t$t $v" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" "$THREADS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for peer in ("cohort", "pytorch"):
    for t in sys.argv[2].split():
        vals = [float(v) for p, tt, v in rows if p == peer and tt == "t" + t]
        med[peer, t] = statistics.median(vals)
        print(f"{peer:9s} threads={t} samples_per_s median={med[peer, t]:8.1f}  runs={' '.join(f'{v:.1f}' for v in vals)}")
for t in sys.argv[2].split():
    print(f"RESULT compare=cnn_rosetta threads={t} cohort={med['cohort', t]:.1f} pytorch={med['pytorch', t]:.1f} "
          f"cohort_over_pytorch={med['cohort', t] / med['pytorch', t]:.2f}")
PY
