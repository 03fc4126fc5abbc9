// `cohort bench recompute`: what activation recompute (nn/recompute.h, GptOptions::recompute) saves
// and costs on the CPU, for one GPT shape (default GPT-2 small's: 12 layers, width 768, 12 heads,
// vocabulary 50257, at context 64 and batch 4) in the modes asked (none, selective, full), all in
// one process and one run.
//
// Bytes are measured, not computed: each mode's model is fresh, and its first training step is
// watched through the pass's unit listener, which reads the C library's count of heap bytes in use
// (glibc's mallinfo2: arena and mmap'd chunks, where every CPU tensor lives) at each event; what the
// blocks' forward added (from before the first block to after the last) is the blocks' activations,
// and what the whole forward added (embeddings, blocks, ln_f and the logits) the pass's. The
// formula of nn/gpt_memory.h is printed beside them. Time: after that first step, --steps rounds in
// which each mode takes one training step (forward, the loss, backward, an SGD update) in turn, so
// a load on the machine falls on every mode alike; the median per mode.
// Prints one line per mode, then the ratios to `none`:
//   RESULT bench=recompute mode=full model=… batch=4 threads=1 blocks_bytes=.. blocks_formula=..
//          forward_bytes=.. step_bytes=.. step_ms=.. min=.. max=..
//   RESULT bench=recompute_ratio mode=full blocks_fewer=.. forward_fewer=.. time_more=..
// (blocks_fewer: none's blocks_bytes over this mode's; time_more: this mode's step over none's − 1).
// Single-threaded caller; uses --threads BLAS threads.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace cohort::bench {

struct RecomputeBenchOptions {
  int64_t layers = 12;
  int64_t heads = 12;
  int64_t dim = 768;
  int64_t vocab = 50257;
  int64_t context = 64;
  int64_t batchSize = 4;
  int steps = 5;    // timed rounds, each a step of every mode
  int threads = 1;  // BLAS threads
  std::vector<std::string> modes = {"none", "selective", "full"};
};

void addRecomputeBenchFlags(CLI::App& command, RecomputeBenchOptions& options);
// InvalidArgument for a bad mode or shape.
int runRecomputeBench(const RecomputeBenchOptions& options);

}  // namespace cohort::bench
