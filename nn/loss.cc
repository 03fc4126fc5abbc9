#include "nn/loss.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "nn/gpu_dispatch.h"
#include "runtime/cpu/blas.h"
#include "runtime/cpu/vector_math.h"
#include "runtime/error.h"

namespace cohort::nn {

namespace {

// Logits [batch, classes] with targets [batch], or [batch, positions..., classes] with targets
// [batch, positions...] (a sequence: a prediction per position).
void checkCrossEntropyShapes(const Tensor& logits, const Tensor& targets, const char* where) {
  bool ok = logits.rank() >= 2 && targets.rank() == logits.rank() - 1;
  for (int d = 0; ok && d < targets.rank(); ++d) ok = targets.dim(d) == logits.dim(d);
  // Class targets of a batch may also come as [batch, 1] (a CSV's target column).
  if (!ok && logits.rank() == 2) ok = targets.numel() == logits.dim(0);
  if (!ok) {
    COHORT_THROW(InvalidArgument) << "cross-entropy" << where
                                  << " needs logits [batch, classes] and targets [batch] (or logits [batch, T, classes] "
                                     "and targets [batch, T]), got "
                                  << logits.shape().str() << " and " << targets.shape().str();
  }
}

}  // namespace

float SoftmaxCrossEntropy::forward(const Tensor& logits, const Tensor& targets) {
  checkCrossEntropyShapes(logits, targets, "");
  const int64_t cols = logits.dim(logits.rank() - 1), rows = logits.numel() / std::max<int64_t>(cols, 1);
  positions_ = logits.dim(0) ? rows / logits.dim(0) : 1;
  if (gradIsLogits_) grad_ = Tensor();  // a GPU call's logits are the model's: never written again
  gradIsLogits_ = false;
  runtime::ensureShape(grad_, logits.shape());
  const float invRows = rows ? 1.0f / static_cast<float>(rows) : 0.0f;
  // Each chunk of rows (runtime::cpu::parallelRange) sums its own losses, in row order; the chunks'
  // sums are added in chunk order (one chunk with one thread: the rows' sum itself).
  const int64_t grain = runtime::cpu::rowGrain(cols);
  std::vector<double>& totals = chunkLoss_;
  std::vector<int64_t>& corrects = chunkCorrect_;
  totals.assign(static_cast<size_t>(runtime::cpu::parallelChunks(rows, grain)), 0.0);
  corrects.assign(totals.size(), 0);
  runtime::cpu::parallelRange(rows, grain, [&](int64_t first, int64_t last, int chunk) {
    double total = 0.0;
    int64_t correct = 0;
    for (int64_t r = first; r < last; ++r) {
      const float* x = logits.data() + r * cols;
      float* g = grad_.data() + r * cols;
      const float t = targets.data()[r];
      const int64_t label = static_cast<int64_t>(t);
      if (!(t >= 0.0f) || static_cast<float>(label) != t || label >= cols) {
        COHORT_THROW(InvalidArgument) << "target " << t << " in row " << r << " is not a class index below " << cols;
      }
      int64_t argmax = 0;
      for (int64_t c = 1; c < cols; ++c) argmax = x[c] > x[argmax] ? c : argmax;
      const float mx = x[argmax];
      float sum = 0.0f;
      for (int64_t c = 0; c < cols; ++c) g[c] = runtime::cpu::expVectorised(x[c] - mx);  // vectorised
      for (int64_t c = 0; c < cols; ++c) sum += g[c];
      total += static_cast<double>(std::log(sum) + mx - x[label]);
      const float scale = invRows / sum;
      for (int64_t c = 0; c < cols; ++c) g[c] *= scale;
      g[label] -= invRows;
      correct += argmax == label;
    }
    totals[static_cast<size_t>(chunk)] = total;
    corrects[static_cast<size_t>(chunk)] = correct;
  });
  double total = 0.0;
  correct_ = 0;
  for (size_t k = 0; k < totals.size(); ++k) {
    total += totals[k];
    correct_ += corrects[k];
  }
  return rows ? static_cast<float>(total / static_cast<double>(rows)) : 0.0f;
}

float MeanSquaredError::forward(const Tensor& output, const Tensor& targets) {
  if (output.numel() != targets.numel()) {
    COHORT_THROW(InvalidArgument) << "mse needs outputs and targets of the same size, got " << output.shape().str()
                                  << " and " << targets.shape().str();
  }
  runtime::ensureShape(grad_, output.shape());
  const int64_t n = output.numel();
  const float scale = n ? 2.0f / static_cast<float>(n) : 0.0f;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    float d = output.data()[i] - targets.data()[i];
    total += static_cast<double>(d) * d;
    grad_.data()[i] = scale * d;
  }
  return n ? static_cast<float>(total / static_cast<double>(n)) : 0.0f;
}

void Loss::forwardGpu(const Tensor& output, const Tensor& targets, runtime::cuda::GpuContext& gpu) {
  COHORT_THROW(InvalidArgument) << name() << " has no GPU implementation; give it CPU tensors (forward())";
}

