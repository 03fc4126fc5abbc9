#!/usr/bin/env bash
# Small all-reduces of two builds side by side, in one run: what a collective costs besides moving
# its data (issue 33 pooled the Works). Per backend (BACKENDS, default "shm mpi"): 2 ranks, out of
# place, ordinary memory, 4 B to 1 KiB (1 to 256 floats, x4), ITERS timed all-reduces per size
# (default 20000), REPS interleaved repetitions (default 5; base, then current):
#   cohortrun --nproc-per-node 2 -- cohort bench allreduce --backend shm --min-bytes 4 --max-bytes 1K ...
#   mpirun -np 2 cohort bench allreduce --backend mpi ...
# Per backend and size: the medians over repetitions of time_us (one op between barriers) and of
# time_b2b_us (ops back to back: the per-call cost), and current/base (below 1: current is faster).
# BASE_BIN: a folder with the base side's `cohort` and `cohortrun` (e.g. copied from bazel-bin
# before a change); without it BASE (a commit, default HEAD) is built (bench/build_base.sh).
# CURRENT_BIN: the same for the other side; without it the working tree is built.
#
#   bench/compare_small_allreduce.sh
#   BASE=HEAD~1 REPS=9 BACKENDS=shm bench/compare_small_allreduce.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-5}
ITERS=${ITERS:-20000}
BACKENDS=${BACKENDS:-"shm mpi"}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
baseBin=${BASE_BIN:-$(bench/build_base.sh "${BASE:-HEAD}")}
currentBin=${CURRENT_BIN:-}
if [ -z "$currentBin" ]; then
  bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
  out=$(bazel info bazel-bin 2>/dev/null)
  currentBin=$work/current
  mkdir "$currentBin"
  ln -s "$out/cli/cohort" "$out/launcher/cohortrun" "$currentBin/"
fi

flags=(bench allreduce --min-bytes 4 --max-bytes 1K --step-factor 4 --iters "$ITERS" --buffers user)
runSide() {  # side, folder, backend: one run's RESULT lines as "backend side bytes time b2b"
  case $3 in
    mpi) mpirun -np 2 "$2/cohort" "${flags[@]}" --backend mpi ;;
    *) "$2/cohortrun" --nproc-per-node 2 -- "$2/cohort" "${flags[@]}" --backend "$3" ;;
  esac | sed -nE "s/.*RESULT .* bytes=([0-9]+) time_us=([0-9.]+) .* time_b2b_us=([0-9.]+) .*/$3 $1 \1 \2 \3/p"
}
echo "# base $baseBin vs current $currentBin   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for backend in $BACKENDS; do
    runSide base "$baseBin" "$backend" >>"$work/raw"
    runSide current "$currentBin" "$backend" >>"$work/raw"
  done
done
/usr/bin/python3 - "$work/raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 5]
def median(backend, side, size, column):
    return statistics.median(float(r[column]) for r in rows if r[0] == backend and r[1] == side and r[2] == size)
print(f"{'backend':8} {'bytes':>6} {'time base':>10} {'current':>8} {'ratio':>6} {'b2b base':>9} {'current':>8} {'ratio':>6}  (us)")
for backend in dict.fromkeys(r[0] for r in rows):
    for size in dict.fromkeys(r[2] for r in rows if r[0] == backend):
        t = [median(backend, side, size, 3) for side in ("base", "current")]
        b = [median(backend, side, size, 4) for side in ("base", "current")]
        print(f"{backend:8} {size:>6} {t[0]:10.3f} {t[1]:8.3f} {t[1] / t[0]:6.3f} {b[0]:9.3f} {b[1]:8.3f} {b[1] / b[0]:6.3f}")
        print(f"RESULT compare=small_allreduce backend={backend} bytes={size} base_time_us={t[0]:.3f} "
              f"current_time_us={t[1]:.3f} time_ratio={t[1] / t[0]:.3f} base_b2b_us={b[0]:.3f} "
              f"current_b2b_us={b[1]:.3f} b2b_ratio={b[1] / b[0]:.3f}")
PY
