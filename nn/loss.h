// Losses: forward() returns the mean loss over the batch and keeps what backward() needs;
// backward() returns d(loss)/d(output) in a buffer the loss owns.
//   SoftmaxCrossEntropy: logits [batch, classes], targets [batch] holding class indices as floats.
//     Fused: the gradient (softmax − one-hot)/batch is computed in the same pass as the loss.
//     correct() counts rows whose argmax equals the target (first maximum wins).
//   MeanSquaredError: output and targets of the same element count; mean over all elements.
// Bad targets (class out of range, shape mismatch) throw InvalidArgument naming the row.
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>

#include "runtime/tensor.h"

namespace cohort::nn {

using runtime::Tensor;

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  virtual float forward(const Tensor& output, const Tensor& targets) = 0;
  virtual const Tensor& backward() = 0;
  // Correct predictions in the last forward (classification losses; 0 otherwise).
  virtual int64_t correct() const { return 0; }
};

class SoftmaxCrossEntropy final : public Loss {
 public:
  std::string name() const override { return "SoftmaxCrossEntropy"; }
  float forward(const Tensor& logits, const Tensor& targets) override;
  const Tensor& backward() override { return grad_; }
  int64_t correct() const override { return correct_; }

 private:
  Tensor grad_;
  int64_t correct_ = 0;
};

class MeanSquaredError final : public Loss {
 public:
  std::string name() const override { return "MeanSquaredError"; }
  float forward(const Tensor& output, const Tensor& targets) override;
  const Tensor& backward() override { return grad_; }

 private:
  Tensor grad_;
};

enum class LossKind { kCrossEntropy, kMse };
std::unique_ptr<Loss> makeLoss(LossKind kind);

}  // namespace cohort::nn
