#include "runtime/device.h"

#include "runtime/error.h"

namespace cohort::runtime {

Device Device::parse(const std::string& text) {
  if (text == "cpu") return cpu();
  if (text == "cuda") return cuda(0);
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5) {
    int index = 0;
    for (size_t i = 5; i < text.size(); ++i) {
      if (text[i] < '0' || text[i] > '9' || index > 1000) {
        COHORT_THROW(InvalidArgument) << "bad device '" << text << "': expected cpu, cuda or cuda:N";
      }
      index = index * 10 + (text[i] - '0');
    }
    return cuda(index);
  }
  COHORT_THROW(InvalidArgument) << "bad device '" << text << "': expected cpu, cuda or cuda:N";
}

bool cudaCompiled() {
#ifdef COHORT_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

std::string Device::str() const { return isCpu() ? "cpu" : "cuda:" + std::to_string(index); }

}  // namespace cohort::runtime
