// judgeStep (step_guard.h): one thread turns a step's sum of squares into its decision; and
// storeOnDevice, the one uncaptured write of a step's changing values.
//
// The roundings are the host's (train/strategy.cc, nn/grad_norm.cc), in its order: the norm in
// double, gradScale x sqrt(sum); the clip coefficient in float, maxNorm / (float(norm) + 1e-6),
// at most 1; the multiplier gradScale x coefficient in float. __fmul_rn/__fadd_rn keep nvcc from
// fusing any of them into a multiply-add the host does not do.
#include <cuda_runtime.h>

#include <cfloat>
#include <cstring>
#include <type_traits>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/elementwise.h"
#include "runtime/cuda/kernels.h"
#include "runtime/cuda/launch.h"
#include "runtime/cuda/step_guard.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

__global__ void judgeStepKernel(const double* __restrict__ sumOfSquares, const JudgeOptions* __restrict__ options,
                                StepGuardState* __restrict__ state, StepRecord* __restrict__ record) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  const JudgeOptions o = *options;
  if (o.seed) {
    state->applied = o.seedApplied;
    state->nonFinite = 0;
    state->halted = 0;
  }
  const double norm = static_cast<double>(o.gradScale) * sqrt(*sumOfSquares);
  // False for NaN and for +inf (a norm is never negative).
  const bool finiteNorm = norm <= DBL_MAX;
  const int nonFinite = o.lossNonFinite ? 1 : finiteNorm ? 0 : 2;
  if (nonFinite != 0) {
    state->nonFinite += 1;
    if (state->nonFinite > o.nonFiniteLimit) state->halted = 1;
  }
  // A spike (finite, refused by the host's rule) skips the step and counts against nothing.
  const int spike = nonFinite != 0 ? 0 : o.lossSpike ? 1 : norm > o.maxGradNorm ? 2 : 0;
  const int apply = nonFinite == 0 && spike == 0 && !state->halted;
  float clip = 1.0f;
  if (o.clipGradNorm > 0.0f && apply) {
    const float coefficient = o.clipGradNorm / __fadd_rn(static_cast<float>(norm), 1e-6f);
    clip = 1.0f < coefficient ? 1.0f : coefficient;  // std::min(coefficient, 1.0f)
  }
  state->control.apply = apply;
  state->control.gradMultiplier = __fmul_rn(o.gradScale, clip);
  state->control.appliedBefore = state->applied;
  if (apply) state->applied += 1;
  record->gradNorm = norm;
  record->appliedSteps = state->applied;
  record->nonFiniteSteps = state->nonFinite;
  record->applied = apply;
  record->nonFinite = nonFinite;
  record->halted = state->halted;
  record->spike = spike;
}

// storeOnDevice's value, as bytes (one kernel for every type, its arguments well below 4 KiB).
constexpr unsigned kStoreBytes = 1024;
struct StoreBytes {
  alignas(8) unsigned char bytes[kStoreBytes];
};

__global__ void storeKernel(unsigned char* __restrict__ device, StoreBytes value, unsigned bytes) {
  for (unsigned i = threadIdx.x; i < bytes; i += blockDim.x) device[i] = value.bytes[i];
}

}  // namespace

void judgeStep(const double* sumOfSquares, const JudgeOptions* options, StepGuardState* state, StepRecord* record,
               const Stream& stream) {
  launch::checkCudaStream(stream);
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(judgeStepKernel, 1, 1, 0, launch::nativeStream(stream))(sumOfSquares, options, state, record);
  COHORT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
void storeOnDevice(T* device, const T& value, const Stream& stream) {
  static_assert(sizeof(T) <= kStoreBytes && std::is_trivially_copyable_v<T>);
  launch::checkCudaStream(stream);
  StoreBytes bytes{};
  std::memcpy(bytes.bytes, &value, sizeof(T));
  CudaDeviceGuard guard(stream.device().index);
  COHORT_LAUNCH(storeKernel, 1, launch::kWarpSize, 0, launch::nativeStream(stream))(
      reinterpret_cast<unsigned char*>(device), bytes, static_cast<unsigned>(sizeof(T)));
  COHORT_CUDA_CHECK(cudaGetLastError());
}

template void storeOnDevice(JudgeOptions*, const JudgeOptions&, const Stream&);
template void storeOnDevice(OptimizerStepArgs<SgdStepOptions>*, const OptimizerStepArgs<SgdStepOptions>&,
                            const Stream&);
template void storeOnDevice(OptimizerStepArgs<AdamStepOptions>*, const OptimizerStepArgs<AdamStepOptions>&,
                            const Stream&);

}  // namespace cohort::runtime::cuda
