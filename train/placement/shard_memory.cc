#include "train/placement/shard_memory.h"

#include <algorithm>
#include <cstring>

#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/gpu_context.h"
#include "runtime/cuda/wire_kernels.h"
#endif

namespace cohort::train {

namespace {

runtime::Shape shapeOf(size_t floats) { return runtime::Shape{static_cast<int64_t>(floats)}; }

}  // namespace

// Each operation: the GPU's way where CUDA is built and a GPU was given, else the host's.

runtime::Device ShardMemory::device() const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) return gpu_->device();
#endif
  return runtime::Device::cpu();
}

const runtime::Stream* ShardMemory::stream() const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) return &gpu_->stream();
#endif
  return nullptr;
}

runtime::Tensor ShardMemory::zeros(size_t floats) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::Tensor t = runtime::Tensor::empty(shapeOf(floats), gpu_->allocator());
    zero(t.data(), floats);
    return t;
  }
#endif
  return runtime::Tensor::zeros(shapeOf(floats));
}

runtime::Tensor ShardMemory::view(float* data, size_t floats) const {
  return runtime::Tensor::view(data, shapeOf(floats), device());
}

void ShardMemory::copy(float* dst, const float* src, size_t floats) const {
  if (floats == 0) return;
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::copyOnDevice(dst, src, floats * sizeof(float), gpu_->stream());
    return;
  }
#endif
  std::memcpy(dst, src, floats * sizeof(float));
}

void ShardMemory::zero(float* data, size_t floats) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::fill({data, floats}, 0.0f, gpu_->stream());
    return;
  }
#endif
  std::fill_n(data, floats, 0.0f);
}

void ShardMemory::scale(float* data, size_t floats, float alpha) const {
  if (alpha == 1.0f) return;
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::scale({data, floats}, alpha, gpu_->stream());
    return;
  }
#endif
  for (size_t i = 0; i < floats; ++i) data[i] *= alpha;
}

runtime::Tensor ShardMemory::wireTable(const std::vector<runtime::WireSegment>& table) const {
  const size_t bytes = table.size() * sizeof(runtime::WireSegment);
  runtime::Tensor t = zeros((bytes + sizeof(float) - 1) / sizeof(float));
  if (bytes == 0) return t;
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::copyToDevice(t.raw(), table.data(), bytes, gpu_->stream());
    return t;
  }
#endif
  std::memcpy(t.raw(), table.data(), bytes);
  return t;
}

void ShardMemory::packWire(const float* dense, uint16_t* wire, const runtime::WireSegment* table, size_t count) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::packWire(dense, wire, table, count, gpu_->stream());
    return;
  }
#endif
  runtime::packWire(dense, wire, {table, count});
}

void ShardMemory::unpackWire(const uint16_t* wire, float* dense, const runtime::WireSegment* table,
                             size_t count) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::unpackWire(wire, dense, table, count, gpu_->stream());
    return;
  }
#endif
  runtime::unpackWire(wire, dense, {table, count});
}

runtime::Tensor ShardMemory::toHost(const float* data, size_t floats, std::chrono::milliseconds timeout) const {
  runtime::Tensor host = runtime::Tensor::zeros(shapeOf(floats));
  copyToHost(host.data(), data, floats);
  synchronize(timeout);
  return host;
}

void ShardMemory::copyToHost(float* host, const float* data, size_t floats) const {
  if (floats == 0) return;
#ifdef COHORT_HAVE_CUDA
  if (gpu_) {
    runtime::cuda::copyToHost(host, data, floats * sizeof(float), gpu_->stream());
    return;
  }
#endif
  std::copy_n(data, floats, host);
}

void ShardMemory::synchronize(std::chrono::milliseconds timeout) const {
#ifdef COHORT_HAVE_CUDA
  if (gpu_) gpu_->stream().synchronize(timeout);
#endif
  (void)timeout;
}

}  // namespace cohort::train
