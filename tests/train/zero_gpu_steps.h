// What the ZeRO tests on GPUs (zero_gpu_test.cc, zero_gpu_bf16_test.cc) share: one rank's token
// batches on its device and one step that clips and, at stages 1-3, asks for a deferred result on
// odd steps (the sharded placement steps synchronously; the result waits in settleStep()).
#pragma once

#include <utility>
#include <vector>

#include "runtime/cuda/gpu_context.h"
#include "runtime/tensor.h"
#include "tests/train/ranks.h"
#include "train/job.h"

namespace cohort::train::testing {

// The (inputs, targets) of every micro-batch of `steps` steps for `rank` ([2, 8] token ids below
// `vocab`, from tokenWindow: inputs a window's first 8 of each row, targets its last 8), copied to
// the device before any kernel runs (a copy to the GPU is a blocking cudaMemcpy that the compute
// stream does not order).
inline std::vector<std::pair<runtime::Tensor, runtime::Tensor>> gpuTokenBatches(int rank, int steps, int microBatches,
                                                                              int vocab,
                                                                              runtime::cuda::GpuContext& gpu) {
  std::vector<std::pair<runtime::Tensor, runtime::Tensor>> all;
  runtime::Tensor x = runtime::Tensor::zeros(runtime::Shape{2, 8}), y = runtime::Tensor::zeros(runtime::Shape{2, 8});
  for (int step = 0; step < steps; ++step) {
    for (int k = 0; k < microBatches; ++k) {
      const std::vector<float> ids = tokenWindow(rank, step, k, vocab);
      for (int i = 0; i < 16; ++i) {
        x.at(i) = ids[static_cast<size_t>(i / 8 * 9 + i % 8)];
        y.at(i) = ids[static_cast<size_t>(i / 8 * 9 + i % 8 + 1)];
      }
      all.emplace_back(x.clone(gpu.allocator()), y.clone(gpu.allocator()));
    }
  }
  return all;
}

// Step `step` of a job at ZeRO stage `zero`, clipping at 0.05: 0 when it applied and clipped, else
// a rank's exit code naming what failed (3, 4: a deferred result; 10 + step: not applied; 30 +
// step: it did not clip).
inline int clippedStep(Job& job, int zero, int step) {
  const bool deferred = zero > 0 && step % 2 == 1;
  StepResult r = job.step({.clipGradNorm = 0.05f, .deferResult = deferred});
  if (deferred) {
    if (!r.pending) return 3;
    const std::optional<StepResult> settled = job.settleStep();
    if (!settled) return 4;
    r = *settled;
  }
  if (!r.applied) return 10 + step;
  if (!(r.gradNorm > 0.05)) return 30 + step;  // it clips
  return 0;
}

}  // namespace cohort::train::testing
