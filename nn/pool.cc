#include "nn/pool.h"

#include <cmath>
#include <limits>

#include "nn/gpu_dispatch.h"
#include "runtime/error.h"

namespace cohort::nn {

Pool2dBase::Pool2dBase(const char* kind, int64_t kernel, int64_t stride)
    : kernel_(kernel), stride_(stride == 0 ? kernel : stride) {
  if (kernel < 1 || stride < 0) {
    COHORT_THROW(InvalidArgument) << kind << " needs kernel >= 1 and stride >= 0 (0: the kernel), got kernel " << kernel
                                  << " stride " << stride;
  }
}

std::string Pool2dBase::describe(const char* kind) const {
  std::string s = std::string(kind) + "(" + std::to_string(kernel_);
  if (stride_ != kernel_) s += ", stride " + std::to_string(stride_);
  return s + ")";
}

Shape Pool2dBase::outputShape(const Shape& input) const {
  if (input.rank() != 4 || input[2] < kernel_ || input[3] < kernel_) {
    COHORT_THROW(InvalidArgument) << name() << " needs input [N, C, H >= " << kernel_ << ", W >= " << kernel_
                                  << "], got " << input.str();
  }
  return Shape{input[0], input[1], (input[2] - kernel_) / stride_ + 1, (input[3] - kernel_) / stride_ + 1};
}

namespace {

#ifdef COHORT_HAVE_CUDA
runtime::cuda::PoolShape poolShape(const Shape& in, const Shape& out, int64_t kernel, int64_t stride) {
  return {.planes = in[0] * in[1],
          .height = in[2],
          .width = in[3],
          .outHeight = out[2],
          .outWidth = out[3],
          .kernel = kernel,
          .stride = stride};
}

int32_t* asIndices(Tensor& t) { return reinterpret_cast<int32_t*>(t.data()); }
#endif

// PyTorch's rule: strictly greater (so the first maximum wins), or NaN (which propagates).
inline bool beats(float v, float best) { return v > best || v != v; }

// One [h, w] plane of max-pooling. kKernel > 0 fixes the window size at compile time (the common 2
// and 3 unroll); 0 takes `kernel` at run time.
template <int kKernel>
void maxPoolPlane(const float* x, int64_t w, int64_t oh, int64_t ow, int64_t kernel, int64_t stride, float* y,
                  int32_t* arg) {
  const int64_t k = kKernel > 0 ? kKernel : kernel;
  for (int64_t i = 0; i < oh; ++i) {
    const float* top = x + i * stride * w;
    for (int64_t j = 0; j < ow; ++j) {
      const float* corner = top + j * stride;
      float bestValue = corner[0];
      int64_t best = 0;  // u·w + v within the window
      for (int64_t u = 0; u < k; ++u) {
        for (int64_t v = 0; v < k; ++v) {
          // Selects rather than branches: on real data the winner is unpredictable.
          const float value = corner[u * w + v];
          const bool win = beats(value, bestValue);
          bestValue = win ? value : bestValue;
          best = win ? u * w + v : best;
        }
      }
      y[i * ow + j] = bestValue;
      arg[i * ow + j] = static_cast<int32_t>(corner - x + best);
    }
  }
}

}  // namespace

const Tensor& MaxPool2d::forward(const Tensor& input, const Pass& pass) {
  const Shape outShape = outputShape(input.shape());
  inputShape_ = input.shape();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, outShape, gpu.allocator());
    static_assert(sizeof(int32_t) == sizeof(float));
    runtime::ensureShape(gpuArgmax_, outShape, gpu.allocator());
    runtime::cuda::maxPoolForward(input.data(), output_.data(), asIndices(gpuArgmax_),
                                  poolShape(inputShape_, outShape, kernel_, stride_), gpu.stream());
    return output_;
  }
#endif
  runtime::ensureShape(output_, outShape);
  const int64_t planes = outShape[0] * outShape[1], oh = outShape[2], ow = outShape[3];
  const int64_t h = inputShape_[2], w = inputShape_[3];
  COHORT_CHECK(h * w <= std::numeric_limits<int32_t>::max()) << inputShape_.str();
  argmax_.resize(static_cast<size_t>(output_.numel()));  // within capacity after the first batch
  auto* plane = kernel_ == 2 ? &maxPoolPlane<2> : kernel_ == 3 ? &maxPoolPlane<3> : &maxPoolPlane<0>;
  for (int64_t p = 0; p < planes; ++p) {
    plane(input.data() + p * h * w, w, oh, ow, kernel_, stride_, output_.data() + p * oh * ow,
          argmax_.data() + p * oh * ow);
  }
  return output_;
}

