#!/usr/bin/env bash
# Side by side, in one run: Hogwild on the MLP workload (784-512-256-10, batch 64, SGD lr 0.05,
# momentum 0.9 per worker, synthetic data, one epoch split over the workers, 1 thread each):
#   cohort   one worker (--mode local) and `cohortrun --nproc-per-node 2 cohort train --mode hogwild`
#   PyTorch  torch.multiprocessing Hogwild, 2 processes (../shared/bench-peers/mlp_torch.py, run from
#            there, not copied), with Debian's OpenBLAS (OpenMP build)
# REPS interleaved repetitions; medians of job throughput and test accuracy, and the ratios the
# issue asks for (2 workers over 1, cohort over torch).
#
#   bench/compare_hogwild_peers.sh            # REPS=3
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
PEERS=${PEERS:-../shared/bench-peers}
OPENMP_BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
cohort=bazel-bin/cli/cohort
cohortrun=bazel-bin/launcher/cohortrun
job=(--data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9 --threads 1)
field() { sed -nE "s/.*RESULT .*$1=([0-9.]+).*/\1/p"; }
torch() { sed -nE "s/.*name=[^ ]*blas\.$1 value=([0-9.]+).*/\1/p"; }

echo "# OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  out=$("$cohort" train --mode local "${job[@]}")
  echo "cohort_w1 $(field samples_per_s <<<"$out") $(field test_acc <<<"$out")" >>"$work/raw"
  out=$("$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode hogwild "${job[@]}")
  echo "cohort_hogwild_w2 $(field samples_per_s <<<"$out") $(field test_acc <<<"$out")" >>"$work/raw"
  out=$(LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 "$PEERS/mlp_torch.py" --mode hogwild --procs 2 --momentum 0.9)
  echo "torch_hogwild_p2 $(torch samples_per_s <<<"$out") $(torch test_acc <<<"$out")" >>"$work/raw"
done
/usr/bin/python3 - "$work/raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
med = {}
for name in ("cohort_w1", "cohort_hogwild_w2", "torch_hogwild_p2"):
    sps = [float(r[1]) for r in rows if r[0] == name]
    acc = [float(r[2]) for r in rows if r[0] == name]
    med[name] = statistics.median(sps)
    print(f"{name:18s} samples_per_s median={med[name]:8.0f} runs={' '.join(f'{v:.0f}' for v in sps)}  "
          f"test_acc median={statistics.median(acc):.4f} runs={' '.join(f'{v:.4f}' for v in acc)}")
print(f"RESULT compare=hogwild workers=2 cohort={med['cohort_hogwild_w2']:.0f} torch={med['torch_hogwild_p2']:.0f} "
      f"scaling_over_1_worker={med['cohort_hogwild_w2'] / med['cohort_w1']:.2f} "
      f"cohort_over_torch={med['cohort_hogwild_w2'] / med['torch_hogwild_p2']:.2f}")
PY
