#!/usr/bin/env bash
# What an asynchronous sharded checkpoint costs training (issue 46, item 3: it should hold training
# for at most 10% of the synchronous write): bench/checkpoint_async_bench.cc under cohortrun, WORKERS
# workers over shm at ZeRO stage ZERO, MODEL (default 100.7M parameters), REPS interleaved rounds of
# a synchronous save and an asynchronous one (training goes on until it commits), checkpoints in a
# fresh directory under DIR (default /tmp: the disk, not tmpfs, on the development VM). Prints each
# round and the RESULT line of medians: sync_ms, async_blocked_ms, ratio, async_written_ms,
# steps_during_write, staging_mib per worker.
#
#   bench/compare_checkpoint_async.sh
#   WORKERS=1 ZERO=2 REPS=5 bench/compare_checkpoint_async.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
WORKERS=${WORKERS:-2}
ZERO=${ZERO:-1}
MODEL=${MODEL:-mlp:2048,8192,8192,2048}
work=$(mktemp -d "${DIR:-/tmp}/cohort-ckpt-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
bazel build //bench:checkpoint_async_bench //launcher:cohortrun >/dev/null 2>&1
echo "# sharded checkpoints, sync against async: ${WORKERS} workers, zero ${ZERO}, ${MODEL}   $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)   disk: $(df -h "$work" | awk 'NR==2 {print $1}')"
OMP_NUM_THREADS=1 bazel-bin/launcher/cohortrun --nproc-per-node "$WORKERS" -- bazel-bin/bench/checkpoint_async_bench \
  --model "$MODEL" --zero "$ZERO" --repeats "$REPS" --dir "$work"
