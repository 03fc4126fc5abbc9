#!/usr/bin/python3
"""Cost model of one synchronous data-parallel training step (docs/scaling.md, "Scale on paper").

    /usr/bin/python3 bench/scaling_model.py            # every table of docs/scaling.md
    /usr/bin/python3 bench/scaling_model.py check      # only the simulated-cluster check
    /usr/bin/python3 bench/scaling_model.py project    # only the projections

Standard library only. Sizes in bytes, times in seconds, bandwidths in bytes/s (GB = 1e9).
"""
import math, sys

# ---- Measured on the 2-vCPU development VM (AMD EPYC), 2026-11-24; docs/scaling.md, "Constants" ----
MLP = dict(name="mlp:784,512,256,10", samples_per_s=31_400)   # cohort train --threads 1, 200 steps (29.4k-32.9k)
MLP_BIG = dict(name="mlp:784,1024,1024,10", samples_per_s=7_450)  # same, 100 steps (7415, 7514)
CNN = dict(name="cnn:rosetta", samples_per_s=255)             # --data synthetic-cifar, 10 steps; 2,008,074 params
SHM_BUSBW = 4.8e9      # cohortrun --nproc-per-node 2 ... bench allreduce --backend shm, 16M-64M (4.78-4.82 GB/s)
ALPHA_SHM = 0.4e-6     # same bench at 4 bytes: 0.38 us per 2-rank shm all-reduce
# Simulated cluster (scripts/cluster, tbf 1gbit each way per node link):
LINK_SIM = 0.112e9     # B/s per node link and direction: the best any run of MEASURED got through a link (2x2:node
                       # mpi, 256 MiB: 2S per link in 1.5S/0.0842 GB/s); tbf allows ~0.119 GB/s of TCP payload
ALPHA_SIM = 85e-6      # s per message step: 4-byte flat mpi all-reduce over 2x2 took 339 us (binomial: 4 steps);
                       # 5.1 ms (1.3 ms a step) in a run under load 7, see docs/scaling.md
SIM_CORES = 2          # the whole cluster shares 2 cores
# bench/compare_hierarchical.sh RATE=1gbit REPS=2 ITERS=3 (/tmp/hier_bench.txt): busbw GB/s, hier and mpi
MEASURED = {  # (layout, MiB): (hier, mpi)
    ("2x2:slot", 16): (0.1406, 0.1517),
    ("2x2:slot", 64): (0.1419, 0.1476),
    ("2x2:slot", 256): (0.1484, 0.1504),
    ("2x2:node", 16): (0.1384, 0.0726),
    ("2x2:node", 64): (0.1389, 0.0837),
    ("2x2:node", 256): (0.1379, 0.0842),
    ("4x2:slot", 16): (0.1026, 0.1041),
    ("4x2:slot", 64): (0.1171, 0.1067),
    ("4x2:slot", 256): (0.1154, 0.1122),
    ("4x2:node", 16): (0.1092, 0.0624),
    ("4x2:node", 64): (0.1142, 0.0619),
    ("4x2:node", 256): (0.1146, 0.0656),
}
MEASURED_TRAIN = dict(hier=2386, mpi=2224)  # samples/s, 2x2:slot mlp:784,1024,1024,10 batch 64

# ---- Assumptions for the projection (not measured here) ----
ALPHA_NET = 5e-6       # s per dependent message step on a real fabric (MPI over InfiniBand/RoCE: 2-5 us)
LINKS = {"100G": 100e9 / 8, "400G": 400e9 / 8}  # one link per node, each way
WORKERS_PER_NODE = 8
NODES = [8, 16, 64, 256, 1024]
BATCH = 64             # per worker (weak scaling) for the CPU models
BWD_FRACTION = 2 / 3   # backward's share of a step's compute (backward ~ 2x forward FLOPs)
OVERLAP = True         # bucket all-reduces run during the rest of backward (GradSync); False: after it
BUCKET, FIRST_BUCKET = 25 << 20, 1 << 20  # GradSyncOptions defaults (train/placement/grad_sync.h)
SEG_BYTES, MAX_SEGS, FLAT_BYTES = 4 << 20, 64, 256 << 10  # hierarchical backend's constants
GPT_TFLOPS = 100e12    # sustained FLOP/s of one GPU worker (assumed: ~1/3 of A100 bf16 peak, ~1/10 of H100)
GPT_TOKENS, GPT_BATCH = 1024, 8  # tokens per sample, sequences per worker per step
GPT_INTRA = 100e9      # assumed intra-node all-reduce busbw for GPUs (NVLink class); CPU models use SHM_BUSBW


