#!/usr/bin/env bash
# What a set of `cohort train` flags costs: the run with FLAGS side by side with the same run
# without them, in one run, on the MLP workload of compare_commits.sh (784-512-256-10, batch 64, SGD
# lr 0.05 momentum 0.9, synthetic data, one epoch split over the workers):
#   local                  cohort train --mode local
#   allreduce, 2 workers   cohortrun --nproc-per-node 2 -- cohort train --mode allreduce (shm: shared copy, sharded update)
#   replicas, 2 workers    cohortrun ... --mode allreduce --replicas
#   mpi, 2 workers         mpirun -np 2 ... --mode allreduce --backend mpi
# REPS interleaved repetitions (base, then with FLAGS, per mode); the median job throughput of each
# and the ratio with/base. `{work}` in FLAGS is a temporary directory (for files the flags write);
# SHOW names fields of the flagged side's last metrics line to print beside the figures.
#
#   FLAGS="--trace {work}/t.json" LABEL=trace MODES="local allreduce" REPS=5 bench/compare_flags.sh
#   bench/compare_clipping.sh, bench/compare_trace.sh: the ones issues 16 and 18 ask for
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
MODES=${MODES:-"local allreduce replicas mpi"}
LABEL=${LABEL:-flags}
SHOW=${SHOW:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
read -r -a flagged <<<"${FLAGS//\{work\}/$work}"
bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
cohort=bazel-bin/cli/cohort cohortrun=bazel-bin/launcher/cohortrun
job=(--data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9 --threads 1)
runMode() {  # side (base|flagged), mode: one run, its samples/s
  local extra=(--metrics "$work/$1-$2.jsonl")
  [ "$1" = flagged ] && extra+=("${flagged[@]}")
  case $2 in
    local) "$cohort" train --mode local "${job[@]}" "${extra[@]}" ;;
    allreduce) "$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm "${job[@]}" "${extra[@]}" ;;
    replicas) "$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm --replicas "${job[@]}" "${extra[@]}" ;;
    mpi) mpirun -np 2 "$cohort" train --mode allreduce --backend mpi "${job[@]}" "${extra[@]}" ;;
  esac | sed -nE 's/.*RESULT .*samples_per_s=([0-9.]+).*/\1/p'
}
echo "# base vs ${flagged[*]}   $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for mode in $MODES; do
    echo "$mode base $(runMode base "$mode")" >>"$work/raw"
    echo "$mode flagged $(runMode flagged "$mode")" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work" "$LABEL" "$SHOW" <<'PY'
import json, statistics, sys, os
work, label, show = sys.argv[1], sys.argv[2], sys.argv[3].split()
rows = [l.split() for l in open(os.path.join(work, "raw")) if len(l.split()) == 3]
for mode in dict.fromkeys(r[0] for r in rows):
    base = [float(r[2]) for r in rows if r[0] == mode and r[1] == "base"]
    flagged = [float(r[2]) for r in rows if r[0] == mode and r[1] == "flagged"]
    b, f = statistics.median(base), statistics.median(flagged)
    last = json.loads(open(os.path.join(work, f"flagged-{mode}.jsonl")).read().splitlines()[-1])
    shown = " ".join(f"{k}={last[k]:.3f}" for k in show if k in last)
    print(f"RESULT compare={label} mode={mode} base_samples_per_s={b:.0f} {label}_samples_per_s={f:.0f} "
          f"{label}_over_base={f / b:.3f} {shown} "
          f"base_runs={' '.join(f'{v:.0f}' for v in base)} {label}_runs={' '.join(f'{v:.0f}' for v in flagged)}")
PY
