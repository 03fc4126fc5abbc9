#include "nn/batchnorm.h"

#include <cmath>

#include "nn/gpu_dispatch.h"
#include "runtime/error.h"

namespace cohort::nn {

BatchNorm2d::BatchNorm2d(int64_t channels, double eps, double momentum)
    : channels_(channels), eps_(eps), momentum_(momentum) {
  if (channels < 1 || !(eps > 0.0) || !(momentum >= 0.0 && momentum <= 1.0)) {
    COHORT_THROW(InvalidArgument) << "BatchNorm2d needs channels >= 1, eps > 0 and momentum in [0, 1]; got " << channels
                                  << ", " << eps << ", " << momentum;
  }
}

std::string BatchNorm2d::name() const { return "BatchNorm2d(" + std::to_string(channels_) + ")"; }

void BatchNorm2d::registerParams(ParamBuffer& params, const std::string& prefix) {
  weightEntry_ = params.add(prefix + "weight", Shape{channels_}, &weight_, &weightGrad_);
  biasEntry_ = params.add(prefix + "bias", Shape{channels_}, &bias_, &biasGrad_);
  params.addBuffer(prefix + "running_mean", Shape{channels_}, &runningMean_, 0.0f);
  params.addBuffer(prefix + "running_var", Shape{channels_}, &runningVar_, 1.0f);
}

void BatchNorm2d::resetParams(runtime::Rng& rng) {
  resetByPlan(*this, rng);
  runningMean_.fill(0.0f);
  runningVar_.fill(1.0f);
}

void BatchNorm2d::planInit(InitPlan& plan) const {
  plan.constant(initTarget(*this, weightEntry_, channels_, weight_), 1.0f);
  plan.constant(initTarget(*this, biasEntry_, channels_, bias_), 0.0f);
}

Shape BatchNorm2d::outputShape(const Shape& input) const {
  if (input.rank() != 4 || input[1] != channels_) {
    COHORT_THROW(InvalidArgument) << name() << " needs input [N, " << channels_ << ", H, W], got " << input.str();
  }
  return input;
}

const Tensor& BatchNorm2d::forward(const Tensor& input, const Pass& pass) {
  inputShape_ = outputShape(input.shape());
  const int64_t n = inputShape_[0], plane = inputShape_[2] * inputShape_[3], m = n * plane;
  batchStats_ = pass.training;
  if (batchStats_ && m <= 1) {
    COHORT_THROW(InvalidArgument) << name() << " in training needs more than one value per channel, got input "
                                  << inputShape_.str();
  }
  if (onGpu(input)) return forwardGpu(input, pass);
  runtime::ensureShape(normalized_, inputShape_);
  runtime::ensureShape(output_, inputShape_);
  runtime::ensureShape(invStd_, Shape{channels_});
  const float* x = input.data();
  float* xhat = normalized_.data();
  float* y = output_.data();
  const int64_t stride = channels_ * plane;  // between samples
  for (int64_t c = 0; c < channels_; ++c) {
    double mean, var;
    if (batchStats_) {
      // Two passes in double: the mean, then the squared deviations from it.
      double sum = 0.0;
      for (int64_t s = 0; s < n; ++s) {
        const float* p = x + s * stride + c * plane;
        for (int64_t i = 0; i < plane; ++i) sum += p[i];
      }
      mean = sum / static_cast<double>(m);
      double sq = 0.0;
      for (int64_t s = 0; s < n; ++s) {
        const float* p = x + s * stride + c * plane;
        for (int64_t i = 0; i < plane; ++i) sq += (p[i] - mean) * (p[i] - mean);
      }
      var = sq / static_cast<double>(m);
      const double unbiased = sq / static_cast<double>(m - 1);
      const double mom = momentum_;
      runningMean_.at(c) = static_cast<float>(mom * mean + (1.0 - mom) * runningMean_.at(c));
      runningVar_.at(c) = static_cast<float>(mom * unbiased + (1.0 - mom) * runningVar_.at(c));
    } else {
      mean = runningMean_.at(c);
      var = runningVar_.at(c);
    }
    const float meanF = static_cast<float>(mean);
    const float inv = static_cast<float>(1.0 / std::sqrt(var + eps_));
    invStd_.at(c) = inv;
    const float gamma = weight_.at(c), beta = bias_.at(c);
    for (int64_t s = 0; s < n; ++s) {
      const int64_t base = s * stride + c * plane;
      for (int64_t i = 0; i < plane; ++i) {
        const float h = (x[base + i] - meanF) * inv;
        xhat[base + i] = h;
        y[base + i] = gamma * h + beta;
      }
    }
  }
  return output_;
}

const Tensor& BatchNorm2d::backward(const Tensor& gradOutput, const Pass& pass) {
  COHORT_CHECK(gradOutput.numel() == inputShape_.numel()) << name() << ": gradient " << gradOutput.shape().str();
  const int64_t n = inputShape_[0], plane = inputShape_[2] * inputShape_[3], m = n * plane;
  const int64_t stride = channels_ * plane;
  if (onGpu(gradOutput)) return backwardGpu(gradOutput, pass);
  if (pass.needInputGrad) {
    runtime::ensureShape(gradInput_, inputShape_);
  } else {
    gradInput_ = Tensor();
  }
  const float* dy = gradOutput.data();
  const float* xhat = normalized_.data();
  for (int64_t c = 0; c < channels_; ++c) {
    double sumDy = 0.0, sumDyXhat = 0.0;
    for (int64_t s = 0; s < n; ++s) {
      const int64_t base = s * stride + c * plane;
      for (int64_t i = 0; i < plane; ++i) {
        sumDy += dy[base + i];
        sumDyXhat += static_cast<double>(dy[base + i]) * xhat[base + i];
      }
    }
    if (pass.accumulateGrads) {
      weightGrad_.at(c) += static_cast<float>(sumDyXhat);
      biasGrad_.at(c) += static_cast<float>(sumDy);
    } else {
      weightGrad_.at(c) = static_cast<float>(sumDyXhat);
      biasGrad_.at(c) = static_cast<float>(sumDy);
    }
    if (!pass.needInputGrad) continue;
    float* dx = gradInput_.data();
    const float scale = weight_.at(c) * invStd_.at(c);
    if (batchStats_) {
      // The batch statistics depend on x: dx = γ·invstd · (dy − mean(dy) − x̂ · mean(dy·x̂)).
      const float meanDy = static_cast<float>(sumDy / static_cast<double>(m));
      const float meanDyXhat = static_cast<float>(sumDyXhat / static_cast<double>(m));
      for (int64_t s = 0; s < n; ++s) {
        const int64_t base = s * stride + c * plane;
        for (int64_t i = 0; i < plane; ++i) {
          dx[base + i] = scale * (dy[base + i] - meanDy - xhat[base + i] * meanDyXhat);
        }
      }
    } else {
      for (int64_t s = 0; s < n; ++s) {
        const int64_t base = s * stride + c * plane;
        for (int64_t i = 0; i < plane; ++i) dx[base + i] = scale * dy[base + i];
      }
    }
  }
  return gradInput_;
}

#ifdef COHORT_HAVE_CUDA

const Tensor& BatchNorm2d::forwardGpu(const Tensor& input, const Pass& pass) {
  auto& gpu = gpuFor(pass, input, name());
  runtime::ensureShape(normalized_, inputShape_, gpu.allocator());
  runtime::ensureShape(output_, inputShape_, gpu.allocator());
  runtime::ensureShape(invStd_, Shape{channels_}, gpu.allocator());
  runtime::cuda::batchNormForward(
      input.data(), weight_.data(), bias_.data(), runningMean_.data(), runningVar_.data(), invStd_.data(),
      normalized_.data(), output_.data(),
      {.batch = inputShape_[0], .channels = channels_, .plane = inputShape_[2] * inputShape_[3]},
      {.eps = eps_, .momentum = momentum_, .batchStats = batchStats_}, gpu.stream());
  return output_;
}

const Tensor& BatchNorm2d::backwardGpu(const Tensor& gradOutput, const Pass& pass) {
  auto& gpu = gpuFor(pass, gradOutput, name());
  if (pass.needInputGrad) {
    runtime::ensureShape(gradInput_, inputShape_, gpu.allocator());
  } else {
    gradInput_ = Tensor();
  }
  runtime::cuda::batchNormBackward(
      gradOutput.data(), normalized_.data(), weight_.data(), invStd_.data(), weightGrad_.data(), biasGrad_.data(),
      pass.needInputGrad ? gradInput_.data() : nullptr,
      {.batch = inputShape_[0], .channels = channels_, .plane = inputShape_[2] * inputShape_[3]}, batchStats_,
      pass.accumulateGrads, gpu.stream());
  return gradInput_;
}

#else

const Tensor& BatchNorm2d::forwardGpu(const Tensor& input, const Pass& pass) {
  COHORT_THROW(InvalidArgument) << name() << " got a tensor on " << input.device().str() << " in a build without CUDA";
}

const Tensor& BatchNorm2d::backwardGpu(const Tensor& gradOutput, const Pass& pass) {
  return forwardGpu(gradOutput, pass);
}

#endif

}  // namespace cohort::nn
