// What a `cohort train` run will need at least, said before anything large is allocated (issue 33,
// item 20): `--model gpt:…,vocab=1000000` on byte text used to allocate 18 GB without a word.
//
// The estimate per worker is a floor, not a forecast: what the rank holds of the model's state at
// the run's --zero stage over its shard group (train/zero_memory.h: parameters, gradients, the
// optimizer's state and the sharded placement's temporary buffers; ZeRO's Figure 1 in
// docs/sharding.md, "Memory per rank"), and for a language model the logits of one step and their
// gradient (batch × context × vocabulary floats each, where the model spends most of its activation
// memory once the vocabulary is large; on a GPU a GPT's loss writes the gradient over the logits, which
// are bf16 in a bf16 pass: one buffer of the logits' type), and for a GPT the activations its backward keeps at its
// recompute mode and the gradients beside them (nn/gpt_memory.h: about 22 × batch × context × width
// floats per block without recompute, 1 with --recompute full, and on the CPU attention's
// probabilities, batch × heads × context² floats per block: the largest at long contexts; issues
// 44, item 16, and 46, items 2 and 4). Other models' activations come on top. On a GPU it counts the
// device scratch held beside the tensors (runtime/gpu_scratch.h): cuBLASLt's workspace (32 MiB on
// sm_90 and later, 4 MiB before) and, for a GPT in bf16, the attention backward's dS scratch once
// (one block for all layers; 102 MiB at GPT-2 124M's batch 8); the step guard's sums (under 9 KiB)
// are not counted. With --memory-report rank 0 prints the estimate by kind before anything is
// allocated, the workspaces named ("GPU workspaces X (the attention backward's dS scratch Y,
// cuBLASLt's workspace Z)").
//
// On the CPU a floor beyond what the node's workers can have (runtime::memoryHeadroom: the least of
// MemAvailable and what the cgroup limits of this process leave, shared by its local workers; a
// test sets the limit with COHORT_TEST_MEMORY_AVAILABLE, cli/test_hooks.h) is refused with
// OutOfMemory (exit 5) naming both and which limit applied. On a GPU the worker's floor (its
// device memory: the placement's peak there counts the whole gradients moved to the device too,
// train/zero_memory.h) is compared with what its device has free once the job's GPU context is
// made and before the model is placed (runtime::cudaMemory, cudaMemGetInfo; the emulated device
// reports COHORT_CUDASIM_MEMORY_MB), and a floor beyond it is refused with OutOfMemory (exit 5)
// naming the GPU, both figures and the same hint. Either refusal names the smallest change of
// --zero and --recompute that would fit: one flag before two, a ZeRO stage before a recompute mode
// (recompute costs a forward; stages 1 and 2 step within 3% of stage 0's rate on the CPU,
// docs/sharding.md), lower stages and modes first. A ZeRO stage is named only where one runs (mode
// allreduce over replicas, more than one rank in the shard group). A floor of 1 GiB
// or more is logged on rank 0. A language model whose
// vocabulary is larger than the ids its data can hold (256 for text:, 65536 for tokens:) gets a
// warning: those rows of wte and columns of the logits are never a target.
#pragma once

#include <cstddef>
#include <cstdint>

#include "runtime/dtype.h"

namespace cohort {
namespace nn {
struct Model;
struct OptimizerOptions;
}  // namespace nn
namespace runtime {
class Logger;
struct WorldInfo;
namespace data {
class Dataset;
}
}  // namespace runtime
}  // namespace cohort

namespace cohort::cli {

struct MemoryEstimateInputs {
  const nn::Model& model;
  const nn::OptimizerOptions& optimizer;  // the state it will keep per parameter
  const runtime::data::Dataset& data;
  int64_t batchSize = 0;  // per worker and micro-batch
  int64_t context = 0;    // a language model's (0: not one)
  bool onGpu = false;
  int device = 0;  // onGpu: the CUDA device's index (the job's)
  int zero = 0;                   // --zero
  int shardGroup = 1;             // W: train::shardGroupSize(world, --zero-scope)
  bool zeroRuns = false;          // whether another --zero stage could run here (see above)
  runtime::DType precision = runtime::DType::kF32;  // --precision (bf16: the gathers' buffers)
  bool report = false;            // --memory-report: rank 0 prints the estimate by kind
  size_t testAvailableBytes = 0;  // COHORT_TEST_MEMORY_AVAILABLE (0: the machine's limit)
};

void checkMemoryEstimate(const MemoryEstimateInputs& in, const runtime::WorldInfo& world, const runtime::Logger& log);

}  // namespace cohort::cli
