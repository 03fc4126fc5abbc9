// Helpers for the GPU paths of nn modules (internal to nn/): the GpuContext a pass on CUDA tensors
// needs, with a clear error when a caller forgot it or mixed devices.
#pragma once

#include "nn/module.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/kernels.h"
#endif

namespace cohort::nn {

// True when `t` lives on a GPU; throws InvalidArgument when CUDA is not compiled in (a CUDA tensor
// cannot exist then, so that is a caller bug surfacing early).
inline bool onGpu(const Tensor& t) { return t.device().isCuda(); }

#ifdef COHORT_HAVE_CUDA
// The pass's GpuContext for work on `t`'s device; throws InvalidArgument naming `who` when the pass
// has none or it is another device.
inline runtime::cuda::GpuContext& gpuFor(const Pass& pass, const Tensor& t, const std::string& who) {
  if (!pass.gpu) COHORT_THROW(InvalidArgument) << who << " got a tensor on " << t.device().str() << " but no GPU context";
  if (pass.gpu->device() != t.device()) {
    COHORT_THROW(InvalidArgument) << who << " got a tensor on " << t.device().str() << " but runs on "
                                  << pass.gpu->device().str();
  }
  return *pass.gpu;
}

// The same, naming `who` only when it throws: no string is built on the way (a layer calls this
// on every forward and backward).
inline runtime::cuda::GpuContext& gpuFor(const Pass& pass, const Tensor& t, const Module& who) {
  if (pass.gpu && pass.gpu->device() == t.device()) return *pass.gpu;
  return gpuFor(pass, t, who.name());
}
#endif

}  // namespace cohort::nn
