// Linear: y = x · Wᵀ + b, with W of shape [out, in] and b of shape [out] (PyTorch's layout and
// default initialisation: both uniform in ±1/sqrt(in)). Input [batch, in] (or any shape whose last
// dimension is `in`, flattened over the leading ones). CPU through OpenBLAS GEMM; on a GPU cuBLAS, with
// the bias gradient from runtime/cuda/reduce_kernels.h (repeatable bit for bit).
// Keeps a handle to its input for backward (no copy). Thread safety: as Module.
#pragma once

#include "nn/module.h"

namespace cohort::nn {

struct LinearOptions {
  int64_t in = 0;
  int64_t out = 0;
  bool bias = true;
};

class Linear final : public Module {
 public:
  explicit Linear(const LinearOptions& options);
  Linear(int64_t in, int64_t out) : Linear(LinearOptions{in, out, true}) {}

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& weightGrad() const { return weightGrad_; }
  const Tensor& biasGrad() const { return biasGrad_; }

 private:
  LinearOptions options_;
  Tensor weight_, bias_, weightGrad_, biasGrad_;
  Tensor input_;       // last forward's input, viewed as [rows, in]
  Shape inputShape_;   // its shape as given
  Tensor output_;
  Tensor gradInput_;
  Tensor biasScratch_;  // GPU only: the per-chunk partial sums of the bias gradient
};

}  // namespace cohort::nn
