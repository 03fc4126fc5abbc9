#!/usr/bin/env bash
# Side by side, in one run: 2 workers × 1 thread on the MLP workload (784-512-256-10, batch 64 per
# worker, SGD lr 0.05, momentum 0.9, synthetic data, one epoch split over the workers):
#   cohort   one worker (--mode local); `cohortrun --nproc-per-node 2 cohort train --mode hogwild`;
#            `--mode allreduce` over shm (cohortrun; one shared copy with a sharded update, and with
#            --replicas the bucketed gradient all-reduce) and over Open MPI (mpirun)
#   PyTorch  torch.multiprocessing Hogwild and DDP with Gloo, 2 processes
#            (../shared/bench-peers/mlp_torch.py, run from there, not copied), OpenBLAS (OpenMP build)
# REPS interleaved repetitions; medians of job throughput and test accuracy; the ratios the issues
# ask for (2 workers over 1, cohort over PyTorch).
#
# WORKLOAD=cnn runs the same on the rosetta CNN of issue 6 (cnn:rosetta, batch 64, SGD lr 0.01
# momentum 0.9, one epoch of synthetic-cifar:5000); the PyTorch peers have no multi-process CNN
# script, so only the scaling over one worker is reported there.
#
#   bench/compare_workers_peers.sh                 # REPS=3, both modes
#   MODES=hogwild REPS=5 bench/compare_workers_peers.sh
#   WORKLOAD=cnn REPS=2 bench/compare_workers_peers.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
MODES=${MODES:-"hogwild allreduce"}
PEERS=${PEERS:-../shared/bench-peers}
OPENMP_BLAS=/usr/lib/x86_64-linux-gnu/openblas-openmp
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bazel build //cli:cohort //launcher:cohortrun >/dev/null 2>&1
cohort=bazel-bin/cli/cohort
cohortrun=bazel-bin/launcher/cohortrun
WORKLOAD=${WORKLOAD:-mlp}
case $WORKLOAD in
  mlp) job=(--data synthetic --model mlp:784,512,256,10 --epochs 1 --batch-size 64 --lr 0.05 --momentum 0.9 --threads 1) ;;
  cnn) job=(--data synthetic-cifar:5000 --model cnn:rosetta --epochs 1 --batch-size 64 --lr 0.01 --momentum 0.9 --threads 1) ;;
  *) echo "WORKLOAD must be mlp or cnn, got $WORKLOAD" >&2; exit 2 ;;
esac
field() { sed -nE "s/.*RESULT .*$1=([0-9.]+).*/\1/p"; }
torch() { sed -nE "s/.*name=[^ ]*blas\.$1 value=([0-9.]+).*/\1/p"; }
record() {  # name, output of a cohort run
  echo "$1 $(field samples_per_s <<<"$2") $(field test_acc <<<"$2")" >>"$work/raw"
}
recordTorch() {
  echo "$1 $(torch samples_per_s <<<"$2") $(torch test_acc <<<"$2")" >>"$work/raw"
}

echo "# workload $WORKLOAD   OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-<unset>}   $(date -u +%FT%TZ)   load: $(cut -d' ' -f1-3 /proc/loadavg)"
for rep in $(seq 1 "$REPS"); do
  record cohort_w1 "$("$cohort" train --mode local "${job[@]}")"
  for mode in $MODES; do
    case $mode in
      hogwild)
        record cohort_hogwild_w2 "$("$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode hogwild "${job[@]}")"
        if [ "$WORKLOAD" = mlp ]; then
          recordTorch torch_hogwild_p2 "$(LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 "$PEERS/mlp_torch.py" --mode hogwild --procs 2 --momentum 0.9)"
        fi ;;
      allreduce)
        record cohort_allreduce_shm_w2 "$("$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm "${job[@]}")"
        record cohort_allreduce_shm_replicas_w2 "$("$cohortrun" --nproc-per-node 2 -- "$cohort" train --mode allreduce --backend shm --replicas "${job[@]}")"
        record cohort_allreduce_mpi_w2 "$(mpirun -np 2 "$cohort" train --mode allreduce --backend mpi "${job[@]}")"
        if [ "$WORKLOAD" = mlp ]; then
          recordTorch torch_ddp_gloo_p2 "$(LD_LIBRARY_PATH=$OPENMP_BLAS /usr/bin/python3 "$PEERS/mlp_torch.py" --mode ddp --procs 2)"
        fi ;;
    esac
  done
done
/usr/bin/python3 - "$work/raw" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) == 3]
names = list(dict.fromkeys(r[0] for r in rows))
med = {}
for name in names:
    sps = [float(r[1]) for r in rows if r[0] == name]
    acc = [float(r[2]) for r in rows if r[0] == name]
    med[name] = statistics.median(sps)
    print(f"{name:34s} samples_per_s median={med[name]:8.0f} runs={' '.join(f'{v:.0f}' for v in sps)}  "
          f"test_acc median={statistics.median(acc):.4f} runs={' '.join(f'{v:.4f}' for v in acc)}")
for ours, peer in (("cohort_hogwild_w2", "torch_hogwild_p2"), ("cohort_allreduce_shm_w2", "torch_ddp_gloo_p2"),
                   ("cohort_allreduce_shm_replicas_w2", "torch_ddp_gloo_p2"), ("cohort_allreduce_mpi_w2", "torch_ddp_gloo_p2")):
    if ours not in med:
        continue
    line = f"RESULT compare={ours} workers=2 samples_per_s={med[ours]:.0f} scaling_over_1_worker={med[ours] / med['cohort_w1']:.2f}"
    if peer in med:
        line += f" peer={peer} peer_samples_per_s={med[peer]:.0f} over_peer={med[ours] / med[peer]:.2f}"
    print(line)
PY
