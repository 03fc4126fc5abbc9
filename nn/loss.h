// Losses: forward() returns the mean loss over the batch and keeps what backward() needs;
// backward() returns d(loss)/d(output) in a buffer the loss owns.
//   SoftmaxCrossEntropy: logits [batch, classes], targets [batch] holding class indices as floats;
//     or a sequence, logits [batch, T, classes] and targets [batch, T] (a language model: one
//     prediction per position; the loss is the mean over every position of every sample, i.e. per
//     token). Fused: the gradient (softmax − one-hot)/predictions is computed in the same pass as
//     the loss. correct() counts predictions whose argmax equals the target (first maximum wins);
//     positions() is T (1 without a sequence), so accuracy is correct / (samples · positions).
//   MeanSquaredError: output and targets of the same element count; mean over all elements.
// Bad targets (class out of range, shape mismatch) throw InvalidArgument naming the row.
// GPU: forward() takes CPU tensors only. On a GPU, forwardGpu() enqueues the fused kernel
// (gradient for backward() plus device-side sums of the loss and of correct predictions) and
// returns without waiting; takeGpuSums() waits for the stream and returns and resets the sums, so a
// training loop reads them once per epoch or checkpoint rather than waiting every step. The sums are
// float32 on the device: exact for counts up to 2^24 per read; the cross-entropy adds them in an
// order fixed by the shape (no atomics), so the same logits give the same bits on every run. The class layout is the same in
// every build; in a build without CUDA, forwardGpu() and takeGpuSums() throw InvalidArgument. A
// user's own loss need not implement forwardGpu(): the default throws InvalidArgument (CPU only).
// Thread safety: one thread at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/tensor.h"

namespace cohort::runtime::cuda {
class GpuContext;
}

namespace cohort::nn {

using runtime::Tensor;

// What a loop accumulated on the device since the last read.
struct LossSums {
  double loss = 0;      // summed over samples (a batch's mean times its size; a sample's: its positions' mean)
  int64_t correct = 0;  // correct predictions (classification losses; 0 otherwise): positions() per sample
};

class Loss {
 public:
  virtual ~Loss() = default;
  virtual std::string name() const = 0;
  virtual float forward(const Tensor& output, const Tensor& targets) = 0;
  virtual const Tensor& backward() = 0;
  // Correct predictions in the last forward (classification losses; 0 otherwise).
  virtual int64_t correct() const { return 0; }
  // Predictions per sample in the last forward (a sequence's length; 1 otherwise): accuracy is
  // correct() / (samples · positions()).
  virtual int64_t positions() const { return 1; }
  // Enqueues the loss on `gpu`'s stream (tensors on its device); the default throws
  // InvalidArgument naming the loss as CPU-only.
  virtual void forwardGpu(const Tensor& output, const Tensor& targets, runtime::cuda::GpuContext& gpu);
  // Throws InvalidArgument when a target since the last read was not a class index.
  LossSums takeGpuSums(runtime::cuda::GpuContext& gpu);
  // The type forwardGpu's gradient may be written in: bf16 in a bf16 pass (a training loop sets it
  // from Pass::precision), which the model's bf16 layers read as it is, saving an fp32 copy of the
  // size of the output (1.6 GB for GPT-2's logits at batch 8). A loss that writes fp32 only ignores
  // it (the model takes either); the CPU's forward() always writes fp32.
  virtual void setGradType(runtime::DType type) { (void)type; }
  // Whether forwardGpu reads a bf16 output as it is (widened as it reads, fp32 arithmetic), so that
  // the model hands it a bf16 pass's bf16 output without converting it (Model::forward's
  // keepBf16): for GPT-2's logits at batch 8, 0.8 GB less than an fp32 copy. The default: no.
  virtual bool readsBf16() const { return false; }
  // Whether forwardGpu may write the gradient over the output it is given (no buffer of the
  // output's size: 0.8 GB less at GPT-2's logits in bf16, batch 8), so that backward() returns the
  // output's own storage. Only for a caller that reads the output no more once forwardGpu has
  // returned (the trainer sets it when the model's top module says its backward does not read its
  // output: Module::backwardReadsOutput); sums, accuracy and the loss are taken before it is
  // overwritten. A loss that cannot ignores it; the CPU's forward() never writes in place.
  virtual void setGradInPlace(bool inPlace) { (void)inPlace; }

 protected:
  // [loss sum, correct, bad targets] on the device, zeroed on first use and by every read.
  float* gpuSums(runtime::cuda::GpuContext& gpu);

 private:
  Tensor gpuSums_;  // undefined until the first GPU pass (and always in a build without CUDA)
};

class SoftmaxCrossEntropy final : public Loss {
 public:
  std::string name() const override { return "SoftmaxCrossEntropy"; }
  float forward(const Tensor& logits, const Tensor& targets) override;
  const Tensor& backward() override { return grad_; }
  int64_t correct() const override { return correct_; }
  int64_t positions() const override { return positions_; }
  void forwardGpu(const Tensor& logits, const Tensor& targets, runtime::cuda::GpuContext& gpu) override;
  // bf16: forwardGpu writes (softmax − one-hot)/predictions rounded once to bf16.
  void setGradType(runtime::DType type) override { gradType_ = type; }
  // Yes: bf16 logits give the loss and gradient of their fp32 values (the argmax of tied rounded
  // logits is the first, as in fp32).
  bool readsBf16() const override { return true; }
  // Yes: the gradient takes the logits' type there, whatever setGradType said.
  void setGradInPlace(bool inPlace) override { gradInPlace_ = inPlace; }

 private:
  Tensor grad_;  // the gradient; after an in-place forwardGpu, the logits' tensor itself
  Tensor rowScratch_;  // GPU: the rows' losses until the kernel adds them (crossEntropyScratchFloats)
  runtime::DType gradType_ = runtime::DType::kF32;
  bool gradInPlace_ = false;
  bool gradIsLogits_ = false;  // grad_ aliases a caller's logits: never write it out of place
  int64_t correct_ = 0;
  int64_t positions_ = 1;
  std::vector<double> chunkLoss_;      // per chunk of rows (runtime::cpu::parallelRange), kept to
  std::vector<int64_t> chunkCorrect_;  // allocate nothing in steady state
};

class MeanSquaredError final : public Loss {
 public:
  std::string name() const override { return "MeanSquaredError"; }
  float forward(const Tensor& output, const Tensor& targets) override;
  const Tensor& backward() override { return grad_; }
  void forwardGpu(const Tensor& output, const Tensor& targets, runtime::cuda::GpuContext& gpu) override;

 private:
  Tensor grad_;
  Tensor scratch_;  // GPU: the blocks' sums of squares (kMseScratchDoubles doubles)
};

enum class LossKind { kCrossEntropy, kMse };
std::unique_ptr<Loss> makeLoss(LossKind kind);

}  // namespace cohort::nn