const Tensor& MaxPool2d::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    COHORT_CHECK(gradOutput.numel() == gpuArgmax_.numel()) << gradOutput.shape().str();
    runtime::ensureShape(gradInput_, inputShape_, gpu.allocator());
    runtime::cuda::maxPoolBackward(gradOutput.data(), asIndices(gpuArgmax_), gradInput_.data(),
                                   poolShape(inputShape_, gpuArgmax_.shape(), kernel_, stride_), gpu.stream());
    return gradInput_;
  }
#endif
  COHORT_CHECK(gradOutput.numel() == static_cast<int64_t>(argmax_.size())) << gradOutput.shape().str();
  runtime::ensureShape(gradInput_, inputShape_);
  gradInput_.fill(0.0f);
  const int64_t planes = inputShape_[0] * inputShape_[1], planeElems = inputShape_[2] * inputShape_[3];
  const int64_t perPlane = planes ? gradOutput.numel() / planes : 0;
  const float* dy = gradOutput.data();
  const int32_t* arg = argmax_.data();
  float* dx = gradInput_.data();
  for (int64_t plane = 0; plane < planes; ++plane, dx += planeElems) {
    for (int64_t k = 0; k < perPlane; ++k, ++dy, ++arg) dx[*arg] += *dy;
  }
  return gradInput_;
}

const Tensor& AvgPool2d::forward(const Tensor& input, const Pass& pass) {
  const Shape outShape = outputShape(input.shape());
  inputShape_ = input.shape();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(input)) {
    auto& gpu = gpuFor(pass, input, name());
    runtime::ensureShape(output_, outShape, gpu.allocator());
    runtime::cuda::avgPoolForward(input.data(), output_.data(), poolShape(inputShape_, outShape, kernel_, stride_),
                                  gpu.stream());
    return output_;
  }
#endif
  runtime::ensureShape(output_, outShape);
  const int64_t planes = outShape[0] * outShape[1], oh = outShape[2], ow = outShape[3];
  const int64_t w = inputShape_[3], planeElems = inputShape_[2] * w;
  const float scale = 1.0f / static_cast<float>(kernel_ * kernel_);
  const float* x = input.data();
  float* y = output_.data();
  for (int64_t plane = 0; plane < planes; ++plane, x += planeElems) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j, ++y) {
        float sum = 0.0f;
        for (int64_t u = 0; u < kernel_; ++u) {
          const float* row = x + (i * stride_ + u) * w + j * stride_;
          for (int64_t v = 0; v < kernel_; ++v) sum += row[v];
        }
        *y = sum * scale;
      }
    }
  }
  return output_;
}

const Tensor& AvgPool2d::backward(const Tensor& gradOutput, const Pass& pass) {
  if (!pass.needInputGrad) {
    gradInput_ = Tensor();
    return gradInput_;
  }
  const Shape outShape = outputShape(inputShape_);
  COHORT_CHECK(gradOutput.numel() == outShape.numel()) << gradOutput.shape().str();
#ifdef COHORT_HAVE_CUDA
  if (onGpu(gradOutput)) {
    auto& gpu = gpuFor(pass, gradOutput, name());
    runtime::ensureShape(gradInput_, inputShape_, gpu.allocator());
    runtime::cuda::avgPoolBackward(gradOutput.data(), gradInput_.data(),
                                   poolShape(inputShape_, outShape, kernel_, stride_), gpu.stream());
    return gradInput_;
  }
#endif
  runtime::ensureShape(gradInput_, inputShape_);
  gradInput_.fill(0.0f);
  const int64_t planes = outShape[0] * outShape[1], oh = outShape[2], ow = outShape[3];
  const int64_t w = inputShape_[3], planeElems = inputShape_[2] * w;
  const float scale = 1.0f / static_cast<float>(kernel_ * kernel_);
  const float* dy = gradOutput.data();
  float* dx = gradInput_.data();
  for (int64_t plane = 0; plane < planes; ++plane, dx += planeElems) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j, ++dy) {
        const float g = *dy * scale;
        for (int64_t u = 0; u < kernel_; ++u) {
          float* row = dx + (i * stride_ + u) * w + j * stride_;
          for (int64_t v = 0; v < kernel_; ++v) row[v] += g;
        }
      }
    }
  }
  return gradInput_;
}

}  // namespace cohort::nn
