#!/usr/bin/env bash
# Hierarchical all-reduce against flat MPI, side by side in one run on the simulated cluster
# (scripts/cluster, docs/cluster.md): per layout (nodes x workers per node, and how mpirun places
# the ranks), REPS interleaved repetitions of
#   hier   cohort bench allreduce --backend hierarchical   (shm in each node, MPI between nodes)
#   mpi    cohort bench allreduce --backend mpi            (flat MPI_Iallreduce over all ranks)
#   peer   Open MPI's blocking MPI_Allreduce over all ranks (../shared/bench-peers/w1_allreduce_mpi.cpp,
#          compiled into a temporary directory, not copied)
# float32 sum, out of place, the same sizes; per layout and size the median busbw of each and the
# ratios hier/mpi and hier/peer. Then, with TRAIN=1 (default), for each of TRAIN_LAYOUTS (default
# "2x2:slot 2x2:node"; two nodes), 2-node `cohort train` throughput
# (samples/s, an MLP whose gradient is 7 MiB) over hierarchical with one shared copy per node
# (--no-replicas), hierarchical with a replica per worker (the default), and flat mpi (replicas).
#   LAYOUTS=" " TRAIN_LAYOUTS=2x2:node bench/compare_hierarchical.sh   # training only
#
#   bench/compare_hierarchical.sh                         # REPS=3, rate 1gbit, 16M..256M
#   RATE=400mbit LAYOUTS="2x2:slot 2x2:node" REPS=5 bench/compare_hierarchical.sh
#
# LAYOUTS: NxL:slot (ranks 0..L-1 on node 0, ...: mpirun's default, SLURM's block distribution) or
# NxL:node (round robin over the nodes: --map-by node). Needs root (the cluster), Open MPI and
# `bazel build //cli:cohort`.
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
RATE=${RATE:-1gbit}
MIN_BYTES=${MIN_BYTES:-16M}
MAX_BYTES=${MAX_BYTES:-256M}
STEP_FACTOR=${STEP_FACTOR:-4}
ITERS=${ITERS:-5}
LAYOUTS=${LAYOUTS:-2x2:slot 2x2:node 4x2:slot 4x2:node}
TRAIN=${TRAIN:-1}
TRAIN_LAYOUTS=${TRAIN_LAYOUTS:-2x2:slot 2x2:node}
PEERS=${PEERS:-../shared/bench-peers}
export COHORT_CLUSTER_NAME=${COHORT_CLUSTER_NAME:-cbench}
# Inside a node /tmp is the node's own: the peer binary and results go where every node sees them.
work=$(mktemp -d /var/tmp/compare-hierarchical.XXXXXX)
trap 'scripts/cluster down >/dev/null 2>&1 || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

cohort=$PWD/bazel-bin/cli/cohort
[ -x "$cohort" ] || bazel build //cli:cohort
mpicxx -O3 -std=c++17 -o "$work/w1_allreduce_mpi" "$PEERS/w1_allreduce_mpi.cpp"
sizes=$(/usr/bin/python3 bench/byte_sizes.py "$MIN_BYTES" "$MAX_BYTES" "$STEP_FACTOR")

# mpirun's options for a layout: hosts, rank count, placement.
mpirun_for() {  # LAYOUT
  local nodes=${1%%x*} rest=${1#*x}
  local per=${rest%%:*} map=${rest#*:} hosts="" k
  for ((k = 0; k < nodes; k++)); do hosts+="${hosts:+,}cohort-node$k:$per"; done
  echo "mpirun --allow-run-as-root --oversubscribe --bind-to none --map-by $map --host $hosts -np $((nodes * per))"
}

echo "# rate=$RATE sizes=$sizes iters=$ITERS REPS=$REPS   $(date -u +%FT%TZ)   $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
for layout in $LAYOUTS; do
  nodes=${layout%%x*}
  run=$(mpirun_for "$layout")
  cat >"$work/sweep.sh" <<EOF
set -eo pipefail
for rep in \$(seq 1 $REPS); do
  for backend in hierarchical mpi; do
    $run $cohort bench allreduce --backend \$backend --min-bytes $MIN_BYTES --max-bytes $MAX_BYTES \
        --step-factor $STEP_FACTOR --iters $ITERS --warmup 1 --timeout 300 |
      sed -nE "s/.*RESULT bench=allreduce backend=([a-z]+) .* bytes=([0-9]+) time_us=([0-9.]+) .* busbw_gbps=([0-9.]+) wrong=([0-9]+).*/$layout \1 \2 \3 \4 \5/p"
  done
  $run $work/w1_allreduce_mpi --sizes $sizes --iters $ITERS |
    sed -nE "s/.*name=W1\.mpi\.\S*\.b([0-9]+)\.busbw value=([0-9.]+).*check=(\S+).*/$layout peer \1 0 \2 \3/p"
done
EOF
  scripts/cluster run "$nodes" --rate "$RATE" -- bash "$work/sweep.sh" >>"$work/raw" 2>"$work/err" ||
    { cat "$work/err" >&2; exit 1; }
done

if [ "$TRAIN" = 1 ]; then
  echo "set -eo pipefail" >"$work/train.sh"
  for layout in $TRAIN_LAYOUTS; do
    run=$(mpirun_for "$layout")
    cat >>"$work/train.sh" <<EOF
for rep in \$(seq 1 $REPS); do
  for variant in shared replicas mpi; do
    case \$variant in
      shared) flags="--backend hierarchical --no-replicas" ;;
      replicas) flags="--backend hierarchical --replicas" ;;
      mpi) flags="--backend mpi" ;;
    esac
    $run $cohort train --data synthetic --model mlp:784,1024,1024,10 --batch-size 64 --threads 1 \
        --mode allreduce \$flags --max-steps 60 --progress-every 0 --timeout 300 |
      sed -nE "s/.*RESULT .*samples_per_s=([0-9.]+).*/train:$layout \$variant 0 0 \1 0/p"
  done
