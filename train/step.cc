#include "train/step.h"

#include <sstream>

namespace cohort::train {

std::string StepResult::describe() const {
  std::ostringstream s;
  if (spike == Spike::kLoss) {
    s << "the loss spiked on rank " << rank;
    return s.str();
  }
  if (spike == Spike::kGradient) {
    s << "the gradient's norm spiked: " << gradNorm << " (" << (rank >= 0 ? "this rank's own" : "averaged over the ranks")
      << "), above " << gradNormLimit << ", the mean + z standard deviations of the recent steps";
    return s.str();
  }
  switch (nonFinite) {
    case NonFinite::kNone:
      s << "the loss and the gradient are finite (gradient norm " << gradNorm << ")";
      break;
    case NonFinite::kLoss:
      s << "the loss is non-finite on rank " << rank;
      break;
    case NonFinite::kGradient:
      s << "the gradient is non-finite (norm " << gradNorm << ", "
        << (rank >= 0 ? "rank " + std::to_string(rank) + "'s own" : std::string("averaged over the ranks")) << ")";
      break;
  }
  return s.str();
}

}  // namespace cohort::train
