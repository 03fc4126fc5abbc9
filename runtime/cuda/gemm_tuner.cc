// GEMM algorithm timing and choice (runtime/cuda/gemm_tuner.h).
#include "runtime/cuda/gemm_tuner.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>

#include "runtime/cuda/cuda_check.h"
#include "runtime/cuda/fastest.h"
#include "runtime/error.h"

namespace cohort::runtime::cuda {
namespace {

// A timing event, destroyed with its scope (a destructor must not throw: failures are ignored).
struct TimingEvent {
  cudaEvent_t event = nullptr;
  TimingEvent() { COHORT_CUDA_CHECK(cudaEventCreate(&event)); }
  ~TimingEvent() { cudaEventDestroy(event); }
  TimingEvent(const TimingEvent&) = delete;
  TimingEvent& operator=(const TimingEvent&) = delete;
};

}  // namespace

const GemmAlgoTiming* chooseGemmAlgorithm(std::span<const GemmAlgoTiming> timings) {
  return fastestQualifying(timings, [](const GemmAlgoTiming& t) { return t.ms >= 0; });
}

float EventGemmTimer::time(const GemmCandidate&, const std::function<bool()>& launch) {
  CudaDeviceGuard guard(stream_.device().index);
  const auto stream = static_cast<cudaStream_t>(stream_.native());
  if (!launch()) return -1;  // the warm-up: loads the kernel, and says whether it runs at all
  std::array<TimingEvent, kRepetitions + 1> marks;
  COHORT_CUDA_CHECK(cudaEventRecord(marks[0].event, stream));
  for (int r = 0; r < kRepetitions; ++r) {
    if (!launch()) return -1;
    COHORT_CUDA_CHECK(cudaEventRecord(marks[static_cast<size_t>(r) + 1].event, stream));
  }
  COHORT_CUDA_CHECK(cudaEventSynchronize(marks[kRepetitions].event));
  std::array<float, kRepetitions> ms{};
  for (int r = 0; r < kRepetitions; ++r) {
    COHORT_CUDA_CHECK(cudaEventElapsedTime(&ms[static_cast<size_t>(r)], marks[static_cast<size_t>(r)].event,
                                           marks[static_cast<size_t>(r) + 1].event));
  }
  std::sort(ms.begin(), ms.end());
  return ms[kRepetitions / 2];
}

bool gemmTuningFromEnvironment(bool fallback) {
  const char* v = std::getenv("COHORT_GEMM_TUNING");
  if (!v || !*v) return fallback;
  const std::string value = v;
  if (value == "on" || value == "1") return true;
  if (value == "off" || value == "0") return false;
  COHORT_THROW(InvalidArgument) << "COHORT_GEMM_TUNING=" << value << ": expected on or off";
}

bool streamIsCapturing(const Stream& stream) {
  CudaDeviceGuard guard(stream.device().index);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  COHORT_CUDA_CHECK(cudaStreamIsCapturing(static_cast<cudaStream_t>(stream.native()), &status));
  return status != cudaStreamCaptureStatusNone;
}

}  // namespace cohort::runtime::cuda
