#!/usr/bin/env bash
# What each rank of a ZeRO job holds, per stage and world size (issue 46, item 4; docs/sharding.md,
# "Memory per rank"): `cohort bench memory` (bench/zero_memory_bench.h) under cohortrun, each stage
# of ZEROS on each world size of WORKERS its own job (a process's peak resident size only grows), one
# BLAS thread per rank, the GPT of MODEL (many small units, so that the temporary buffers are small
# next to N). Prints every rank's RESULT line, then per job the largest model_state_ratio and the
# spread of held_ratio and peak_ratio over its ranks; a stage the job refuses prints its one line.
# DEVICE=cuda: one GPU per rank, and the GPU caching allocator's bytes besides (device_ratio: what
# the placement holds over the formula's model state); CUDASIM=1 builds for the emulated device
# (cudasim, COHORT_CUDASIM_DEVICES GPUs; its own output base) where there is no GPU.
#
#   bench/zero_memory_bench.sh
#   WORKERS="2" ZEROS="1 2" MODEL=gpt:layers=24,heads=4,dim=256,ctx=64,vocab=256 bench/zero_memory_bench.sh
#   DEVICE=cuda CUDASIM=1 COHORT_CUDASIM_DEVICES=4 MODEL=gpt:layers=3,heads=2,dim=32,ctx=16,vocab=64 bench/zero_memory_bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-"2 4"}
ZEROS=${ZEROS:-"0 1 2 3"}
SCOPE=${SCOPE:-job}
MODEL=${MODEL:-gpt:layers=12,heads=4,dim=256,ctx=64,vocab=256}
DEVICE=${DEVICE:-cpu}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel_=(bazel)
if [ "${CUDASIM:-0}" = 1 ]; then
  # An output base per checkout (CUDASIM_OUTPUT_BASE names another), beside the default one.
  base=${CUDASIM_OUTPUT_BASE:-${XDG_CACHE_HOME:-$HOME/.cache}/cohort-cudasim-$(pwd | cksum | cut -d' ' -f1)}
  bazel_=(env COHORT_CUDASIM=1 bazel --output_base="$base")
fi
nice -n 10 "${bazel_[@]}" build --symlink_prefix=/ //cli:cohort //launcher:cohortrun >/dev/null 2>&1
bin=$("${bazel_[@]}" info bazel-bin 2>/dev/null)
cohort=$bin/cli/cohort cohortrun=$bin/launcher/cohortrun
echo "# ZeRO memory per rank, stages ${ZEROS} on ${WORKERS} workers, scope ${SCOPE}, ${MODEL}, device ${DEVICE}   $(git rev-parse --short HEAD)$(git diff --quiet || echo '+changes')   $(date -u +%FT%TZ)"
for w in $WORKERS; do
  for zero in $ZEROS; do
    "$cohortrun" --nproc-per-node "$w" -- "$cohort" bench memory --zero "$zero" --zero-scope "$SCOPE" \
      --model "$MODEL" --threads 1 --device "$DEVICE" | sed -nE 's/^(\[rank [0-9]+\] )?(RESULT bench=zero_memory .*)/\2/p' |
      tee -a "$work/lines"
  done
done
/usr/bin/python3 - "$work/lines" <<'PY'
import re, sys
jobs = {}
for line in open(sys.argv[1]):
    f = dict(re.findall(r" ([a-z_]+)=(\S+)", line))
    if f.get("status") == "refused":
        continue
    jobs.setdefault((int(f["world_size"]), int(f["zero"])), []).append(f)
for (w, z), ranks in sorted(jobs.items()):
    ms = max(float(r["model_state_ratio"]) for r in ranks)
    held = [float(r["held_ratio"]) for r in ranks]
    peak = [float(r["peak_ratio"]) for r in ranks]
    print(f"RESULT summary=zero_memory world_size={w} zero={z} model_state_bytes={ranks[0]['params']}+"
          f"{ranks[0]['grads']}+{ranks[0]['optimizer']} staging={ranks[0]['staging']} "
          f"formula_staging={ranks[0]['formula_staging']} max_model_state_ratio={ms:.4f} "
          f"held_ratio={min(held):.3f}..{max(held):.3f} peak_ratio={min(peak):.3f}..{max(peak):.3f}"
          + (f" max_device_ratio={max(float(r['device_ratio']) for r in ranks):.4f}" if "device_ratio" in ranks[0] else ""))
PY
