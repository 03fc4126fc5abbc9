// The pieces the fused attention's kernel files share (internal to runtime/cuda/): the shape as the
// kernels see it, the head-size buckets, and the bf16 forward on tensor cores (attention_mma.cu),
// which attentionForward (attention_kernels.cu) launches for bf16 data (the bf16 backward:
// attention_mma_backward.h).
// Conventions are attention_kernels.h's; the launches enqueue on `stream` and check nothing more.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace cohort::runtime::cuda::attention {

// What every kernel needs of the shape (ints: T, D and H of a model fit easily).
struct Geometry {
  int time, heads, headSize, dim;
  float scale;
};

// launch(std::integral_constant<int, kHd>{}) with the bucket kHd of the head size.
template <class Launch>
void forBucket(int headSize, Launch launch) {
  if (headSize <= 32) {
    launch(std::integral_constant<int, 32>{});
  } else if (headSize <= 64) {
    launch(std::integral_constant<int, 64>{});
  } else {
    launch(std::integral_constant<int, 128>{});
  }
}

// The bf16 forward: y and L from qkv (all [B, ...] as attentionForward's, bf16 data).
void forwardMma(const void* qkv, void* y, float* lse, const Geometry& g, int64_t batch, cudaStream_t stream);

}  // namespace cohort::runtime::cuda::attention
