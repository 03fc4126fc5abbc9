#!/usr/bin/env bash
# Side by side, in one run: Cohort's `cohort bench allreduce` (shm backend, NP ranks under cohortrun),
# on buffers from Communicator::allocateBuffer (`shared`: the direct path) and on ordinary memory
# (`user`: the staged path), against Open MPI's MPI_Allreduce (the peer program w1_allreduce_mpi.cpp in ../shared/bench-peers,
# compiled into a temporary directory, not copied), float32 sum, out of place, the same sizes and the
# same iteration schedule (200 iterations up to 64 KiB, 50 up to 1 MiB, else 20; the per-op time is
# the slowest rank's, median over iterations). REPS interleaved repetitions; per size the median
# busbw of each and the ratios cohort / mpi.
#
#   bench/compare_allreduce_peers.sh                       # REPS=3, NP=2, 4K..256M
#   REPS=5 MAX_BYTES=16M bench/compare_allreduce_peers.sh
#
# Needs: Open MPI (mpicxx, mpirun) and `bazel build //cli:cohort //launcher:cohortrun`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
NP=${NP:-2}
MIN_BYTES=${MIN_BYTES:-4K}
MAX_BYTES=${MAX_BYTES:-256M}
STEP_FACTOR=${STEP_FACTOR:-4}
PEERS=${PEERS:-../shared/bench-peers}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

cohort=bazel-bin/cli/cohort
cohortrun=bazel-bin/launcher/cohortrun
[ -x "$cohort" ] && [ -x "$cohortrun" ] || bazel build //cli:cohort //launcher:cohortrun
mpicxx -O3 -std=c++17 -o "$work/w1_allreduce_mpi" "$PEERS/w1_allreduce_mpi.cpp"
if [ "$(id -u)" = 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi

# Our sweep's sizes in bytes (K/M/G = 2^10/2^20/2^30, as cohort reads them), handed to the peer so
# both measure the same rows.
sizes=$(/usr/bin/python3 bench/byte_sizes.py "$MIN_BYTES" "$MAX_BYTES" "$STEP_FACTOR")

echo "# NP=$NP sizes=$sizes   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  for buffers in shared user; do
    "$cohortrun" --nproc-per-node "$NP" -- "$cohort" bench allreduce --backend shm --buffers "$buffers" \
        --min-bytes "$MIN_BYTES" --max-bytes "$MAX_BYTES" --step-factor "$STEP_FACTOR" |
      sed -nE "s/.*RESULT bench=allreduce .* bytes=([0-9]+) time_us=([0-9.]+) .* busbw_gbps=([0-9.]+) wrong=([0-9]+).*/$buffers \1 \2 \3 \4/p" \
        >>"$work/raw"
  done
  mpirun -np "$NP" "$work/w1_allreduce_mpi" --sizes "$sizes" >"$work/mpi.out"
  /usr/bin/python3 - "$work/mpi.out" >>"$work/raw" <<'PY'
import re, sys
rows = {}
for line in open(sys.argv[1]):
    m = re.search(r"name=W1\.mpi\.\S*\.b(\d+)\.(time|busbw) value=([0-9.]+).*check=(\S+)", line)
    if m:
        rows.setdefault(m[1], {})[m[2]] = m[3]
        rows[m[1]]["wrong"] = "0" if m[4] == "ok" else "1"
for b, r in rows.items():
    print("mpi", b, r["time"], r["busbw"], r["wrong"])
PY
done
/usr/bin/python3 - "$work/raw" "$NP" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
sizes = sorted({int(r[1]) for r in rows})
def runs(peer, b, col):
    return [float(r[col]) for r in rows if r[0] == peer and int(r[1]) == b]
def med(peer, b, col):
    v = runs(peer, b, col)
    return statistics.median(v) if v else float("nan")
print("busbw GB/s, median of the runs; shared = cohort on allocateBuffer memory, user = cohort on ordinary memory")
print(f"{'bytes':>10} {'shared':>8} {'user':>8} {'mpi':>8} {'shared/mpi':>11} {'user/mpi':>9}   "
      f"{'shared us':>10} {'user us':>10} {'mpi us':>10}   runs shared | user | mpi")
for b in sizes:
    s, u, m = (med(p, b, 3) for p in ("shared", "user", "mpi"))
    wrong = int(sum(sum(runs(p, b, 4)) for p in ("shared", "user", "mpi")))
    print(f"{b:>10} {s:>8.3f} {u:>8.3f} {m:>8.3f} {s / m:>11.2f} {u / m:>9.2f}   "
          f"{med('shared', b, 2):>10.2f} {med('user', b, 2):>10.2f} {med('mpi', b, 2):>10.2f}   "
          + " | ".join(" ".join(f"{v:.2f}" for v in runs(p, b, 3)) for p in ("shared", "user", "mpi"))
          + (f"  WRONG={wrong}" if wrong else ""))
for b in sizes:
    s, u, m = (med(p, b, 3) for p in ("shared", "user", "mpi"))
    print(f"RESULT compare=allreduce np={sys.argv[2]} bytes={b} cohort_shared_busbw_gbps={s:.4f} "
          f"cohort_user_busbw_gbps={u:.4f} mpi_busbw_gbps={m:.4f} shared_over_mpi={s / m:.2f} user_over_mpi={u / m:.2f}")
PY
