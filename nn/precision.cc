#include "nn/precision.h"

#include "nn/gpu_dispatch.h"
#include "runtime/error.h"

#ifdef COHORT_HAVE_CUDA
#include "runtime/cuda/precision_kernels.h"
#endif

namespace cohort::nn::precision {

const Tensor& toType(const Tensor& t, runtime::DType type, Tensor& buffer, const Pass& pass, const Module& reader) {
  if (t.dtype() == type) return t;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(t)) {
    auto& gpu = gpuFor(pass, t, reader.name());
    runtime::ensureShape(buffer, t.shape(), gpu.allocator(), type);
    if (type == runtime::DType::kF32) {
      runtime::cuda::convertToFloat(t.raw(), buffer.data(), t.numel(), gpu.stream());
    } else {
      runtime::cuda::convertToBf16(t.data(), buffer.raw(), t.numel(), gpu.stream());
    }
    return buffer;
  }
#endif
  COHORT_CHECK(type == runtime::DType::kF32) << reader.name() << ": bf16 is for tensors on a GPU, got "
                                             << t.shape().str() << " on " << t.device().str();
  return toFp32(t, buffer, pass, reader);
}

const Tensor& toFp32(const Tensor& t, Tensor& buffer, const Pass& pass, const Module& reader) {
  if (t.dtype() == runtime::DType::kF32) return t;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(t)) return toType(t, runtime::DType::kF32, buffer, pass, reader);
#endif
  (void)pass;
  runtime::ensureShape(buffer, t.shape());
  const uint16_t* bits = t.data<uint16_t>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) buffer.at(i) = runtime::toFloat(runtime::Bf16{bits[i]});
  return buffer;
}

const Tensor& forChild(const Module& child, const Tensor& t, Tensor& buffer, const Pass& pass) {
  if (child.takesBf16()) return t;
  return toFp32(t, buffer, pass, child);
}

Pass passFor(const Module& child, const Pass& pass) {
  if (pass.precision == runtime::DType::kF32 || child.takesBf16()) return pass;
  Pass fp32 = pass;
  fp32.precision = runtime::DType::kF32;
  return fp32;
}

void checkCpuPrecision(const Pass& pass, const Module& layer) {
  if (pass.precision == runtime::DType::kF32) return;
  COHORT_THROW(InvalidArgument) << layer.name() << " runs on the CPU, where passes compute in fp32 only (bf16 "
                                << "needs a GPU; --precision bf16 with --device cuda)";
}

}  // namespace cohort::nn::precision
