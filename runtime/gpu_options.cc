// GpuOptions (runtime/gpu_options.h): the names of the convolution policies.
#include "runtime/gpu_options.h"

#include "runtime/error.h"

namespace cohort::runtime {

ConvAlgorithms parseConvAlgorithms(const std::string& name) {
  if (name == "fastest") return ConvAlgorithms::kFastest;
  if (name == "exact") return ConvAlgorithms::kExact;
  COHORT_THROW(InvalidArgument) << "unknown convolution algorithms '" << name << "': expected fastest or exact";
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
