"""PyTorch's training throughput on the GPT of `cohort train --model gpt:...` (bench/compare_gpt_peers.sh).

The model is tests/nn/torch/parity.py's nanoGPT-style GPT (imported, not copied): wte + wpe, pre-norm
blocks with the masked-softmax attention PyTorch 1.13 offers (no fused attention before 2.0), ln_f
and the tied head. Training as Cohort's recipe: AdamW (lr 3e-3, weight decay 0.01), batches of
windows of ctx + 1 bytes at random offsets of the text file, cross-entropy per token. With
--workers N: N processes under DistributedDataParallel over gloo on this machine, each with
--threads threads and --batch windows per step (the job's batch is N × batch, as Cohort's
allreduce). Prints one line: tokens/s of the job over --steps steps after --warmup steps.
"""
import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "nn", "torch"))
from parity import Gpt  # noqa: E402


def train(rank, args):
    torch.set_num_threads(args.threads)
    if args.workers > 1:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29517")
        dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    torch.manual_seed(0)
    data = torch.frombuffer(bytearray(open(args.data, "rb").read()), dtype=torch.uint8).long()
    model = Gpt(256, args.layers, args.heads, args.dim, args.ctx)
    if args.workers > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.warmup + args.steps):
        if step == args.warmup:
            if args.workers > 1:
                dist.barrier()
            start = time.perf_counter()
        ix = torch.randint(len(data) - args.ctx - 1, (args.batch,), generator=g)
        x = torch.stack([data[i:i + args.ctx] for i in ix])
        y = torch.stack([data[i + 1:i + 1 + args.ctx] for i in ix])
        loss = torch.nn.functional.cross_entropy(model(x).view(-1, 256), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if args.workers > 1:
        dist.barrier()
    seconds = time.perf_counter() - start
    if rank == 0:
        tokens = args.steps * args.batch * args.ctx * args.workers
        print(f"pytorch workers={args.workers} threads={args.threads} tokens_per_s={tokens / seconds:.0f} "
              f"loss={loss.item():.4f}", flush=True)
    if args.workers > 1:
        dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=1)
    args = p.parse_args()
    if args.workers > 1:
        mp.spawn(train, args=(args,), nprocs=args.workers)
    else:
        train(0, args)


if __name__ == "__main__":
    main()
