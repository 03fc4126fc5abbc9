// Device: where a tensor's memory lives and where its kernels run ("cpu", "cuda:0").
// A small value type. Which devices exist is a runtime question (runtime/device_query.h); whether
// CUDA is compiled in at all is cudaCompiled(), a function of the library that was built (not of
// the headers, which are the same in every build).
#pragma once

#include <string>

namespace cohort::runtime {

enum class DeviceType { kCpu, kCuda };

// True when this build of the runtime has CUDA support (COHORT_HAVE_CUDA); false in a CPU-only build.
bool cudaCompiled();

struct Device {
  DeviceType type = DeviceType::kCpu;
  int index = 0;

  static Device cpu() { return {DeviceType::kCpu, 0}; }
  static Device cuda(int index) { return {DeviceType::kCuda, index}; }
  // Parses "cpu", "cuda" (= cuda:0) or "cuda:N"; throws InvalidArgument otherwise.
  static Device parse(const std::string& text);

  bool isCpu() const { return type == DeviceType::kCpu; }
  bool isCuda() const { return type == DeviceType::kCuda; }
  std::string str() const;
  bool operator==(const Device& o) const { return type == o.type && index == o.index; }
  bool operator!=(const Device& o) const { return !(*this == o); }
};

}  // namespace cohort::runtime
