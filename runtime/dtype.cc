#include "runtime/dtype.h"

#include "runtime/error.h"

namespace cohort::runtime {

const char* dtypeName(DType t) { return t == DType::kBF16 ? "bf16" : "fp32"; }

DType parseDType(const std::string& text, const std::string& what) {
  if (text == "fp32") return DType::kF32;
  if (text == "bf16") return DType::kBF16;
  COHORT_THROW(InvalidArgument) << what << " must be fp32 or bf16, got '" << text << "'";
}

}  // namespace cohort::runtime