def mlp_modules(spec):  # backward order: (gradient bytes, backward weight)
    s = [int(x) for x in spec.split(":")[1].split(",")]
    return [(4 * (a * b + b), a * b) for a, b in zip(s[-2::-1], s[:0:-1])]


def rosetta_modules():  # fc1, fc0, conv3..conv0; weight = forward MACs per sample
    return [(4 * 5130, 5120), (4 * 1843712, 1843200), (4 * 90100, 100 * 13 * 13 * 900),
            (4 * 45100, 100 * 15 * 15 * 450), (4 * 22550, 50 * 30 * 30 * 450), (4 * 1400, 50 * 32 * 32 * 27)]


def gpt2_modules():  # 124M: LM head (tied to wte) first, 12 blocks, then wte+wpe, final at the end
    block = [(4 * 2360064, 2360064), (4 * 2362368, 2362368), (4 * 1536, 0), (4 * 590592, 590592),
             (4 * 1771776, 1771776), (4 * 1536, 0)]
    return [(4 * 1536, 0), (0, 38597376)] + block * 12 + [(4 * (38597376 + 786432), 0)]


def steps_cost(S, L, N, link, intra, alpha, whole, placement):
    """Recursive halving/doubling (whole=False: Rabenseifner; True: binomial reduce + bcast) over p=L*N."""
    p, t = L * N, 0.0
    for k in range(int(math.log2(p))):
        piece = S if whole else S / 2 ** (k + 1)
        cross = (2 ** k >= L) if placement == "slot" else (2 ** k < N)
        t += (alpha + L * piece / link) if cross and N > 1 else (ALPHA_SHM + piece / intra)
    return 2 * t


