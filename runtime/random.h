// Random numbers: counter-based splitmix64 (docs/data.md, "The synthetic sets, exactly").
//
// mix(seed, k) is a pure function, so any element of a synthetic dataset or any step of a shuffle
// can be computed independently and identically everywhere. Rng walks k = 0, 1, 2, ... for one
// seed; its whole state is (seed, counter), which checkpoints save so a resumed run draws exactly the
// numbers the uninterrupted run would have. Not thread-safe: one Rng per thread.
#pragma once

#include <cmath>
#include <cstdint>

// mix and mix24 are also device functions when nvcc compiles the includer (dropout masks on a GPU).
#ifdef __CUDACC__
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif

namespace cohort::runtime {

// splitmix64 of stream `seed` at index k.
COHORT_HOST_DEVICE inline uint64_t mix(uint64_t seed, uint64_t k) {
  uint64_t z = seed * 0xD1B54A32D192ED03ull + (k + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The 24-bit uniform integer m of docs/data.md, "The synthetic sets, exactly".
COHORT_HOST_DEVICE inline uint32_t mix24(uint64_t seed, uint64_t k) { return static_cast<uint32_t>(mix(seed, k) >> 40); }

class Rng {
 public:
  explicit Rng(uint64_t seed = 0, uint64_t counter = 0) : seed_(seed), counter_(counter) {}

  uint64_t nextU64() { return mix(seed_, counter_++); }
  // Uniform in [0, 1) with 24 random bits (exact in float32).
  float uniform() { return static_cast<float>(nextU64() >> 40) * (1.0f / 16777216.0f); }
  float uniform(float lo, float hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [0, n) (n > 0), by rejection, unbiased.
  uint64_t below(uint64_t n) {
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = nextU64();
    while (v >= limit);
    return v % n;
  }
  // Standard normal (Box-Muller on two 53-bit uniforms).
  double normal() {
    double u1 = (static_cast<double>(nextU64() >> 11) + 1.0) * 0x1.0p-53;
    double u2 = static_cast<double>(nextU64() >> 11) * 0x1.0p-53;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }

  uint64_t seed() const { return seed_; }
  uint64_t counter() const { return counter_; }

 private:
  uint64_t seed_;
  uint64_t counter_;
};

}  // namespace cohort::runtime
