#!/usr/bin/env bash
# `cohort train` of two commits side by side, in one run: a refactor must not change throughput.
# BASE (default: the commit before the train/ API, 63c1a79) is built in a temporary git worktree
# with an output base of its own (bench/build_base.sh; cached in ~/.cache/cohort-bench-base/<rev>);
# the working tree is the other side. On the MLP workload of compare_workers_peers.sh
# (784-512-256-10, batch 64, SGD lr 0.05 momentum 0.9, synthetic data, one epoch split over the workers):
#   local                  cohort train --mode local
#   hogwild, 2 workers     cohortrun --nproc-per-node 2 -- cohort train --mode hogwild
#   allreduce, 2 workers   cohortrun ... --mode allreduce (shm: shared copy, sharded update)
#   replicas, 2 workers    cohortrun ... --mode allreduce --replicas
#   mpi, 2 workers         mpirun -np 2 ... --mode allreduce --backend mpi
# REPS interleaved repetitions (base, then current, per mode); the median job throughput of each
# and the ratio current/base (1.00 = unchanged; this machine's noise is a few per cent).
#
#   bench/compare_commits.sh                  # REPS=3
#   BASE=HEAD~3 REPS=5 bench/compare_commits.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
BASE=${BASE:-63c1a79}
MODES=${MODES:-"local hogwild allreduce replicas mpi"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
rev=$(git rev-parse --short "$BASE")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
baseBin=$(bench/build_base.sh "$rev")
job=(--data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9 --threads 1)
field() { sed -nE "s/.*RESULT .*$1=([0-9.]+).*/\1/p"; }
runMode() {  # side (base|current), mode: one run, its samples/s
  local cohort=$baseBin/cohort cohortrun=$baseBin/cohortrun
  if [ "$1" = current ]; then cohort=bazel-bin/cli/cohort cohortrun=bazel-bin/launcher/cohortrun; fi
  case $2 in
    local) "$cohort" train --mode local "${job[@]}" ;;
    hogwild) "$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode hogwild "${job[@]}" ;;
    allreduce) "$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm "${job[@]}" ;;
    replicas) "$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm --replicas "${job[@]}" ;;
    mpi) mpirun -np 2 "$cohort" train --mode allreduce --backend mpi "${job[@]}" ;;
  esac | field samples_per_s
}
echo "# base $rev vs current $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for mode in $MODES; do
    echo "$mode base $(runMode base "$mode")" >>"$work/raw"
    echo "$mode current $(runMode current "$mode")" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
for mode in dict.fromkeys(r[0] for r in rows):
    base = [float(r[2]) for r in rows if r[0] == mode and r[1] == "base"]
    cur = [float(r[2]) for r in rows if r[0] == mode and r[1] == "current"]
    b, c = statistics.median(base), statistics.median(cur)
    print(f"RESULT compare=commits mode={mode} base_samples_per_s={b:.0f} current_samples_per_s={c:.0f} "
          f"current_over_base={c / b:.3f} base_runs={' '.join(f'{v:.0f}' for v in base)} current_runs={' '.join(f'{v:.0f}' for v in cur)}")
PY