def allreduce(S, algo, L, N, link, intra, alpha, placement="slot"):
    p = L * N
    if p == 1 or S == 0:
        return 0.0
    if algo == "hier" and N > 1 and L > 1 and S > FLAT_BYTES:
        node = 2 * (L - 1) / L * S / intra + 2 * ALPHA_SHM
        net = 2 * (N - 1) / N * S / link + 2 * (N - 1) * alpha
        segs = min(MAX_SEGS, max(1, S // SEG_BYTES))
        return max(node, net) + min(node, net) / segs  # pipelined in segments
    if algo == "ring":
        streams = 0 if N == 1 else (1 if placement == "slot" else L)
        step = max(S / p * streams / link, S / p / intra) + (alpha if N > 1 else ALPHA_SHM)
        return 2 * (p - 1) * step
    # Open MPI 4.1 libnbc MPI_Iallreduce (out of place): binomial when p < 4 or < 64 KiB, else Rabenseifner
    return steps_cost(S, L, N, link, intra, alpha, p < 4 or S < 65536, placement)


def buckets(mods):  # GradSync: reverse module order, first bucket <= 1 MiB, others <= 25 MiB, no split
    out, cur, cap = [], 0, FIRST_BUCKET
    for i, (b, _) in enumerate(mods):
        if cur and cur + b > cap:
            out.append((cur, i)); cur, cap = 0, BUCKET
        cur += b
    return out + [(cur, len(mods))]


def step(mods, t_compute, algo, L, N, link, intra, alpha, placement="slot"):
    """Step time: compute, then the all-reduce time not hidden behind the rest of backward."""
    t_bwd, total_w = BWD_FRACTION * t_compute, sum(w for _, w in mods) or 1
    t, done_w = 0.0, [0]
    for _, w in mods:
        done_w.append(done_w[-1] + w)
    for size, end in buckets(mods):
        ready = t_bwd * done_w[end] / total_w if OVERLAP else t_bwd
        t = max(t, ready) + allreduce(size, algo, L, N, link, intra, alpha, placement)
    return t_compute - t_bwd + max(t, t_bwd)


def check():
    print(f"## Simulated cluster, 1gbit links: predicted vs measured busbw (GB/s), link {LINK_SIM / 1e9:.4f} GB/s")
    print("| layout | size | flat mpi pred | meas | err | hier pred | meas | err |")
    print("|---|---|---|---|---|---|---|---|")
    for layout in ["2x2:slot", "2x2:node", "4x2:slot", "4x2:node"]:
        N, L, pl = int(layout[0]), int(layout[2]), layout.split(":")[1]
        for mib in (16, 64, 256):
            S, p, row = mib << 20, N * L, [f"| {layout} | {mib} MiB"]
            for i, algo in ((1, "flat"), (0, "hier")):
                bus = 2 * (p - 1) / p * S / allreduce(S, algo, L, N, LINK_SIM, SHM_BUSBW, ALPHA_SIM, pl) / 1e9
                m = MEASURED.get((layout, mib), (0, 0))[i]
                row.append(f"{bus:.3f} | {m:.3f} | {100 * (bus - m) / m:+.0f}%" if m else f"{bus:.3f} | - | -")
            print(" | ".join(row) + " |")
    mods, t = mlp_modules(MLP_BIG["name"]), 64 / MLP_BIG["samples_per_s"] * max(1, 4 / SIM_CORES)
    print(f"\n2x2:slot {MLP_BIG['name']} batch 64: compute {t * 1e3:.1f} ms/step (x{4 / SIM_CORES:.0f}: 4 ranks on "
          f"{SIM_CORES} cores), buckets {[b for b, _ in buckets(mods)]} B")
    for algo, key in (("hier", "hier"), ("flat", "mpi")):
        ts = step(mods, t, algo, 2, 2, LINK_SIM, SHM_BUSBW, ALPHA_SIM)
        m = MEASURED_TRAIN[key]
        err = f", error {100 * (4 * 64 / ts - m) / m:+.0f}%" if m else ""
        print(f"  {algo}: step {ts * 1e3:.1f} ms -> {4 * 64 / ts:.0f} samples/s predicted, {m} measured{err}")


def project():
    models = [(MLP["name"], mlp_modules(MLP["name"]), BATCH / MLP["samples_per_s"], SHM_BUSBW),
              (CNN["name"], rosetta_modules(), BATCH / CNN["samples_per_s"], SHM_BUSBW),
              ("gpt2-124M (assumed GPU)", gpt2_modules(), GPT_BATCH * 6 * 124.4e6 * GPT_TOKENS / GPT_TFLOPS, GPT_INTRA)]
    for name, mods, tc, intra in models:
        S = sum(b for b, _ in mods)
        print(f"\n## {name}: gradient {S / 1e6:.1f} MB, compute {tc * 1e3:.2f} ms per step per worker, "
              f"{WORKERS_PER_NODE} workers/node, intra-node {intra / 1e9:.1f} GB/s, alpha {ALPHA_NET * 1e6:.0f} us")
        print("| nodes | link | all-reduce ring / rhd / hier (ms) | step ring / rhd / hier (ms) | efficiency ring / rhd / hier |")
        print("|---|---|---|---|---|")
        for link_name, link in LINKS.items():
            for N in NODES:
                a = [allreduce(S, x, WORKERS_PER_NODE, N, link, intra, ALPHA_NET) for x in ("ring", "flat", "hier")]
                s = [step(mods, tc, x, WORKERS_PER_NODE, N, link, intra, ALPHA_NET) for x in ("ring", "flat", "hier")]
                print(f"| {N} | {link_name} | " + " / ".join(f"{x * 1e3:.2f}" for x in a) + " | "
                      + " / ".join(f"{x * 1e3:.1f}" for x in s) + " | " + " / ".join(f"{tc / x:.0%}" for x in s) + " |")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("all", "check"):
        check()
    if what in ("all", "project"):
        project()
