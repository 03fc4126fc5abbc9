// `cohort bench allreduce`: all-reduce latency and bandwidth per message size, in the manner of
// nccl-tests (bench/README.md); with --collectives also reduce-scatter and all-gather, with --dtypes
// in bf16 too (bench/collective_case.h: their sizes are the full buffer, busbw = algbw·(n−1)/n,
// in place is NCCL's layout), one table per collective and element type. Every rank of the job
// (runtime::WorldInfo::detect(): cohortrun, mpirun, srun) runs it; run it as
//   cohortrun --nproc-per-node 2 -- cohort bench allreduce --backend shm
//   mpirun -np 2 cohort bench allreduce --backend mpi
//   cohortrun --nproc-per-node 8 -- cohort bench allreduce --backend nccl   (one rank per GPU)
//
// Per size (min-bytes, ×step-factor, …, ≤ max-bytes) every rank fills its float32 input with exactly
// predictable values (element i of rank r is (r + 1)·(i mod 13 + 1), so sums, maxima and minima are
// small integers), runs `warmup` untimed all-reduces, then `iters` timed ones, each
// `barrier; t0; allReduce; wait; t1`. An iteration's time is the maximum over ranks (gathered with an
// all-reduce after the timed loop); the reported time is the median over iterations. `time_b2b` is
// one barrier then `iters` all-reduces back to back, the slowest rank's elapsed time / iters.
// algbw = bytes / time and busbw = algbw · 2(n−1)/n (n ranks; GB = 1e9 bytes), as nccl-tests'
// doc/PERFORMANCE.md defines them. After timing, the input is filled again, the output cleared and
// one more all-reduce is checked element by element: `wrong` counts mismatching elements over all
// ranks (for out of place, also input elements the operation changed).
//
// Rank 0 prints, for people, `#` setup lines and a table laid out like nccl-tests' (`#` header lines;
// one row per size as it finishes: size (B), count (elements), type, redop, then under "out-of-place"
// or "in-place" time (us), algbw (GB/s), busbw (GB/s), #wrong; `#` lines with the total of wrong
// elements and the mean busbw), then, for scripts, one line per size (bench/README.md):
//   RESULT bench=allreduce backend=shm ranks=2 bytes=4096 time_us=.. algbw_gbps=.. busbw_gbps=.. wrong=0
//          time_b2b_us=.. time_min_us=.. time_max_us=.. op=sum inplace=0 buffers=shared iters=200 warmup=5
//          collective=allreduce dtype=fp32
// and, with --json, the same rows as a JSON file. Scripts read the RESULT lines (or the JSON), never
// the table, whose layout is for reading. The two buffers are allocated once at the largest
// size (64-byte aligned) and written before any timing, so no page faults land in a timed region.
// They come from Communicator::allocateBuffer (`--buffers shared`, the default: memory every local
// rank maps, which the shm backend reduces in place of staging copies) or from the heap
// (`--buffers user`: what MPI_Allreduce and the staged shm path see).
// With `--backend nccl` the buffers are device memory on cuda:<local rank> (allocateBuffer or
// cudaMalloc; device_bench_memory.h): the inputs are copied from the same host patterns before each
// size and the results copied back for the check, outside the timed regions; each timed all-reduce's
// wait() blocks until the GPU has finished it (no compute stream), so the time includes that sync.
// Every rank must run it with the same flags (the collectives' fingerprints check that they agree).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::bench {

struct AllReduceBenchOptions {
  std::string backend;  // "shm", "mpi", "nccl"; empty: the default for this world (docs/collectives.md)
  size_t minBytes = size_t{4} << 10;
  size_t maxBytes = size_t{256} << 20;
  int stepFactor = 4;
  int iters = 0;           // timed iterations per size; 0: by size (200 ≤ 64 KiB, 50 ≤ 1 MiB, else 20)
  int warmup = -1;         // untimed iterations per size; -1: by size (5, or 2 from 256 MiB)
  std::string op = "sum";  // sum | avg | max | min
  bool inPlace = false;
  // What to time, each collective in each element type (collective_case.h): allreduce,
  // reducescatter, allgather; fp32, bf16.
  std::vector<std::string> collectives = {"allreduce"};
  std::vector<std::string> dtypes = {"fp32"};
  std::string buffers = "shared";  // "shared": Communicator::allocateBuffer; "user": ordinary memory
  std::string jsonPath;            // also write the rows here (rank 0); empty: no file
  double timeoutSeconds = 120;     // for the rendezvous and every wait
};

// "4096", "4K", "16k", "256M", "1G", "64KiB": bytes (K = 1024). Throws InvalidArgument.
size_t parseByteSize(const std::string& text);

void addAllReduceBenchFlags(CLI::App& command, AllReduceBenchOptions& options);
// Returns the process exit code: 0, or 1 (ExitCode::kInternal) when any result was wrong.
// Throws InvalidArgument for bad options; TimeoutError / PeerError from the communicator.
int runAllReduceBench(const AllReduceBenchOptions& options);

}  // namespace cohort::bench
