#include "runtime/gemm_options.h"

#include "runtime/error.h"

namespace cohort::runtime {

void checkGemmBatch(const GemmOptions& o, const GemmBatch& batch) {
  if (o.m < 0 || o.n < 0 || o.k < 0 || batch.count < 0) {
    COHORT_THROW(InvalidArgument) << "gemmBatched: " << batch.count << " gemms of " << o.m << " x " << o.n << " x " << o.k;
  }
  if (batch.strideA < 0 || batch.strideB < 0 || batch.strideC < 0) {
    COHORT_THROW(InvalidArgument) << "gemmBatched: negative strides " << batch.strideA << ", " << batch.strideB << ", "
                                  << batch.strideC;
  }
  if (batch.count > 1 && o.m > 0 && o.n > 0 && batch.strideC < int64_t{o.m} * o.n) {
    COHORT_THROW(InvalidArgument) << "gemmBatched: the C matrices overlap: stride " << batch.strideC << " for " << o.m
                                  << " x " << o.n;
  }
}

}  // namespace cohort::runtime
