#!/usr/bin/env bash
# A user's own loop (examples/own_loop, over train::Job) against the Trainer (`cohort train`) on the
# same job, side by side in one run: the library adds nothing to a hand-written loop's step. MLP
# 784-512-256-10, batch 64 per worker, SGD lr 0.05 momentum 0.9, synthetic data, one epoch's worth
# of steps (937 alone, 468 per worker with 2), 1 thread per worker:
#   local                  one process
#   allreduce, 2 workers   cohortrun --nproc-per-node 2 (shm: shared copy, sharded update)
#   hogwild, 2 workers     cohortrun --nproc-per-node 2
# REPS interleaved repetitions; median samples/s (the job's) of each and own_loop/Trainer.
#
#   bench/compare_own_loop.sh                 # REPS=3
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel build //cli:cohort //launcher:cohortrun //examples/own_loop >/dev/null 2>&1
cohort=bazel-bin/cli/cohort cohortrun=bazel-bin/launcher/cohortrun own=bazel-bin/examples/own_loop/own_loop
field() { sed -nE "s/.*RESULT .*$1=([0-9.]+).*/\1/p"; }
common=(--model mlp:784,512,256,10 --lr 0.05 --momentum 0.9)
echo "# own_loop vs cohort train   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for mode in local allreduce hogwild; do
    if [ "$mode" = local ]; then launch=() steps=937; else launch=("$cohortrun" --nproc-per-node 2 --) steps=468; fi
    echo "$mode trainer $("${launch[@]}" "$cohort" train --mode "$mode" --data synthetic --epochs 1 --batch-size 64 \
      --threads 1 "${common[@]}" | field samples_per_s)" >>"$work/raw"
    echo "$mode own_loop $("${launch[@]}" "$own" --mode "$mode" --batch 64 --steps "$steps" "${common[@]}" \
      | field samples_per_s)" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
for mode in dict.fromkeys(r[0] for r in rows):
    t = [float(r[2]) for r in rows if r[0] == mode and r[1] == "trainer"]
    o = [float(r[2]) for r in rows if r[0] == mode and r[1] == "own_loop"]
    print(f"RESULT compare=own_loop mode={mode} trainer_samples_per_s={statistics.median(t):.0f} "
          f"own_loop_samples_per_s={statistics.median(o):.0f} own_over_trainer={statistics.median(o) / statistics.median(t):.3f} "
          f"trainer_runs={' '.join(f'{v:.0f}' for v in t)} own_runs={' '.join(f'{v:.0f}' for v in o)}")
PY