#ifdef COHORT_HAVE_CUDA
float* Loss::gpuSums(runtime::cuda::GpuContext& gpu) {
  if (!gpuSums_.defined() || gpuSums_.device() != gpu.device()) {
    gpuSums_ = Tensor::empty(Shape{3}, gpu.allocator());
    runtime::cuda::fill({gpuSums_.data(), 3}, 0.0f, gpu.stream());
  }
  return gpuSums_.data();
}

LossSums Loss::takeGpuSums(runtime::cuda::GpuContext& gpu) {
  float host[3] = {0, 0, 0};
  float* sums = gpuSums(gpu);
  runtime::cuda::copyToHost(host, sums, sizeof(host), gpu.stream());
  runtime::cuda::fill({sums, 3}, 0.0f, gpu.stream());
  gpu.stream().synchronize();
  if (host[2] != 0.0f) {
    COHORT_THROW(InvalidArgument) << name() << ": " << static_cast<int64_t>(host[2])
                                  << " targets were not class indices below the number of outputs";
  }
  // The kernels add every prediction's loss: a sample's is the mean of its positions'.
  return {static_cast<double>(host[0]) / static_cast<double>(positions()), static_cast<int64_t>(host[1])};
}

void SoftmaxCrossEntropy::forwardGpu(const Tensor& logits, const Tensor& targets, runtime::cuda::GpuContext& gpu) {
  if (!onGpu(targets)) {
    COHORT_THROW(InvalidArgument) << "cross-entropy on a GPU needs its targets on " << gpu.device().str() << ", got them on "
                                  << targets.device().str();
  }
  checkCrossEntropyShapes(logits, targets, " on a GPU");
  const int64_t cols = logits.dim(logits.rank() - 1), rows = logits.numel() / std::max<int64_t>(cols, 1);
  positions_ = logits.dim(0) ? rows / logits.dim(0) : 1;
  if (gradIsLogits_) grad_ = Tensor();  // the last call's logits are the model's: never written again
  gradIsLogits_ = gradInPlace_;
  if (gradInPlace_) {
    grad_ = logits;  // shares the storage: the kernel writes the gradient over the logits
  } else {
    runtime::ensureShape(grad_, logits.shape(), gpu.allocator(), gradType_);
  }
  runtime::ensureShape(rowScratch_, Shape{runtime::cuda::crossEntropyScratchFloats(rows)}, gpu.allocator());
  runtime::cuda::softmaxCrossEntropy({.logits = logits.raw(),
                                      .targets = targets.data(),
                                      .grad = grad_.raw(),
                                      .sums = gpuSums(gpu),
                                      .scratch = rowScratch_.data(),
                                      .logitsType = logits.dtype(),
                                      .gradType = grad_.dtype()},
                                     rows, cols, gpu.stream());
}

void MeanSquaredError::forwardGpu(const Tensor& output, const Tensor& targets, runtime::cuda::GpuContext& gpu) {
  if (output.numel() != targets.numel() || !onGpu(targets)) {
    COHORT_THROW(InvalidArgument) << "mse on a GPU needs outputs and targets of the same size on "
                                  << gpu.device().str() << ", got " << output.shape().str() << " and "
                                  << targets.shape().str() << " on " << targets.device().str();
  }
  runtime::ensureShape(grad_, output.shape(), gpu.allocator());
  // Summed per sample like the CPU loop (the batch mean times its rows).
  const int64_t n = output.numel();
  const float lossScale = n ? static_cast<float>(output.rank() ? output.dim(0) : 1) / static_cast<float>(n) : 0.0f;
  runtime::ensureShape(scratch_, Shape{static_cast<int64_t>(2 * runtime::cuda::kMseScratchDoubles)}, gpu.allocator());
  runtime::cuda::meanSquaredError({.out = output.data(),
                                   .targets = targets.data(),
                                   .grad = grad_.data(),
                                   .lossSum = gpuSums(gpu),
                                   .scratch = reinterpret_cast<double*>(scratch_.data())},
                                  n, lossScale, gpu.stream());
}
#else
// The same declarations as a CUDA build, so the class layout does not depend on the build.
namespace {
[[noreturn]] void needsCuda(const std::string& what) {
  COHORT_THROW(InvalidArgument) << what << " needs a build with CUDA; this one has none";
}
}  // namespace

float* Loss::gpuSums(runtime::cuda::GpuContext&) { needsCuda(name() + "::gpuSums"); }

LossSums Loss::takeGpuSums(runtime::cuda::GpuContext&) { needsCuda(name() + "::takeGpuSums"); }

void SoftmaxCrossEntropy::forwardGpu(const Tensor&, const Tensor&, runtime::cuda::GpuContext&) {
  needsCuda(name() + "::forwardGpu");
}

void MeanSquaredError::forwardGpu(const Tensor&, const Tensor&, runtime::cuda::GpuContext&) {
  needsCuda(name() + "::forwardGpu");
}
#endif

std::unique_ptr<Loss> makeLoss(LossKind kind) {
  if (kind == LossKind::kMse) return std::make_unique<MeanSquaredError>();
  return std::make_unique<SoftmaxCrossEntropy>();
}

}  // namespace cohort::nn
