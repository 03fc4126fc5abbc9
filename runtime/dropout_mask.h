// dropoutKeep: whether dropout keeps element `index` of a pass drawn with `seed`, as a pure function
// of the two (mix24 of runtime/random.h), so the CPU and CUDA implementations draw the same mask,
// any element can be drawn independently (one GPU thread each), and a pass is reproduced from its
// seed alone. Each pass draws a fresh seed from the trainer's Rng. Host and device code.
#pragma once

#include <cstdint>

#include "runtime/random.h"

namespace cohort::runtime {

// True when the element is kept (probability 1 − p): its 24-bit uniform in [0, 1) is at least p.
COHORT_HOST_DEVICE inline bool dropoutKeep(uint64_t seed, uint64_t index, float p) {
  return static_cast<float>(mix24(seed, index)) * (1.0f / 16777216.0f) >= p;
}

}  // namespace cohort::runtime
