#!/usr/bin/env bash
# What ZeRO's sharding costs in step rate (issue 46, "Speed": stage 1 >= 0.98x, stage 2 >= 0.95x and
# stage 3 >= 0.85x of stage 0's on the CPU with 2 workers and replicas, and what stage 3's prefetch
# buys): `cohort bench train --mode allreduce` under cohortrun for each side of SIDES in turn (a
# stage, `3-noprefetch` for stage 3 without its prefetch), REPS interleaved rounds, each run its own
# job of WORKERS workers over shm, 1 BLAS thread each, the GPT of MODEL, AdamW; per side the median
# step time over the rounds and its rate against the first side's (its steps/s over the first's).
#
#   REPS=5 bench/compare_zero.sh
#   MODEL=gpt:layers=6,heads=6,dim=384,ctx=64 SIDES="0 3 3-noprefetch" bench/compare_zero.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
SIDES=${SIDES:-"0 1 2 3 3-noprefetch"}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-gpt:layers=4,heads=4,dim=256,ctx=64}
BATCH=${BATCH:-8}
SAMPLES=${SAMPLES:-160}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
cohort=bazel-bin/cli/cohort cohortrun=bazel-bin/launcher/cohortrun
echo "# ZeRO sides ${SIDES} on ${WORKERS} workers, ${MODEL}, batch ${BATCH}   $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)   cpu: $(sed -nE 's/^model name\s*: //p' /proc/cpuinfo | head -1)"
for rep in $(seq 1 "$REPS"); do
  for side in $SIDES; do
    zero=${side%%-*}
    prefetch=on
    [ "$side" = "${zero}-noprefetch" ] && prefetch=off
    ms=$("$cohortrun" --nproc-per-node "$WORKERS" -- "$cohort" bench train --mode allreduce --zero "$zero" \
      --prefetch "$prefetch" --overlap on --model "$MODEL" --batch-size "$BATCH" --samples "$SAMPLES" --repeats 1 --threads 1 |
      sed -nE 's/.*RESULT bench=train_allreduce .* step_ms=([0-9.]+).*/\1/p')
    [ -n "$ms" ] || { echo "side $side gave no RESULT line" >&2; exit 1; }
    echo "$side $ms" >>"$work/raw"
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
    print(f"RESULT compare=zero model={sys.argv[2]} workers={sys.argv[3]} side={z} step_ms={med[z]:.2f} "
          f"rate_over_zero{stages[0]}={rate:.3f} runs={runs}")
PY
