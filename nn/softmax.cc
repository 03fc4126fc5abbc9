#include "nn/softmax.h"

#include <algorithm>
#include <cmath>

#include "nn/gpu_dispatch.h"
#include "runtime/cpu/blas.h"
#include "runtime/cpu/vector_math.h"
#include "runtime/error.h"

namespace cohort::nn {

void softmaxRows(const float* x, float* y, int64_t rows, int64_t cols, bool log, bool causal) {
  COHORT_CHECK(!(log && causal)) << "a causal log-softmax is not defined here";
  runtime::cpu::parallelRange(rows, runtime::cpu::rowGrain(cols), [&](int64_t first, int64_t last, int) {
    for (int64_t r = first; r < last; ++r) {
      const float* xr = x + r * cols;
      float* yr = y + r * cols;
      const int64_t valid = causal ? r % cols + 1 : cols;
      float mx = *std::max_element(xr, xr + valid);
      if (log) {
        double sum = 0.0;
        for (int64_t c = 0; c < valid; ++c) sum += std::exp(static_cast<double>(xr[c] - mx));
        float lse = mx + static_cast<float>(std::log(sum));
        for (int64_t c = 0; c < cols; ++c) yr[c] = xr[c] - lse;
      } else {
        // The exponentials side by side (a vectorised loop), then their sum in double, in order.
        for (int64_t c = 0; c < valid; ++c) yr[c] = runtime::cpu::expVectorised(xr[c] - mx);
        double sum = 0.0;
        for (int64_t c = 0; c < valid; ++c) sum += yr[c];
        const float inv = static_cast<float>(1.0 / sum);
        for (int64_t c = 0; c < valid; ++c) yr[c] *= inv;
        std::fill(yr + valid, yr + cols, 0.0f);
      }
    }
  });
}

const Tensor& Softmax::forward(const Tensor& input, const Pass& pass) {
  COHORT_CHECK(input.rank() >= 1);
  int64_t cols = input.dim(input.rank() - 1);
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, input.shape(), gpu.allocator());
    runtime::cuda::softmaxForward(input.data(), output_.data(), cols ? input.numel() / cols : 0, cols, log_,
                                  gpu.stream());
    return output_;
  }
#endif
  runtime::ensureShape(output_, input.shape());
  softmaxRows(input.data(), output_.data(), cols ? input.numel() / cols : 0, cols, log_);
  return output_;
}

const Tensor& Softmax::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
  int64_t cols = output_.dim(output_.rank() - 1);
  int64_t rows = cols ? output_.numel() / cols : 0;
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    runtime::ensureShape(gradInput_, output_.shape(), gpu.allocator());
    runtime::cuda::softmaxBackward(output_.data(), gradOutput.data(), gradInput_.data(), rows, cols, log_,
                                   gpu.stream());
    return gradInput_;
  }
#endif
  runtime::ensureShape(gradInput_, output_.shape());
  for (int64_t r = 0; r < rows; ++r) {
    const float* y = output_.data() + r * cols;
    const float* dy = gradOutput.data() + r * cols;
    float* dx = gradInput_.data() + r * cols;
    if (log_) {  // dx = dy - softmax · Σ dy
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += dy[c];
      for (int64_t c = 0; c < cols; ++c) dx[c] = dy[c] - std::exp(y[c]) * static_cast<float>(s);
    } else {  // dx = y · (dy − Σ dy·y)
      double s = 0.0;
      for (int64_t c = 0; c < cols; ++c) s += static_cast<double>(dy[c]) * y[c];
      for (int64_t c = 0; c < cols; ++c) dx[c] = y[c] * (dy[c] - static_cast<float>(s));
    }
  }
  return gradInput_;
}

}  // namespace cohort::nn
