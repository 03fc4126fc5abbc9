#include "nn/reshape.h"

#include "runtime/error.h"

namespace cohort::nn {

namespace {

// Elements per sample: the product of every dimension but the first.
int64_t perSample(const Shape& s) {
  int64_t n = 1;
  for (int i = 1; i < s.rank(); ++i) n *= s[i];
  return n;
}

}  // namespace

Shape Flatten::outputShape(const Shape& input) const {
  if (input.rank() < 1) COHORT_THROW(InvalidArgument) << "Flatten needs a batch dimension, got " << input.str();
  return Shape{input[0], perSample(input)};
}

const Tensor& Flatten::forward(const Tensor& input, const Pass& pass) {
  inputShape_ = input.shape();
  output_ = input.reshape(outputShape(inputShape_));
  return output_;
}

const Tensor& Flatten::backward(const Tensor& gradOutput, const Pass& pass) {
  gradInput_ = pass.needInputGrad ? gradOutput.reshape(inputShape_) : Tensor();
  return gradInput_;
}

Unflatten::Unflatten(const Shape& sampleShape) : sampleShape_(sampleShape) {
  bool ok = sampleShape.rank() >= 1 && sampleShape.rank() < runtime::kMaxDims;
  for (int i = 0; i < sampleShape.rank(); ++i) ok = ok && sampleShape[i] > 0;
  if (!ok) COHORT_THROW(InvalidArgument) << "Unflatten needs 1 to 5 positive sizes, got " << sampleShape.str();
}

Shape Unflatten::outputShape(const Shape& input) const {
  if (input.rank() < 2 || perSample(input) != sampleShape_.numel()) {
    COHORT_THROW(InvalidArgument) << name() << " needs [N, ...] with " << sampleShape_.numel()
                                  << " elements per sample, got " << input.str();
  }
  Shape s{input[0]};
  for (int i = 0; i < sampleShape_.rank(); ++i) s.push(sampleShape_[i]);
  return s;
}

const Tensor& Unflatten::forward(const Tensor& input, const Pass& pass) {
  inputShape_ = input.shape();
  output_ = input.reshape(outputShape(inputShape_));
  return output_;
}

const Tensor& Unflatten::backward(const Tensor& gradOutput, const Pass& pass) {
  gradInput_ = pass.needInputGrad ? gradOutput.reshape(inputShape_) : Tensor();
  return gradInput_;
}

}  // namespace cohort::nn