done
EOF
  done
  scripts/cluster run 2 --rate "$RATE" -- bash "$work/train.sh" >>"$work/raw" 2>"$work/err" ||
    { cat "$work/err" >&2; exit 1; }
fi

/usr/bin/python3 - "$work/raw" "$RATE" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
def med(layout, peer, b):
    v = [float(r[4]) for r in rows if r[0] == layout and r[1] == peer and int(r[2]) == b]
    return (statistics.median(v) if v else float("nan")), v
layouts = [l for l in dict.fromkeys(r[0] for r in rows) if not l.startswith("train")]
print(f"busbw GB/s (median of the runs) at link rate {sys.argv[2]}; hier = hierarchical, mpi = flat MPI_Iallreduce "
      "(cohort --backend mpi), peer = flat blocking MPI_Allreduce")
print(f"{'layout':>9} {'bytes':>10} {'hier':>7} {'mpi':>7} {'peer':>7} {'hier/mpi':>9} {'hier/peer':>10}   runs hier | mpi | peer")
for layout in layouts:
    for b in sorted({int(r[2]) for r in rows if r[0] == layout}):
        (h, hv), (m, mv), (p, pv) = (med(layout, x, b) for x in ("hierarchical", "mpi", "peer"))
        wrong = sum(1 for r in rows if r[0] == layout and int(r[2]) == b and r[5] not in ("0", "ok"))
        print(f"{layout:>9} {b:>10} {h:>7.3f} {m:>7.3f} {p:>7.3f} {h / m:>9.2f} {h / p:>10.2f}   "
              + " | ".join(" ".join(f"{x:.3f}" for x in v) for v in (hv, mv, pv)) + (f"  WRONG={wrong}" if wrong else ""))
        print(f"RESULT compare=hierarchical layout={layout} rate={sys.argv[2]} bytes={b} hier_busbw_gbps={h:.4f} "
              f"mpi_busbw_gbps={m:.4f} peer_busbw_gbps={p:.4f} hier_over_mpi={h / m:.2f} hier_over_peer={h / p:.2f}")
variants = ("shared", "replicas", "mpi")
for layout in [l for l in dict.fromkeys(r[0] for r in rows) if l.startswith("train:")]:
    train = {k: [float(r[4]) for r in rows if r[0] == layout and r[1] == k] for k in variants}
    if not all(train.values()):
        continue
    s, h, m = (statistics.median(train[k]) for k in variants)
    name = layout.split(":", 1)[1]
    print(f"train {name} mlp:784,1024,1024,10 samples/s: hierarchical one copy per node {s:.0f}, hierarchical "
          f"replicas {h:.0f}, mpi {m:.0f}; ratios to mpi {s / m:.2f} {h / m:.2f}   runs "
          + " | ".join(" ".join(f"{x:.0f}" for x in train[k]) for k in variants))
    print(f"RESULT compare=hierarchical_train layout={name} rate={sys.argv[2]} shared_samples_per_s={s:.0f} "
          f"replicas_samples_per_s={h:.0f} mpi_samples_per_s={m:.0f} shared_over_mpi={s / m:.2f} "
          f"replicas_over_mpi={h / m:.2f}")
PY
