// fastestQualifying: the choice at the end of measuring a library's algorithms (cuDNN's convolutions,
// dnn.h; cuBLASLt's products, gemm_tuner.h): the fastest measured entry that qualifies, the first of
// equal times, so that the same measurements always give the same choice. Header-only, no state.
#pragma once

#include <span>

namespace cohort::runtime::cuda {

// `Timing` has a float `ms`; `qualifies(timing)` says whether it may be chosen. nullptr when none does.
template <class Timing, class Qualifies>
const Timing* fastestQualifying(std::span<const Timing> timings, Qualifies qualifies) {
  const Timing* best = nullptr;
  for (const Timing& t : timings) {
    if (qualifies(t) && (!best || t.ms < best->ms)) best = &t;
  }
  return best;
}

}  // namespace cohort::runtime::cuda
