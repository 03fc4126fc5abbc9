// GpuOptions (runtime/gpu_options.h): the names of the convolution policies and of GEMM tuning.
#include "runtime/gpu_options.h"

#include "runtime/error.h"

namespace cohort::runtime {

ConvAlgorithms parseConvAlgorithms(const std::string& name) {
  if (name == "fastest") return ConvAlgorithms::kFastest;
  if (name == "exact") return ConvAlgorithms::kExact;
  COHORT_THROW(InvalidArgument) << "unknown convolution algorithms '" << name << "': expected fastest or exact";
}

std::optional<bool> parseGemmTuning(const std::string& value, const std::string& flag) {
  if (value.empty()) return std::nullopt;
  if (value == "on") return true;
  if (value == "off") return false;
  COHORT_THROW(InvalidArgument) << flag << " " << value << ": expected on or off";
}

const char* toString(ConvAlgorithms algorithms) {
  switch (algorithms) {
    case ConvAlgorithms::kFastest:
      return "fastest";
    case ConvAlgorithms::kExact:
      return "exact";
  }
  return "unknown";
}

}  // namespace cohort::runtime
