// GpuOptions: how a cuda::GpuContext runs what it runs (runtime/cuda/gpu_context.h), as plain values
// that every build has, so that train::JobOptions and the command line can carry them without CUDA.
// Which cuDNN convolution algorithms are acceptable (ConvPolicy, below; runtime/cuda/dnn.h chooses
// by it; docs/gpu.md, "Convolution algorithms"), and whether fp32 matrix products may use TF32.
//
//   runtime::cuda::GpuContext gpu(Device::cuda(0), {.conv = {.algorithms = runtime::ConvAlgorithms::kExact}});
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace cohort::runtime {

// Which of cuDNN's convolution algorithms a GpuContext accepts. Both measure every candidate once per
// convolution shape (cudnnFind*AlgorithmEx, as PyTorch's cudnn.benchmark) and take the fastest; all
// compute in plain fp32 (no TF32 tensor-op math) within ConvPolicy::maxWorkspaceBytes.
//   kFastest  every algorithm (PyTorch's choice). Winograd and FFT algorithms compute in a transformed
//             domain and can differ from fp32 accumulation by about 1e-3 relative (an H200's
//             WINOGRAD_NONFUSED weight gradient: 8.3e-4).
//   kExact    only the algorithms whose results match plain fp32 accumulation (within float rounding
//             of another summation order): no Winograd, no FFT, in all three directions. Not the same
//             as deterministic: some accumulate with atomics, whose order may change from run to run.
enum class ConvAlgorithms { kFastest, kExact };
// "fastest", "exact"; InvalidArgument naming the accepted ones otherwise.
ConvAlgorithms parseConvAlgorithms(const std::string& name);
const char* toString(ConvAlgorithms algorithms);

struct ConvPolicy {
  ConvAlgorithms algorithms = ConvAlgorithms::kFastest;
  // The most workspace one convolution's algorithms may use (from the context's caching allocator);
  // algorithms that need more are not considered.
  size_t maxWorkspaceBytes = size_t{256} << 20;
  // TF32 tensor cores for fp32 convolutions (--tf32): the descriptors ask for CUDNN_DEFAULT_MATH, so
  // the algorithms that round inputs to TF32 are measured and may be chosen. Off: CUDNN_FMA_MATH, plain
  // fp32. Algorithms that convert fp32 data to fp16 or bf16 are never taken.
  bool tf32 = false;
  bool operator==(const ConvPolicy&) const = default;
};

// A --gemm-tuning value: "on", "off", or "" (not given: nullopt); InvalidArgument naming `flag` otherwise.
std::optional<bool> parseGemmTuning(const std::string& value, const std::string& flag);

struct GpuOptions {
  ConvPolicy conv = {};
  // TF32 tensor cores for fp32 matrix products (cuBLAS; --tf32): inputs rounded to 10 bits of
  // mantissa, sums in fp32, several times plain fp32's rate. Off by default, so a plain fp32 run stays
  // within fp32 rounding of the CPU. Convolutions follow conv.tf32 (a job sets both from --tf32).
  bool tf32 = false;
  // Time cuBLASLt's candidate algorithms for each new product shape and keep the fastest
  // (runtime/cuda/gemm_tuner.h); false: the heuristic's first. nullopt (`cohort train` without
  // --gemm-tuning): COHORT_GEMM_TUNING (on | off) decides, and without it tuning is on. A value set
  // here wins over the environment.
  std::optional<bool> tuneGemms = std::nullopt;
};

}  // namespace cohort::runtime
