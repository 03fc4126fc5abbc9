#!/usr/bin/env bash
# What ZeRO's sharding costs in step rate (issue 46, "Speed": stage 1 >= 0.98x and stage 2 >= 0.95x of
# stage 0's on the CPU with 2 workers and replicas): `cohort bench train --mode allreduce` under
# cohortrun at each of ZEROS in turn, REPS interleaved rounds (stage 0, 1, 2, then again), each run
# its own job of WORKERS workers over shm, 1 BLAS thread each, the GPT of MODEL, AdamW; per stage the
# median step time over the rounds and its rate against stage 0's (stage Z's steps/s over stage 0's).
#
#   REPS=5 bench/compare_zero.sh
#   MODEL=gpt:layers=6,heads=6,dim=384,ctx=64 ZEROS="0 1 2" bench/compare_zero.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
ZEROS=${ZEROS:-"0 1 2"}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-gpt:layers=4,heads=4,dim=256,ctx=64}
BATCH=${BATCH:-8}
SAMPLES=${SAMPLES:-160}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
cohort=bazel-bin/cli/cohort cohortrun=bazel-bin/launcher/cohortrun
echo "# ZeRO stages ${ZEROS} on ${WORKERS} workers, ${MODEL}, batch ${BATCH}   $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)   cpu: $(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
for rep in $(seq 1 "$REPS"); do
  for zero in $ZEROS; do
    ms=$("$cohortrun" --nproc-per-node "$WORKERS" -- "$cohort" bench train --mode allreduce --zero "$zero" \
      --overlap on --model "$MODEL" --batch-size "$BATCH" --samples "$SAMPLES" --repeats 1 --threads 1 |
      sed -nE 's/.*RESULT bench=train_allreduce .* step_ms=([0-9.]+).*/\1/p')
    [ -n "$ms" ] || { echo "stage $zero gave no RESULT line" >&2; exit 1; }
    echo "$zero $ms" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" "$MODEL" "$WORKERS" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
stages = list(dict.fromkeys(r[0] for r in rows))
med = {z: statistics.median(float(r[1]) for r in rows if r[0] == z) for z in stages}
for z in stages:
    runs = " ".join(r[1] for r in rows if r[0] == z)
    rate = med[stages[0]] / med[z]
    print(f"RESULT compare=zero model={sys.argv[2]} workers={sys.argv[3]} zero={z} step_ms={med[z]:.2f} "
          f"rate_over_zero{stages[0]}={rate:.3f} runs={runs}")
PY
