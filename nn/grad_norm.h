// The global L2 norm of a gradient and clipping by it: torch.nn.utils.clip_grad_norm_ with
// norm_type 2 (train::Job::step applies it; docs/api.md).
//
// sumOfSquares adds in double, so no gradient of finite floats overflows (a float squared is below
// 1.2e77): the sum is non-finite exactly when an element is, which is how a step's gradient is
// checked for NaN and inf. Its order of additions is fixed (the same sum for the same values).
// Thread safety: pure functions.
//
//   const double norm = std::sqrt(nn::sumOfSquares(gradient));
//   scale(gradient, nn::clipCoefficient(norm, 1.0f));
#pragma once

#include <span>

namespace cohort::nn {

// Σ values[i]², in double (CPU).
double sumOfSquares(std::span<const float> values);

// What clip_grad_norm_ multiplies the gradient by: max_norm / (total_norm + 1e-6), computed in
// float as PyTorch does from its float32 norm, and at most 1 (no gradient is scaled up).
float clipCoefficient(double norm, float maxNorm);

}  // namespace cohort::nn
