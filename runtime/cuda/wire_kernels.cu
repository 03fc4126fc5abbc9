// Wire messages on the GPU (runtime/cuda/wire_kernels.h): block b takes segments b, b + grid, ...,
// its threads striding over the segment's elements (at most kWireSegmentMax, so the blocks' shares
// are even). A bf16 element is one 16-bit word written as __nv_bfloat16; an exact one is its fp32
// bits as two words, the low half first, read and written as 32-bit integers so no float
// conversion touches them.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "runtime/cuda/launch.h"
#include "runtime/cuda/wire_kernels.h"

namespace cohort::runtime::cuda {
namespace {

__global__ void packWireKernel(const float* __restrict__ dense, uint16_t* __restrict__ wire,
                               const WireSegment* __restrict__ table, size_t segments) {
  for (size_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const WireSegment seg = table[s];
    if (seg.form == WireForm::kBf16) {
      __nv_bfloat16* to = reinterpret_cast<__nv_bfloat16*>(wire + seg.wire);
      for (uint32_t i = threadIdx.x; i < seg.count; i += blockDim.x) to[i] = __float2bfloat16_rn(dense[seg.dense + i]);
      continue;
    }
    const uint32_t* from = reinterpret_cast<const uint32_t*>(dense) + seg.dense;
    uint16_t* to = wire + seg.wire;
    for (uint32_t i = threadIdx.x; i < seg.count; i += blockDim.x) {
      const uint32_t bits = from[i];
      to[2 * i] = static_cast<uint16_t>(bits & 0xffffu);
      to[2 * i + 1] = static_cast<uint16_t>(bits >> 16);
    }
  }
}

__global__ void unpackWireKernel(const uint16_t* __restrict__ wire, float* __restrict__ dense,
                                 const WireSegment* __restrict__ table, size_t segments) {
  for (size_t s = blockIdx.x; s < segments; s += gridDim.x) {
    const WireSegment seg = table[s];
    if (seg.form == WireForm::kBf16) {
      const __nv_bfloat16* from = reinterpret_cast<const __nv_bfloat16*>(wire + seg.wire);
      for (uint32_t i = threadIdx.x; i < seg.count; i += blockDim.x) dense[seg.dense + i] = __bfloat162float(from[i]);
      continue;
    }
    const uint16_t* from = wire + seg.wire;
    uint32_t* to = reinterpret_cast<uint32_t*>(dense) + seg.dense;
    for (uint32_t i = threadIdx.x; i < seg.count; i += blockDim.x) {
      to[i] = static_cast<uint32_t>(from[2 * i]) | static_cast<uint32_t>(from[2 * i + 1]) << 16;
    }
  }
}

}  // namespace

void packWire(const float* dense, uint16_t* wire, const WireSegment* table, size_t segments, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (segments == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(packWireKernel, launch::blocksFor(stream, segments, 1), launch::kThreads, 0,
                launch::nativeStream(stream))(dense, wire, table, segments);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

void unpackWire(const uint16_t* wire, float* dense, const WireSegment* table, size_t segments, const Stream& stream) {
  launch::checkCudaStream(stream);
  if (segments == 0) return;
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(unpackWireKernel, launch::blocksFor(stream, segments, 1), launch::kThreads, 0,
                launch::nativeStream(stream))(wire, dense, table, segments);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace cohort::runtime::cuda
