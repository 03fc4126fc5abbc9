// Embedding: a learnable lookup table (torch.nn.Embedding without padding_idx or max_norm). The
// parameter `weight` is [vocab, dim]; the input holds token ids of any shape [...] (Cohort tensors
// are float32, so an id is a whole number 0..vocab-1 stored as a float) and the output is
// [..., dim] with out[i, :] = weight[id_i, :]. GPT-2's initialisation: normal(0, std), std 0.02 by
// default.
//
// Backward adds dout[i, :] into dweight[id_i, :] for every position i, in increasing i, on the CPU
// and on the GPU alike, so a repeated id's gradient has the same bits on every run and on both
// devices (no floating-point atomics). Rows of ids that do not occur get 0 when the gradient is
// overwritten and are left as they were with Pass::accumulateGrads, exactly as Linear's gradients.
// Ids are not differentiable (the output is piecewise constant in them): with Pass::needInputGrad
// backward returns zeros shaped like the ids, without it an undefined Tensor. Nothing before an
// Embedding can learn through it, so it belongs first in a network (a layer before it would feed
// it non-integer "ids" anyway, which forward refuses).
//
// Bad ids (not a whole number in [0, vocab), NaN included):
//   - CPU: forward throws InvalidArgument naming the first bad position (flat index into the ids)
//     and its value.
//   - GPU: forward cannot throw without waiting for the device. A bad id's output row is NaN (so the
//     loss turns non-finite and the training loop refuses the step), backward skips the position,
//     and a device counter records how many were bad. checkIds(pass) waits for the stream and
//     throws the CPU's InvalidArgument (it copies the ids to the host only when the count is not
//     zero); call it where a synchronisation is acceptable (tests, evaluation, the first step).
//
// GPU cost (runtime/cuda/embedding_kernels.h): forward is one gather, n·dim reads and writes.
// Backward sorts the positions by id, stably, with integer counts and scans (O(n + vocab) integer
// work, scratch from the GPU context's allocator, kept between steps), then one thread per column
// of each row adds that row's positions in increasing order: it reads dout once and writes the
// vocab·dim gradient once (accumulating: reads and writes only the rows of ids that occur). Positions sharing
// one id are summed one after another: a batch dominated by one id is as serial on the GPU as on
// the CPU.
//
// Keeps a handle to its input for backward (no copy). Thread safety: as Module.
//
//   Embedding wte({.vocab = 50257, .dim = 768});
//   wte.registerParams(params, "wte.");   // "wte.weight", [50257, 768]
//   const Tensor& x = wte.forward(tokenIds /* [batch, seq] */, pass);   // [batch, seq, 768]
#pragma once

#include <cstdint>
#include <vector>

#include "nn/init_plan.h"
#include "nn/module.h"

namespace cohort::nn {

struct EmbeddingOptions {
  int64_t vocab = 0;      // number of rows (ids 0..vocab-1)
  int64_t dim = 0;        // length of each row
  float initStd = 0.02f;  // weight ~ normal(0, initStd) (GPT-2); must be >= 0
};

class Embedding final : public Module, public PlannedInit {
 public:
  explicit Embedding(const EmbeddingOptions& options);

  std::string name() const override;
  void registerParams(ParamBuffer& params, const std::string& prefix) override;
  void resetParams(runtime::Rng& rng) override;  // resetByPlan
  void planInit(InitPlan& plan) const override;    // normal(0, initStd), scaled in double
  Shape outputShape(const Shape& input) const override;
  const Tensor& forward(const Tensor& input, const Pass& pass) override;
  const Tensor& backward(const Tensor& gradOutput, const Pass& pass) override;

  // Throws InvalidArgument for the first bad id of the last forward's input. On the CPU forward
  // already did, so this does nothing; on the GPU it synchronises pass.gpu's stream first.
  void checkIds(const Pass& pass) const;
  void checkInputs(const Pass& pass) const override { checkIds(pass); }

  const Tensor& weight() const { return weight_; }
  const Tensor& weightGrad() const { return weightGrad_; }

 private:
  // The row of the id at flat position `position`; throws InvalidArgument for a bad one.
  int64_t rowOf(float id, int64_t position, const Shape& shape) const;

  EmbeddingOptions options_;
  Tensor weight_, weightGrad_;
  size_t weightEntry_ = InitTarget::kNoEntry;  // in the last registration
  Tensor input_;               // last forward's ids
  std::vector<int64_t> rows_;  // CPU: their rows, checked once in forward
  Tensor badIds_;              // GPU: one device counter (as uint32) of the last forward's bad ids
  Tensor backwardScratch_;     // GPU: embeddingBackward's scratch words (as uint32)
  Tensor output_;
  Tensor gradInput_;
};

}  // namespace cohort::nn
