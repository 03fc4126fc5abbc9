#!/usr/bin/env bash
# Side by side, in one run: Cohort's `cohort bench allreduce` (shm backend, NP ranks under cohortrun)
# against Open MPI's MPI_Allreduce (the peer program w1_allreduce_mpi.cpp in ../shared/bench-peers,
# compiled into a temporary directory, not copied), float32 sum, out of place, the same sizes and the
# same iteration schedule (200 iterations up to 64 KiB, 50 up to 1 MiB, else 20; the per-op time is
# the slowest rank's, median over iterations). REPS interleaved repetitions; per size the median
# busbw of each and the ratio cohort / mpi.
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
sizes=$(/usr/bin/python3 - "$MIN_BYTES" "$MAX_BYTES" "$STEP_FACTOR" <<'PY'
import re, sys
def parse(s):
    m = re.fullmatch(r"(\d+)([KMG]?)(I?B)?", s.upper())
    return int(m[1]) << {"": 0, "K": 10, "M": 20, "G": 30}[m[2]]
b, top, f = parse(sys.argv[1]), parse(sys.argv[2]), int(sys.argv[3])
out = []
while b <= top:
    out.append(str(b))
    b *= f
print(",".join(out))
PY
)

echo "# NP=$NP sizes=$sizes   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  "$cohortrun" --nproc-per-node "$NP" -- "$cohort" bench allreduce --backend shm --min-bytes "$MIN_BYTES" \
      --max-bytes "$MAX_BYTES" --step-factor "$STEP_FACTOR" |
    sed -nE 's/.*RESULT bench=allreduce .* bytes=([0-9]+) time_us=([0-9.]+) .* busbw_gbps=([0-9.]+) wrong=([0-9]+).*/cohort \1 \2 \3 \4/p' \
      >>"$work/raw"
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
print(f"{'bytes':>10} {'cohort busbw':>13} {'mpi busbw':>10} {'ratio':>6}   {'cohort us':>10} {'mpi us':>10}   runs (GB/s) cohort | mpi")
for b in sizes:
    c, m = runs("cohort", b, 3), runs("mpi", b, 3)
    if not c or not m:
        print(f"{b:>10} missing: cohort {len(c)} runs, mpi {len(m)} runs")
        continue
    mc, mm = statistics.median(c), statistics.median(m)
    tc, tm = statistics.median(runs("cohort", b, 2)), statistics.median(runs("mpi", b, 2))
    wrong = int(sum(runs("cohort", b, 4)) + sum(runs("mpi", b, 4)))
    ratio = mc / mm if mm > 0 else float("nan")
    print(f"{b:>10} {mc:>13.3f} {mm:>10.3f} {ratio:>6.2f}   {tc:>10.2f} {tm:>10.2f}   "
          f"{' '.join(f'{v:.3f}' for v in c)} | {' '.join(f'{v:.3f}' for v in m)}" + (f"  WRONG={wrong}" if wrong else ""))
for b in sizes:
    c, m = runs("cohort", b, 3), runs("mpi", b, 3)
    if c and m:
        mc, mm = statistics.median(c), statistics.median(m)
        print(f"RESULT compare=allreduce np={sys.argv[2]} bytes={b} cohort_busbw_gbps={mc:.4f} mpi_busbw_gbps={mm:.4f} "
              f"cohort_over_mpi={mc / mm if mm > 0 else float('nan'):.2f}")
PY
