#include "nn/gpt_memory.h"

namespace cohort::nn {

GptActivationBytes gptActivationBytes(const GptOptions& gpt, const GptActivationOptions& pass) {
  const double f = sizeof(float);
  const double t = static_cast<double>(pass.context > 0 ? pass.context : gpt.context);
  const double nd = static_cast<double>(pass.batch) * t * static_cast<double>(gpt.dim) * f;
  const double s = pass.onGpu ? 0.0 : static_cast<double>(pass.batch) * static_cast<double>(gpt.heads) * t * t * f;
  const double layers = static_cast<double>(gpt.layers);
  const double forward = (pass.onGpu ? 18.0 : 22.0) * nd + s;   // one block's forward buffers
  const double backward = (pass.onGpu ? 19.0 : 23.0) * nd + s;  // one set for all blocks
  // What selective shares: the LayerNorms' outputs and both output projections' (4·ND), on the CPU
  // also GELU's (4·ND), P, c_attn's output (3·ND) and y per head (1·ND).
  const double recomputed = pass.onGpu ? 4.0 * nd : 12.0 * nd + s;
  GptActivationBytes b;
  b.model = 6.0 * nd;
  b.blocksBackward = backward;
  switch (gpt.recompute) {
    case RecomputeMode::kNone:
      b.blocksKept = layers * forward;
      b.attention = layers * s + s;
      break;
    case RecomputeMode::kSelective:
      b.blocksKept = layers * (forward - recomputed);
      b.blocksRecompute = recomputed;
      b.attention = 2.0 * s;
      break;
    case RecomputeMode::kFull:
      b.blocksKept = layers * nd;
      b.blocksRecompute = forward - nd;
      b.attention = 2.0 * s;
      break;
  }
  return b;
}

}  // namespace cohort::nn
