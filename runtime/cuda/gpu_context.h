// GpuContext: what the nn runtime needs to run on one GPU, made once per worker: the compute
// stream every kernel of a training step is enqueued on, the caching allocator every device buffer
// comes from (statistics for --memory-report), a cuBLAS handle bound to that stream, the transient
// workspace that kernels within one call borrow (workspace.h: one block for all layers, not one per
// call), and (when the build found cuDNN) a cuDNN handle on it, created at the first dnn() call so
// that models without convolutions never load cuDNN. Its GpuOptions (runtime/gpu_options.h) say how
// it runs what it runs: which convolution algorithms the layers may choose (ConvPolicy; dnn.h),
// whether GEMM algorithms are timed per shape (tuneGemms; gemm_tuner.h).
//
// Everything a step enqueues goes to the one compute stream, which is what makes the caching
// allocator's immediate reuse of freed blocks safe (caching_allocator.h, single-stream contract).
// Side streams (the data prefetcher's copy stream) hand work over with events.
// Ownership: owns them all; members are destroyed in reverse order (the workspace before the
// allocator, cuBLAS before the stream).
// Thread safety: as its members; one training thread uses it.
// Only built when CUDA is compiled in (COHORT_HAVE_CUDA).
//
//   cuda::GpuContext gpu(Device::cuda(localRank), {.conv = {.algorithms = ConvAlgorithms::kExact}});
//   Tensor y = Tensor::empty(Shape{64, 512}, gpu.allocator());
//   gpu.blas().gemm({...}, x, w, y.data());
#pragma once

#include <memory>

#include "runtime/cuda/caching_allocator.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/workspace.h"
#include "runtime/gpu_options.h"
#include "runtime/stream.h"

#ifdef COHORT_HAVE_CUDNN
#include "runtime/cuda/dnn.h"
#endif

namespace cohort::runtime::cuda {

class GpuContext {
 public:
  // Throws InvalidArgument for a non-CUDA device; cohort::Error when the device cannot be used.
  explicit GpuContext(Device device, const GpuOptions& options = {});
  GpuContext(const GpuContext&) = delete;
  GpuContext& operator=(const GpuContext&) = delete;

  Device device() const { return device_; }
  const GpuOptions& options() const { return options_; }
  const Stream& stream() const { return stream_; }
  CudaCachingAllocator& allocator() { return allocator_; }
  const Blas& blas() const { return blas_; }
  // Whether the Blas times cuBLASLt's candidates per product shape (GpuOptions::tuneGemms, else
  // COHORT_GEMM_TUNING, else on).
  bool tunesGemms() const { return tuneGemms_; }
  // The compute stream's transient workspace (workspace.h).
  Workspace& workspace() { return workspace_; }
#ifdef COHORT_HAVE_CUDNN
  // The cuDNN handle on the compute stream, created on first use.
  const Dnn& dnn() {
    if (!dnn_) dnn_ = std::make_unique<Dnn>(stream_);
    return *dnn_;
  }
#endif

 private:
  Device device_;
  GpuOptions options_;
  Stream stream_;
  CudaCachingAllocator allocator_;
  bool tuneGemms_;  // declared before the Blas, which is made with it
  Blas blas_;
  Workspace workspace_;  // declared after the allocator: its block goes back before the allocator ends
#ifdef COHORT_HAVE_CUDNN
  std::unique_ptr<Dnn> dnn_;  // declared after the stream: destroyed before it
#endif
};

// Host <-> device copies of `bytes` bytes, enqueued on `stream` (cudaMemcpyAsync). Pageable host
// memory makes the call return only once the copy has been staged; pinned memory is asynchronous.
void copyToDevice(void* dst, const void* src, size_t bytes, const Stream& stream);
void copyToHost(void* dst, const void* src, size_t bytes, const Stream& stream);
void copyOnDevice(void* dst, const void* src, size_t bytes, const Stream& stream);

}  // namespace cohort::runtime::cuda
